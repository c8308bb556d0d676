"""A pika channel on a :class:`~._link.Link`'s loop thread, made awaitable.

:class:`Channel` turns the channel's synchronous AMQP methods into coroutines; when the
broker closes the channel (a failed passive declare, a precondition failure) every RPC
pending on it raises :class:`ChannelError` with the AMQP reply code.  It also reads its own
traffic through a :class:`~._wire.FrameReader` when given one, chains ``basic.get``
requests without coroutines (``request_get``), consumes without pika's knowledge
(``consume``: closing the channel then sends no ``basic.cancel`` first) and writes
pre-encoded publish frames.
:class:`Declarer` is one of a connection's declaration channels, held by one task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
import pika.frame
from pika import spec
from pika.channel import Channel as PikaChannel

from ._fast import FastConnection
from ._wire import FRAME_END, FRAME_HEAD, Delivered, FrameReader, PublishFrames, shortstr

if TYPE_CHECKING:
    from ._link import Link

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: AMQP reply codes the adapter reacts to
NOT_FOUND = 404
PRECONDITION_FAILED = 406
RESOURCE_LOCKED = 405


class ChannelError(Exception):
    """The broker (or the connection) closed a channel while an operation was pending."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    @classmethod
    def from_reason(cls, reason: BaseException | None) -> ChannelError:
        """Build from the reason pika gives for a channel closure."""
        if isinstance(reason, pika.exceptions.ChannelClosed):
            return cls(reason.reply_code, reason.reply_text)
        return cls(0, str(reason or "channel closed"))


#: what a basic.get request gets back: the message, None (empty) or the channel's error
GetReply = tuple[Any, Any, bytes] | None | BaseException
#: Basic.Get: class 60, method 70, reserved ticket 0
_GET_HEAD = struct.pack(">HHH", 60, 70, 0)


def _resolver(fut: asyncio.Future[Any]) -> Callable[[Any], None]:
    """A pika callback that resolves ``fut`` with None (a reply frame arrived)."""

    def resolve(_frame: Any) -> None:
        if not fut.done():
            fut.set_result(None)

    return resolve


class Channel:
    """A pika channel whose RPCs are awaitable.  Use only on the link's loop thread."""

    def __init__(self, link: Link, channel: PikaChannel) -> None:
        self.link = link
        self.pika = channel
        self.close_reason: BaseException | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._get_waiter: asyncio.Future[Any] | None = None
        self._close_listeners: list[Callable[[Channel, BaseException], None]] = []
        self._reader: FrameReader | None = None
        #: reject (not requeue) a message whose reading failed twice: a channel that
        #: reads with manual acknowledgements (see :meth:`_reader_failed`)
        self.reject_unreadable = False
        #: basic.get requests awaiting their reply, oldest first (replies come in order)
        self._getters: deque[Callable[[GetReply], None]] = deque()
        #: encoded basic.get frames per (queue, no_ack)
        self._get_frames: dict[tuple[str, bool], bytes] | None = None
        channel.add_on_close_callback(self._on_close)
        channel.add_callback(self._on_get_empty, [spec.Basic.GetEmpty], one_shot=False)

    @property
    def is_open(self) -> bool:
        """True while the channel can be used."""
        return self.close_reason is None and self.pika.is_open

    @property
    def writable(self) -> bool:
        """True while methods may be written on the channel: open, or its
        ``channel.open`` sent and not answered yet (the broker reads a channel's methods
        in order, so those written meanwhile follow the open; :meth:`Link.begin_channel`)."""
        return self.close_reason is None and (self.pika.is_open or self.pika.is_opening)

    def add_close_listener(self, listener: Callable[[Channel, BaseException], None]) -> None:
        """Call ``listener(channel, reason)`` on the loop thread when the channel closes."""
        self._close_listeners.append(listener)

    def read(self, reader: FrameReader) -> None:
        """Let ``reader`` read this channel's confirms, returns and deliveries
        (:class:`FastConnection`) until the channel closes."""
        readers = getattr(self.pika.connection, "readers", None)
        if readers is None:
            raise TypeError("not a FastConnection")
        readers[self.pika.channel_number] = reader
        self._reader = reader
        reader.on_failure = self._reader_failed

    def _reader_failed(self, message: Delivered | None) -> None:
        """Reading this channel's traffic raised (logged by the connection): close the
        channel, so that what it holds unsettled goes back to its queues and its owner's
        close listener (a consumer's restart) runs; the connection stays.  Settlements
        already given are written first.  With :attr:`reject_unreadable`, a message that
        failed once already (``redelivered``) is rejected instead of requeued: it would
        fail again at each redelivery and hold up the queue behind it (RabbitMQ
        dead-letters it when the queue has a dead-letter exchange, else drops it)."""
        if not self.pika.is_open:
            return
        self.link.flush_settles()
        if (
            self.reject_unreadable
            and message is not None
            and message.redelivered
            and message.delivery_tag
        ):
            log.error(
                "RabbitMQ: a message of %r/%r cannot be read again; rejected (dead-lettered "
                "when its queue has a dead-letter destination)",
                message.exchange,
                message.routing_key,
            )
            self.pika.basic_reject(message.delivery_tag, requeue=False)
        try:
            self.pika.close()
        except Exception:  # pragma: no cover - closing already
            log.debug("closing channel %d after a failed read", self.pika.channel_number)

    def _on_close(self, _channel: PikaChannel, reason: BaseException) -> None:
        self.close_reason = reason
        reader, self._reader = self._reader, None
        readers = getattr(self.pika.connection, "readers", None)
        number = self.pika.channel_number
        if reader is not None and readers is not None and readers.get(number) is reader:
            del readers[number]
        error = ChannelError.from_reason(reason)
        for fut in list(self._pending):
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        getters, self._getters = self._getters, deque()
        for reply in getters:
            try:
                reply(error)
            except Exception:  # pragma: no cover - defensive
                log.exception("basic.get reply handler failed")
        for listener in self._close_listeners:
            try:
                listener(self, reason)
            except Exception:  # pragma: no cover - defensive
                log.exception("channel close listener failed")

    def _future(self) -> asyncio.Future[Any]:
        if not self.writable:
            raise ChannelError.from_reason(self.close_reason)
        fut: asyncio.Future[Any] = self.link.loop.create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``channel.<method>(..., callback=...)`` and await the reply frame."""
        fut = self._future()

        def done(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        getattr(self.pika, method)(*args, callback=done, **kwargs)
        return await fut

    @property
    def fast_get(self) -> bool:
        """True once :meth:`start_fast_get` ran."""
        return self._get_frames is not None

    def start_fast_get(self) -> None:
        """Send ``basic.get`` frames directly and read the replies with a
        :class:`FrameReader` (no pika frame objects); several requests may be in flight."""
        self.read(FrameReader(on_get=self._on_get_reply))
        self._get_frames = {}

    def request_get(
        self, queue: str, reply: Callable[[GetReply], None], *, no_ack: bool = False
    ) -> None:
        """Send ``basic.get`` for ``queue`` (manual ack, or removed on delivery with
        ``no_ack``); ``reply`` gets (method, properties, body), None when the queue was
        empty, or the ChannelError that closed the channel.  Loop thread, after
        :meth:`start_fast_get`."""
        frames = self._get_frames
        assert frames is not None
        if not self.is_open:
            reply(ChannelError.from_reason(self.close_reason))
            return
        key = (queue, no_ack)
        frame = frames.get(key)
        if frame is None:
            payload = _GET_HEAD + shortstr(queue) + (b"\x01" if no_ack else b"\x00")
            frame = FRAME_HEAD.pack(1, self.pika.channel_number, len(payload)) + payload
            frame = frames[key] = frame + FRAME_END
        self._getters.append(reply)
        self.write(frame)

    def _on_get_reply(self, method: Delivered | None, properties: Any, body: bytes) -> None:
        if not self._getters:  # pragma: no cover - a reply nobody asked for
            log.warning("unexpected basic.get reply on channel %s", self.pika.channel_number)
            return
        reply = self._getters.popleft()
        reply(None if method is None else (method, properties, body))

    async def get(self, queue: str) -> tuple[Any, Any, bytes] | None:
        """``basic.get`` with manual ack: (method, properties, body) or None when empty."""
        if self._get_frames is not None:
            waiter = self._future()

            def reply(result: GetReply) -> None:
                if waiter.done():
                    return
                if isinstance(result, BaseException):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)

            self.request_get(queue, reply)
            message: tuple[Any, Any, bytes] | None = await waiter
            return message
        fut = self._future()
        self._get_waiter = fut

        def got(_ch: PikaChannel, method: Any, properties: Any, body: bytes) -> None:
            if not fut.done():
                fut.set_result((method, properties, body))

        self.pika.basic_get(queue, got, auto_ack=False)
        try:
            result: tuple[Any, Any, bytes] | None = await fut
        finally:
            self._get_waiter = None
        return result

    async def consume(
        self,
        queue: str,
        consumer_tag: str,
        prefetch: int | None = None,
        before: Sequence[tuple[Any, Any]] = (),
    ) -> None:
        """``basic.consume`` (manual acks) written on the wire and its ``consume-ok``
        awaited, without pika's consumer registry: the deliveries are read by this
        channel's :class:`FrameReader` (:meth:`read` first), and :meth:`close` then sends
        ``channel.close`` alone.  pika's own ``close`` cancels every consumer it knows
        before closing, and RabbitMQ activates a single-active-consumer queue's next
        consumer at the cancel, before what this one holds comes back: the next one then
        got newer messages first.  Closing the channel instead returns what it holds to
        the head of the queue before the next consumer is activated (RabbitMQ 3.10,
        quorum queues; docs/scale-out.md, "What fences what").

        With ``prefetch``, a ``basic.qos`` (per consumer) goes in the same write, ahead of
        the consume: the broker applies a channel's methods in order, so the consume is
        limited by it, and the opening waits for one round trip instead of two.
        ``before``: further (method, reply class) pairs written first in the same write
        (a declaration of the queue and its bindings): a refusal of any closes the
        channel, and the broker then ignores what follows it on the channel."""
        methods: list[tuple[Any, Any]] = list(before)
        if prefetch is not None:
            methods.append((spec.Basic.Qos(prefetch_count=prefetch), spec.Basic.QosOk))
        consume = spec.Basic.Consume(queue=queue, consumer_tag=consumer_tag, no_ack=False)
        methods.append((consume, spec.Basic.ConsumeOk))
        waits = []
        for _method, reply in methods:
            fut = self._future()
            self.pika.add_callback(_resolver(fut), [reply], one_shot=True)
            waits.append(fut)
        number = self.pika.channel_number
        self.write(b"".join(pika.frame.Method(number, m).marshal() for m, _ in methods))
        await asyncio.gather(*waits)

    def frames(self) -> PublishFrames:
        """A :class:`PublishFrames` for this channel (sized to the connection's frame_max)."""
        conn = self.pika.connection
        return PublishFrames(self.pika.channel_number, int(conn.params.frame_max))

    def write(self, data: bytes) -> None:
        """Send pre-encoded frames (:class:`PublishFrames`) on this channel's connection."""
        if not self.writable:
            raise ChannelError.from_reason(self.close_reason)
        conn = self.pika.connection
        if not isinstance(conn, FastConnection):
            raise TypeError("not a FastConnection")
        conn.write_frames(data)

    @property
    def write_lock(self) -> contextlib.AbstractContextManager[Any]:
        """The connection's write lock (see :class:`FastConnection`)."""
        lock = getattr(self.pika.connection, "write_lock", None)
        return lock if lock is not None else contextlib.nullcontext()

    def can_send_now(self) -> bool:
        """Whether :meth:`send_now` would write (call with :attr:`write_lock` held)."""
        conn = self.pika.connection
        return self.is_open and isinstance(conn, FastConnection) and conn.idle()

    def send_now(self, data: bytes) -> None:
        """Write pre-encoded frames from the calling thread (any thread), right after
        :meth:`can_send_now` said yes, :attr:`write_lock` held all along."""
        sent = self.pika.connection.send_now(data)
        assert sent, "send_now without can_send_now under the same write lock"

    def _on_get_empty(self, _frame: Any) -> None:
        waiter = self._get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def close(self) -> None:
        """Close the channel (unacked deliveries go back to their queues; acks already
        given are written first); one still opening is closed once open."""
        if not self.writable:
            return
        self.link.flush_settles()
        fut: asyncio.Future[None] = self.link.loop.create_future()

        def closed(_channel: Channel, _reason: BaseException) -> None:
            if not fut.done():
                fut.set_result(None)

        self.add_close_listener(closed)
        with contextlib.suppress(Exception):
            self.pika.close()
            await asyncio.wait_for(fut, 5.0)


class Declarer:
    """One of a connection's declaration channels, held by one task at a time
    (:meth:`Link.declaring`).  A failure the broker answers by closing the channel (a
    failed passive declare, a precondition) reaches only the task holding it; its next
    :meth:`call` opens a fresh channel."""

    __slots__ = ("_link", "channel_in_use")

    def __init__(self, link: Link, channel: Channel | None) -> None:
        self._link = link
        #: the channel this task uses (None until the first call)
        self.channel_in_use = channel

    async def channel(self) -> Channel:
        """The held channel, reopened when the broker closed it."""
        ch = self.channel_in_use
        if ch is None or not ch.is_open:
            ch = self.channel_in_use = await self._link.open_channel()
        return ch

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`Channel.call` on the held channel."""
        return await (await self.channel()).call(method, *args, **kwargs)
