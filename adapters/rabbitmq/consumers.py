"""Consumers: the work of subscription queues on their consuming connections.

Starting and stopping a subscription's consumer (a channel with ``basic.qos`` and
``basic.consume``, restarted when the broker closes it), pulling with ``basic.get`` (as a
coroutine, or chained on the loop thread without one: :meth:`Consumers.pull_direct`),
purging, depths (one queue, or many at once over a few channels) and deleting a queue.

A take (``basic.get`` with auto-ack: GetMessages on a pull point and on the subscriptions
feeding it) needs no state on its channel, so every subscription of a connection takes
through a few channels the connection shares (``_TAKE_CHANNELS``): 10,000 pull points need
no channel each.  A pull that is acknowledged later keeps a channel of the
subscription's own (``RabbitMQSubscription.puller``), whose delivery tags it acks on.

Every blocking call runs on the connection's I/O thread through :meth:`Consumers.run`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from wsnmom.core.adapter import AdapterUnavailable, Received

from . import errors
from ._completion import Completion
from ._link import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    Channel,
    ChannelError,
    Declarer,
    FrameReader,
    GetReply,
    Link,
    LinkBusy,
)
from .declarations import Declarations
from .deliveries import Deliveries

if TYPE_CHECKING:
    from .subscription import RabbitMQSubscription

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: channels one bulk depth query uses at once per connection
_DEPTH_CHANNELS = 8
#: channels per connection that every subscription's takes share
_TAKE_CHANNELS = 4


class Consumers:
    """Consumes, pulls, counts and deletes subscription queues; ``primary`` is the first
    consuming connection (used when a call names none)."""

    def __init__(
        self,
        primary: Link,
        declarations: Declarations,
        deliveries: Deliveries,
        operation_timeout: float,
    ) -> None:
        self.primary = primary
        self.declarations = declarations
        self.deliveries = deliveries
        self.timeout = operation_timeout
        #: the shared take channels of each connection (by ``id`` of its link)
        self._takers: dict[int, list[Channel]] = {}
        self._taker_locks: dict[int, asyncio.Lock] = {}
        self._turn = 0

    def taker(self, link: Link) -> Channel | None:
        """One of ``link``'s shared take channels that is open (in turn), or None."""
        channels = [c for c in self._takers.get(id(link), ()) if c.is_open and c.fast_get]
        if not channels:
            return None
        self._turn += 1
        return channels[self._turn % len(channels)]

    async def open_takers(self, link: Link) -> None:
        """Open ``link``'s shared take channels (those closed since too); loop thread."""
        lock = self._taker_locks.setdefault(id(link), asyncio.Lock())
        async with lock:
            await link.ready(self.timeout)
            channels = [c for c in self._takers.get(id(link), ()) if c.is_open]
            while len(channels) < _TAKE_CHANNELS:
                ch = await link.open_channel()
                ch.start_fast_get()
                channels.append(ch)
            self._takers[id(link)] = channels

    def run(
        self, coro: Coroutine[Any, Any, Any], extra: float = 0.0, link: Link | None = None
    ) -> Any:
        """Run a coroutine on a consuming link (default: the first one), failures turned
        into adapter errors (:func:`errors.run`)."""
        return errors.run(link or self.primary, coro, self.timeout + extra)

    async def start(self, sub: RabbitMQSubscription, ready: bool = True) -> None:
        """Consume ``sub``'s queue on a channel of its own (unless it already does)."""
        link = sub.link
        if ready:
            await link.ready(self.timeout)
        if (sub.consumer is not None and sub.consumer.is_open) or not sub.consuming:
            return
        if not sub.declared:  # followed without declaring it (``Declarations.deferred``)
            if await self._declare_consuming(sub):
                return
            await self.declarations.declare_subscription(sub)
        try:
            await self._open_consumer(sub)
        except ChannelError as exc:
            if exc.code != NOT_FOUND or not sub.consuming:
                raise
            # the queue is gone although this process declared it (an operator deleted
            # it; ``Declarations.in_place`` skipped the declaration): declare, consume
            log.warning("queue %s was deleted: declaring it again (%s)", sub.queue, exc)
            await self.declarations.declare_subscription(sub)
            await self._open_consumer(sub)

    async def _declare_consuming(self, sub: RabbitMQSubscription) -> bool:
        """Declare ``sub`` in the write of its consume (``Declarations.with_consume``).
        False when it is to be declared on its own first: that way cannot declare it, or
        its queue exists with other arguments (the consume then was not made)."""
        plan = await self.declarations.with_consume(sub)
        if plan is None:
            return False
        declared, methods = plan
        # it may be declared from the write on: forgetting it (another instance destroyed
        # it) must delete the queue, which this opening may have made again
        sub.declared = True
        try:
            await self._open_consumer(sub, methods)
        except ChannelError as exc:
            if exc.code != PRECONDITION_FAILED or not sub.consuming:
                raise
            log.info("queue %s: declared apart from its consume (%s)", sub.queue, exc)
            return False
        if sub.consumer is not None:
            self.declarations.consumed(sub, declared)
        return True

    async def _open_consumer(
        self, sub: RabbitMQSubscription, before: Sequence[tuple[Any, Any]] = ()
    ) -> None:
        """A channel for ``sub``'s consumer and the consume on it (``before``: methods
        written ahead of it, :meth:`Channel.consume`), written right behind the channel's
        ``channel.open`` (:meth:`Link.begin_channel`): one round trip in all."""
        link = sub.link
        ch = link.begin_channel()
        try:
            await self._consume(sub, ch, before)
        except BaseException:
            # abandoned half-way (the caller timed out and cancelled it, or the broker
            # refused): a consumer left on a channel nobody holds would stay the queue's
            # single active consumer, its deliveries going to a stopped channel
            if ch.writable and sub.consumer is not ch:
                link.loop.create_task(ch.close())
            raise

    async def _consume(
        self, sub: RabbitMQSubscription, ch: Channel, before: Sequence[tuple[Any, Any]] = ()
    ) -> None:
        """:meth:`start` on the channel ``ch`` opened for it."""
        link = sub.link
        generation = link.generation
        dispatch = self.deliveries.dispatch

        def on_close(closed: Channel, reason: BaseException) -> None:
            # Closed by the broker while the connection stays up (queue deleted
            # elsewhere, an ack for an unknown tag): consume again shortly.
            if sub.consumer is closed:
                sub.consumer = None
            conn = link.connection
            if (
                sub.consuming
                and not sub.deleted
                and conn is not None
                and conn.is_open
                and link.generation == generation
            ):
                log.warning("consumer channel of %s closed (%s); restarting", sub.queue, reason)
                link.loop.call_later(0.5, lambda: link.loop.create_task(self.restart(sub)))

        ch.add_close_listener(on_close)
        ch.reject_unreadable = True  # manual acks: one it cannot read twice is rejected
        # deliveries are read straight from the wire, and pika knows no consumer on the
        # channel: stopping closes it without cancelling first (``Channel.consume``)
        ch.read(FrameReader(on_deliver=lambda m, p, b: dispatch(sub, ch, m, p, b)))
        try:
            await ch.consume(sub.queue, f"wsnmom.{uuid.uuid4().hex}", sub.prefetch, before)
        except ChannelError as exc:
            if exc.code != 0 or not sub.consuming:
                raise
            # the connection went down under the consume: RabbitMQ closes the whole
            # connection (INTERNAL_ERROR) when a quorum queue does not answer a consume
            # in time, as on a loaded broker; once it is back the link resumes every
            # subscription still consuming (``resume``), this one too
            log.warning("consuming %s: connection lost (%s); resumed on reconnect", sub.queue, exc)
            return
        sub.consumer = ch

    async def restart(self, sub: RabbitMQSubscription) -> None:
        """Declare ``sub`` again and consume it (its channel was closed by the broker)."""
        try:
            await self.declarations.declare_subscription(sub)
            await self.start(sub, ready=False)
        except Exception as exc:
            log.warning("cannot restart consumer of %s: %s", sub.queue, exc)

    async def resume(self, sub: RabbitMQSubscription) -> None:
        """``sub``'s connection came back: declare it again and resume its consumer."""
        sub.consumer = None
        sub.puller = None
        try:
            await self.declarations.declare_subscription(sub)
            if sub.consuming:
                await self.start(sub, ready=False)
        except ChannelError as exc:
            # one broken subscription must not keep the others from resuming
            log.error("cannot restore subscription queue %s: %s", sub.queue, exc)

    async def stop(self, sub: RabbitMQSubscription) -> None:
        """Stop consuming ``sub``'s queue: close its channel, without ``basic.cancel``
        first.  What was delivered and not settled goes back to the head of the queue, in
        order, before single-active-consumer activates another instance's consumer, which
        gets those first (a cancel first let that consumer take newer ones before them);
        acks given before the stop are written first."""
        ch = sub.consumer
        sub.consumer = None
        if ch is not None:
            await ch.close()

    async def pull(
        self, sub: RabbitMQSubscription, max_messages: int, timeout: float
    ) -> list[Received]:
        """Up to ``max_messages`` by ``basic.get``, waiting up to ``timeout`` for one."""
        link = sub.link
        await link.ready(self.timeout)
        if sub.puller is None or not sub.puller.is_open:
            sub.puller = await link.open_channel()
            sub.puller.reject_unreadable = True  # manual acks
            sub.puller.start_fast_get()
        ch = sub.puller
        deadline = time.monotonic() + max(0.0, timeout)
        out: list[Received] = []
        while len(out) < max_messages:
            got = await ch.get(sub.queue)
            if got is None:
                if out or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            method, properties, body = got
            delivery = self.deliveries.delivery(ch, method, properties, body)
            if delivery is not None:
                out.append(delivery)
            if out and not method.message_count:
                break  # the queue had nothing behind it: spare the basic.get-empty trip
        return out

    def pull_direct(
        self,
        sub: RabbitMQSubscription,
        max_messages: int,
        *,
        no_ack: bool = False,
        shared: bool = False,
    ) -> list[Received] | None:
        """``pull`` without waiting (GetMessages) and without a coroutine: the gets are
        chained by their replies on the loop thread; the caller waits for the last.  None
        when the channel is not ready (then :meth:`pull` runs, or :meth:`open_takers`).
        ``shared``: through one of the connection's shared take channels (else the
        subscription's own); ``no_ack``: the messages are removed on delivery (``take``),
        else each is acknowledged (or requeued) on the channel it came from."""
        link = sub.link
        ch = self.taker(link) if shared else sub.puller
        if not link.is_up or ch is None or not ch.fast_get or not ch.is_open:
            return None
        queue = sub.queue
        out: list[Received] = []
        done = Completion()
        delivery_of = self.deliveries.delivery

        def reply(result: GetReply) -> None:
            if done.done():
                return
            if isinstance(result, BaseException):
                done.set_exception(result)
                return
            if result is not None:
                method, properties, body = result
                delivery = delivery_of(ch, method, properties, body, no_ack=no_ack)
                if delivery is not None:
                    out.append(delivery)
                # stop when full, or when the queue had nothing behind this message
                if len(out) < max_messages and (method.message_count or not out):
                    ch.request_get(queue, reply, no_ack=no_ack)
                    return
            if out and not no_ack:
                link.expect_settles()  # their acks come after the caller's write
            done.set_result(None)

        def first() -> None:
            link.flush_settles()  # the loop is awake: earlier answers' acks go now
            ch.request_get(queue, reply, no_ack=no_ack)

        try:
            link.loop.call_soon_threadsafe(first)
        except RuntimeError:
            return None
        timeout = self.timeout
        link.backlog.begin()
        completed = False
        try:
            done.result(timeout)
            completed = True
        except TimeoutError:
            # what was taken meanwhile goes back to the queue with the channel
            link.loop.call_soon_threadsafe(lambda: link.loop.create_task(ch.close()))
            error = link.timed_out(timeout)
            if isinstance(error, LinkBusy):
                raise errors.busy(error) from None
            raise AdapterUnavailable(str(error)) from None
        except ChannelError as exc:
            raise AdapterUnavailable(f"RabbitMQ refused: {exc}") from exc
        finally:
            link.backlog.end(completed=completed)
        return out

    async def depths(self, link: Link, queues: Sequence[str]) -> list[int | None]:
        """Passive declares of ``queues`` on up to ``_DEPTH_CHANNELS`` channels at once;
        None for a queue that is gone (its channel is replaced)."""
        await link.ready(self.timeout)
        results: list[int | None] = [None] * len(queues)
        pending = iter(range(len(queues)))

        async def worker() -> None:
            channel: Channel | None = None
            try:
                for i in pending:
                    if channel is None or not channel.is_open:
                        channel = await link.open_channel()
                    try:
                        frame = await channel.call("queue_declare", queues[i], passive=True)
                        results[i] = int(frame.method.message_count)
                    except ChannelError:
                        results[i] = None  # deleted meanwhile: the broker closed the channel
            finally:
                if channel is not None and channel.is_open:
                    await channel.close()

        width = min(_DEPTH_CHANNELS, len(queues))
        await asyncio.gather(*(worker() for _ in range(width)))
        return results

    async def purge(self, queue: str, link: Link) -> int:
        """``queue.purge``: how many ready messages the broker dropped."""
        await link.ready(self.timeout)
        async with link.declaring() as admin:
            frame = await admin.call("queue_purge", queue)
        return int(frame.method.message_count)

    async def depth(self, queue: str, link: Link) -> int:
        """Messages in ``queue`` (a passive declare)."""
        await link.ready(self.timeout)
        async with link.declaring() as admin:
            frame = await admin.call("queue_declare", queue, passive=True)
        return int(frame.method.message_count)

    async def unbind(self, sub: RabbitMQSubscription) -> None:
        """Remove every binding of ``sub``'s queue (those of its patterns and those this
        process made): it receives nothing more."""
        link = sub.link
        await link.ready(self.timeout)
        async with link.declaring() as admin:
            await self._unbind(admin, sub, gone_ok=False)

    async def delete_queue(self, queue: str, sub: RabbitMQSubscription | None) -> None:
        """Stop ``sub``'s consumer and puller (when given) and delete ``queue``."""
        link = sub.link if sub is not None else self.primary
        await link.ready(self.timeout)
        if sub is not None:
            await self.stop_and_close(sub)
        async with link.declaring() as admin:
            await admin.call("queue_delete", queue)

    async def stop_and_close(self, sub: RabbitMQSubscription) -> None:
        """Stop ``sub``'s consumer and close its puller."""
        await self.stop(sub)
        if sub.puller is not None:
            await sub.puller.close()
            sub.puller = None

    async def delete_unless_waiting(self, sub: RabbitMQSubscription) -> bool:
        """Stop ``sub``'s consumer and puller and delete its queue unless messages wait
        in it (another instance ending it drains them into a pull point, then deletes
        it); a queue left is unbound (:meth:`unbind_left`).  False when it was left.  A
        classic queue's delete is refused while it holds messages (``if-empty``:
        atomic); a quorum queue has no such delete (RabbitMQ closes the connection with
        NOT_IMPLEMENTED), so its depth is read first, and only messages given back to it
        between that read and the delete could go with it.  Refusals close the
        declaration channel only (``Declarer`` reopens it)."""
        await self.stop_and_close(sub)
        async with sub.link.declaring() as admin:
            try:
                frame = await admin.call("queue_declare", sub.queue, passive=True)
                if not int(frame.method.message_count):
                    await admin.call("queue_delete", sub.queue, if_empty=self._classic(sub))
                    return True
            except ChannelError as exc:
                if exc.code == NOT_FOUND:
                    return True  # deleted already
                if exc.code != PRECONDITION_FAILED:  # a message arrived after the read
                    raise
            await self.unbind_left(admin, sub)
        return False

    async def unbind_left(self, admin: Declarer, sub: RabbitMQSubscription) -> None:
        """Remove every binding of ``sub``'s queue, left because messages wait in it:
        the subscription ended, and nothing published from now on goes into it (also
        when this process declared it again after the ending instance deleted it, and
        nothing deletes it then).  A binding or queue gone meanwhile (the ending
        instance's drain deleted the queue) is no error."""
        await self._unbind(admin, sub, gone_ok=True)

    async def _unbind(self, admin: Declarer, sub: RabbitMQSubscription, *, gone_ok: bool) -> None:
        """``queue.unbind`` of the bindings of ``sub``'s patterns and those this process
        made; ``gone_ok``: a 404 (no queue, no exchange) is no error."""
        bindings = set(self.declarations.names.bindings_for(sub.spec.patterns)) | sub.bound
        for exchange, key in sorted(bindings):
            try:
                await admin.call("queue_unbind", sub.queue, exchange, key)
            except ChannelError as exc:
                if not gone_ok or exc.code != NOT_FOUND:
                    raise
                if "no queue" in exc.text:
                    break  # the queue went (its bindings with it): the rest would fail alike
        sub.bound = set()
        sub.declared_as = None

    def _classic(self, sub: RabbitMQSubscription) -> bool:
        """Whether ``sub``'s queue is known to be a classic queue: declared here as
        wanted (one kept with other arguments may be a quorum queue)."""
        declared = sub.declared_as
        return declared is not None and declared[1].get("x-queue-type", "classic") == "classic"
