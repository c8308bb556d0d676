"""The current-message tap: GetCurrentMessage for the RabbitMQ adapter, native publishers
included.

A tap queue ``wsnmom.current.<instance>`` bound (through a headers filter that leaves
out the gateway's own publishes) to the catch-all exchange feeds an in-memory
last-message-per-(exchange, routing key) map with native messages; the gateway's own
confirmed publishes update the map directly (:meth:`CurrentMessages.remember`) and reach
*other* gateway instances' taps as copies (the peer tap, :meth:`CurrentMessages._start_peer_tap`).
A barrier message through the tap queue lets a lookup wait until the tap consumed what
was routed before it.  See docs/adapters/rabbitmq.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import pika
from wsnmom.core.adapter import HEADER_PUBLISHED_AT, StoredMessage
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import Topic

from ._link import Channel, Declarer, FrameReader, Link
from .names import Binding, RabbitMQNames, headers_of
from .options import RabbitMQOptions

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: header on the barrier messages of the current-message tap
_BARRIER_HEADER = "wsnmom-barrier"
#: header marking messages the gateway published (value "gateway"); the current-message
#: tap filters them out of its native path (they reach it as explicit copies instead)
HEADER_ORIGIN = "wsnmom-origin"
#: headers of the tap copies: where the original message was published
TAP_EXCHANGE_HEADER = "wsnmom-tap-exchange"
TAP_KEY_HEADER = "wsnmom-tap-key"
#: header of the tap copies: the instance that published them (its own tap skips them)
TAP_INSTANCE_HEADER = "wsnmom-tap-instance"
#: a header no message carries: a binding on it never matches
_NEVER_HEADER = "wsnmom-tap-never"


class CurrentMessages:
    """The tap topology, its consumer on the primary consuming connection (``link``) and
    the map of current messages.  ``on_tap`` is what each tap delivery is handed to
    (replaceable, :meth:`receive` by default)."""

    def __init__(
        self, opts: RabbitMQOptions, names: RabbitMQNames, instance: str, link: Link
    ) -> None:
        self.opts = opts
        self.names = names
        self.instance = instance
        self.link = link
        self.queue = f"wsnmom.current.{instance}"
        self.on_tap: Callable[[Any, Any, bytes], None] = self.receive
        # loop-thread state
        self.channel: Channel | None = None
        self._barriers: dict[str, asyncio.Future[None]] = {}
        #: the current message of each (exchange, routing key), least recent first
        self.current: OrderedDict[Binding, StoredMessage] = OrderedDict()
        self.lock = threading.Lock()

    @property
    def tap_exchanges(self) -> tuple[str, str, str]:
        """(headers filter, native fanout, drop) exchanges of the current-message tap."""
        base = self.opts.all_exchange
        return f"{base}.tap", f"{base}.tap.native", f"{base}.tap.drop"

    @property
    def peer_exchanges(self) -> tuple[str, str, str, str]:
        """Exchanges that carry gateway copies to the *other* instances' tap queues:
        (shared fanout, this instance's headers filter, own-copy sink, inlet fanout)."""
        base, me = self.opts.all_exchange, self.instance
        return (
            f"{base}.tap.peers",
            f"{base}.tap.from.{me}",
            f"{base}.tap.own.{me}",
            f"{base}.tap.in.{me}",
        )

    async def _start_peer_tap(self, admin: Declarer) -> None:
        """Let the gateway copies of other instances, but not this instance's own, reach
        this instance's tap queue.

        ``<all>.tap.peers`` (fanout, shared) -> ``<all>.tap.from.<me>`` (headers,
        alternate exchange ``<all>.tap.in.<me>``, a fanout bound to the tap queue).  A copy
        whose ``wsnmom-tap-instance`` is this instance matches the filter's one binding, to
        ``<all>.tap.own.<me>``, whose only binding to the tap queue never matches: the copy
        is dropped by the broker.  Every other copy is unroutable at the filter and goes
        to the alternate exchange, so into the tap queue.  The three per-instance exchanges
        are auto-delete and bound, directly or in a chain, only to the tap queue: when the
        tap queue expires they go away with it.
        """
        peers_x, from_x, own_x, in_x = self.peer_exchanges
        await admin.call("exchange_declare", peers_x, exchange_type="fanout", durable=True)
        await admin.call("exchange_declare", in_x, exchange_type="fanout", auto_delete=True)
        await admin.call("queue_bind", self.queue, in_x, "")
        await admin.call("exchange_declare", own_x, exchange_type="headers", auto_delete=True)
        await admin.call(
            "queue_bind",
            self.queue,
            own_x,
            "",
            arguments={"x-match": "all", _NEVER_HEADER: "never"},
        )
        await admin.call(
            "exchange_declare",
            from_x,
            exchange_type="headers",
            auto_delete=True,
            arguments={"alternate-exchange": in_x},
        )
        await admin.call(
            "exchange_bind",
            destination=own_x,
            source=from_x,
            routing_key="",
            arguments={"x-match": "all", TAP_INSTANCE_HEADER: self.instance},
        )
        await admin.call("exchange_bind", destination=from_x, source=peers_x, routing_key="")

    async def start(self, link: Link) -> None:
        """Declare the tap topology (shared by all gateway instances) and consume this
        instance's tap queue.

        ``<all>`` -> ``<all>.tap`` (headers exchange, alternate exchange
        ``<all>.tap.native``) -> ``<all>.tap.drop`` (no bindings) for messages carrying
        ``wsnmom-origin: gateway``; everything else is unroutable there and goes to the
        alternate exchange, a fanout every instance's tap queue is bound to.  So the tap
        never counts as a route for the gateway's own (mandatory) publishes.  Those update
        this instance's map directly when confirmed, and reach the other instances' taps
        as explicit copies (see :meth:`_start_peer_tap`).
        """
        filter_x, native_x, drop_x = self.tap_exchanges
        args = {
            "x-queue-type": "classic",
            "x-max-length": self.opts.current_tap_max_length,
            "x-overflow": "drop-head",
            "x-expires": int(self.opts.current_tap_expires * 1000),
        }
        async with link.declaring() as admin:
            await admin.call("exchange_declare", native_x, exchange_type="fanout", durable=True)
            await admin.call("exchange_declare", drop_x, exchange_type="fanout", durable=True)
            await admin.call(
                "exchange_declare",
                filter_x,
                exchange_type="headers",
                durable=True,
                arguments={"alternate-exchange": native_x},
            )
            await admin.call(
                "exchange_bind",
                destination=drop_x,
                source=filter_x,
                routing_key="",
                arguments={"x-match": "any", HEADER_ORIGIN: "gateway"},
            )
            await admin.call(
                "exchange_bind",
                destination=filter_x,
                source=self.opts.all_exchange,
                routing_key="#",
            )
            await admin.call("queue_declare", self.queue, durable=False, arguments=args)
            await admin.call("queue_bind", self.queue, native_x, "")
            await self._start_peer_tap(admin)
        ch = await link.open_channel()

        def on_message(_ch: Any, method: Any, properties: Any, body: bytes) -> None:
            self.on_tap(method, properties, body)

        generation = link.generation

        def on_close(closed: Channel, reason: BaseException) -> None:
            # closed while the connection stays up (a message its reader could not read,
            # the tap queue deleted): consume again shortly
            conn = link.connection
            if (
                self.channel is closed
                and conn is not None
                and conn.is_open
                and link.generation == generation
            ):
                log.warning("current-message tap closed (%s); restarting", reason)
                link.loop.call_later(0.5, lambda: link.loop.create_task(self._restart(link)))

        ch.add_close_listener(on_close)
        ch.read(FrameReader(on_deliver=lambda m, p, b: self.on_tap(m, p, b)))
        await ch.call("basic_consume", self.queue, on_message, auto_ack=True)
        self.channel = ch

    async def _restart(self, link: Link) -> None:
        """Consume the tap again (its channel closed, the connection is up)."""
        try:
            await self.start(link)
        except Exception as exc:
            log.warning("cannot restart the current-message tap: %s", exc)

    def lost(self) -> None:
        """The tap's connection went down: no tap, and no barrier will come back."""
        self.channel = None
        for fut in self._barriers.values():
            if not fut.done():
                fut.set_result(None)
        self._barriers.clear()

    def receive(self, method: Any, properties: Any, body: bytes) -> None:
        """A tap delivery: a barrier, a copy of another instance's publish, or a native
        message (loop thread)."""
        headers = headers_of(properties)
        barrier = headers.get(_BARRIER_HEADER)
        if barrier is not None and method.exchange == "":
            fut = self._barriers.pop(barrier, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        exchange, key = method.exchange, method.routing_key
        if TAP_EXCHANGE_HEADER in headers and exchange in (
            self.tap_exchanges[1],  # copies from gateway versions before the peer tap
            self.peer_exchanges[0],
        ):
            if headers.pop(TAP_INSTANCE_HEADER, None) == self.instance:
                return  # already in the map (the broker normally drops these)
            exchange = headers.pop(TAP_EXCHANGE_HEADER)
            key = headers.pop(TAP_KEY_HEADER, "")
        try:
            topic = self.names.topic_of(exchange, key, headers)
        except NameNotRepresentable:
            return
        stored = StoredMessage(
            topic=topic,
            body=body,
            headers=headers,
            content_type=properties.content_type or "application/octet-stream",
        )
        self.remember([((exchange, key), stored)])

    def remember(self, entries: Iterable[tuple[Binding, StoredMessage]]) -> None:
        """Make ``entries`` the current messages of their (exchange, routing key), unless
        the one held was published later: another instance's publish comes back through
        the peer tap asynchronously, and may arrive after this instance published a newer
        message on the same topic itself.  Messages without the gateway's publication
        time (native ones) always replace."""
        with self.lock:
            for where, stored in entries:
                held = self.current.get(where)
                if held is not None and _older(stored, held):
                    continue
                self.current[where] = stored
                self.current.move_to_end(where)
            while len(self.current) > self.opts.current_cache_size:
                self.current.popitem(last=False)

    async def _barrier(self, timeout: float) -> None:
        """Wait until the tap consumed everything routed before now (best effort)."""
        if self.channel is None or not self.channel.is_open:
            return
        token = uuid.uuid4().hex
        fut: asyncio.Future[None] = self.link.loop.create_future()
        self._barriers[token] = fut
        self.channel.pika.basic_publish(
            "",
            self.queue,
            b"",
            pika.BasicProperties(headers={_BARRIER_HEADER: token}),
        )
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            log.debug("current-message barrier timed out")
        finally:
            self._barriers.pop(token, None)

    def lookup(self, topic: Topic) -> StoredMessage | None:
        """The current message of ``topic``, once the tap caught up (at most ~2 s)."""
        try:
            key = self.names.native_name(topic)
        except NameNotRepresentable:
            return None
        if self.link.is_up:
            with contextlib.suppress(Exception):
                self.link.submit(self._barrier(2.0), 3.0)
        with self.lock:
            stored = self.current.get(key)
        if stored is None:
            return None
        return StoredMessage(topic, stored.body, stored.headers, stored.content_type)


def _older(stored: StoredMessage, held: StoredMessage) -> bool:
    """Whether ``stored`` was published before ``held`` (both carry the gateway's
    publication time, ISO 8601 with an offset; either without it: False)."""
    a, b = stored.headers.get(HEADER_PUBLISHED_AT), held.headers.get(HEADER_PUBLISHED_AT)
    if not a or not b:
        return False
    try:
        return datetime.fromisoformat(a) < datetime.fromisoformat(b)
    except (TypeError, ValueError):
        return False
