"""Publishing with publisher confirms on the RabbitMQ adapter's publishing connection.

Messages are persistent and, unless ``report_unrouted`` is off, ``mandatory``: a
``basic.return`` before a message's confirm makes its receipt ``routed=False``.  A batch
(``publish_many``) is encoded into frames on the calling thread and written at once,
from the calling thread itself when nothing waits to be written before it (else in one
loop callback); one future waits for all its confirms.  The first publish to an exchange,
and every publish while the channel is being (re)opened, takes the coroutine path.  The
last message of a batch per (exchange, routing key) becomes current in the tap's map once
confirmed, and is copied to the other gateway instances' taps right behind the original.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika
from pika import spec
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    OutboundMessage,
    PublishFailed,
    PublishReceipt,
    StoredMessage,
    is_internal_namespace,
)
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.translate import fallback_root

from ._completion import Completion
from ._link import Channel, ChannelError, FrameReader, Link, LinkDown, PublishFrames, encode_table
from .current import (
    HEADER_ORIGIN,
    TAP_EXCHANGE_HEADER,
    TAP_INSTANCE_HEADER,
    TAP_KEY_HEADER,
    CurrentMessages,
)
from .declarations import Declarations
from .errors import PublishUnavailable
from .names import Binding, RabbitMQNames
from .options import RabbitMQOptions

log = logging.getLogger("wsnmom.adapters.rabbitmq")

_ROUTED = PublishReceipt(routed=True)
_UNROUTED = PublishReceipt(routed=False)
#: without ``mandatory`` (``report_unrouted = false``) the broker does not tell
_UNKNOWN = PublishReceipt(routed=None)
_NACKED = PublishReceipt(routed=None)
#: entries kept in the topic -> (exchange, routing key) memo
_NAME_CACHE_SIZE = 10000


class _Stale(Exception):
    """The publishing channel changed between encoding a batch and writing it."""


class _Batch:
    """The messages of one ``publish_many`` call waiting for their confirms: one future
    for the whole batch instead of one per message (an asyncio future when a coroutine
    on the loop waits, a :class:`Completion` when the publishing thread does)."""

    __slots__ = ("future", "receipts", "remaining")

    def __init__(
        self, future: asyncio.Future[None] | Completion, size: int, receipt: PublishReceipt
    ) -> None:
        self.future = future
        #: each message's receipt: ``receipt`` unless a return or nack says otherwise
        self.receipts: list[PublishReceipt] = [receipt] * size
        #: confirms still to come (messages and their peer copies)
        self.remaining = 0

    def confirmed(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0 and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class _Pending:
    """A publish waiting for its confirm: message ``index`` of ``batch`` (-1: a peer copy,
    whose receipt is not reported)."""

    batch: _Batch
    index: int
    exchange: str
    routing_key: str
    message_id: str


class Publisher:
    """The publishing connection (``link``), its confirm-mode channel and the publishes
    waiting for their confirms."""

    def __init__(
        self,
        parameters: pika.URLParameters,
        opts: RabbitMQOptions,
        names: RabbitMQNames,
        declarations: Declarations,
        current: CurrentMessages,
    ) -> None:
        self.opts = opts
        self.names = names
        self.declarations = declarations
        self.current = current
        #: a confirmed publish's receipt unless the broker returns or nacks it
        self._receipt = _ROUTED if opts.report_unrouted else _UNKNOWN
        # loop-thread state
        self.channel: Channel | None = None
        self._tag = 0
        #: publishes waiting for their confirm, by delivery tag (in tag order)
        self.pending: OrderedDict[int, _Pending] = OrderedDict()
        #: basic.return counts by (exchange, routing key, message id), until the confirm
        self.returned: dict[tuple[str, str, str], int] = {}
        self.frames: PublishFrames | None = None
        #: guards ``pending`` and the delivery tags: publishing threads number and
        #: register their publishes while the loop settles confirms (taken before the
        #: connection's write lock, never after it)
        self._lock = threading.RLock()
        #: memo of _target
        self._targets: dict[Topic, tuple[str, str, bool]] = {}
        self.link = Link(
            "publisher",
            parameters,
            self._connected,
            self._lost,
            max_delay=opts.reconnect_max_delay,
        )

    # --- the channel and its confirms (loop thread) ----------------------------------

    async def _connected(self, link: Link) -> None:
        self.declarations.reset(link)
        await self._open_channel(link)

    async def _open_channel(self, link: Link) -> Channel:
        ch = await link.open_channel()
        with self._lock:
            self._tag = 0
        self.frames = None
        ch.pika.add_on_return_callback(self._on_return)
        ch.add_close_listener(self._on_channel_closed)
        await ch.call("confirm_delivery", self._on_confirm)
        # confirms and returns are read straight from the wire (pika's callbacks above
        # stay as the fallback); Confirm.SelectOk has gone through pika
        ch.read(FrameReader(on_confirm=self._confirmed, on_return=self._on_returned))
        self.channel = ch
        return ch

    def _fail_pending(self, reason: str) -> None:
        with self._lock:
            pending = list(self.pending.values())
            self.pending.clear()
        self.returned.clear()
        for p in pending:
            p.batch.fail(PublishFailed(reason))

    def _on_channel_closed(self, ch: Channel, reason: BaseException) -> None:
        if self.channel is ch:
            self.channel = None
            self.frames = None
            self._fail_pending(f"channel closed before the broker confirmed: {reason}")

    def _lost(self, link: Link, reason: BaseException | None) -> None:
        self.channel = None
        self.frames = None
        self._fail_pending(f"connection lost before the broker confirmed: {reason}")

    def _on_return(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        self._on_returned(method, properties, body)

    def _on_returned(self, method: Any, properties: Any, _body: bytes) -> None:
        # A return precedes the confirm of the same message on the channel: count it, and
        # the confirm of the oldest pending message with this exchange, routing key and
        # message id reports it unrouted.
        key = (method.exchange, method.routing_key, properties.message_id or "")
        self.returned[key] = self.returned.get(key, 0) + 1

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        nack = isinstance(method, spec.Basic.Nack)
        self._confirmed(method.delivery_tag, method.multiple, nack)

    def _confirmed(self, tag: int, multiple: bool, nack: bool) -> None:
        pending = self.pending
        with self._lock:
            if multiple:
                # tags are confirmed in order: pop from the front, O(1) each
                settled = []
                while pending:
                    first = next(iter(pending))
                    if first > tag:
                        break
                    settled.append(pending.pop(first))
            else:
                p = pending.pop(tag, None)
                settled = [p] if p is not None else []
        for p in settled:
            self._settle(p, nack)

    def _settle(self, p: _Pending, nack: bool) -> None:
        batch = p.batch
        if p.index >= 0:
            returned = self.returned
            if returned:
                key = (p.exchange, p.routing_key, p.message_id)
                count = returned.get(key, 0)
                if count:
                    if count == 1:
                        del returned[key]
                    else:
                        returned[key] = count - 1
                    batch.receipts[p.index] = _UNROUTED
            if nack:
                if self.opts.fail_on_nack:
                    batch.fail(PublishFailed("RabbitMQ rejected the message (nack)"))
                    return
                log.warning(
                    "RabbitMQ nacked message %s on %s/%s (a full reject-publish queue?)",
                    p.message_id,
                    p.exchange,
                    p.routing_key,
                )
                batch.receipts[p.index] = _NACKED
        # a peer copy's nack is not the publisher's concern
        batch.confirmed()

    # --- encoding (any thread) ----------------------------------------------------------

    def _target(self, topic: Topic) -> tuple[str, str, bool]:
        """(exchange, routing key, internal namespace) of a published topic, memoised."""
        target = self._targets.get(topic)
        if target is None:
            try:
                exchange, key = self.names.native_name(topic)
            except NameNotRepresentable as exc:
                raise PublishFailed(f"{topic} has no RabbitMQ name: {exc}") from exc
            target = (exchange, key, is_internal_namespace(topic.namespace))
            # a fallback namespace's name may stop being representable once another
            # namespace claims its exchange: only configured or derived names are stable
            if fallback_root(topic.namespace) is None:
                if len(self._targets) >= _NAME_CACHE_SIZE:
                    self._targets.clear()
                self._targets[topic] = target
        return target

    def _encode(
        self,
        messages: Sequence[OutboundMessage],
        targets: Sequence[tuple[str, str, bool]],
        frames: PublishFrames,
        batch: _Batch,
    ) -> tuple[bytes, list[_Pending], list[tuple[Binding, StoredMessage]]]:
        """The frames of ``messages`` (and their peer copies), the pending entries in
        publish order and the current-message updates.  Pure: runs on any thread."""
        keep_current = self.opts.current_message
        peers = self.current.peer_exchanges[0] if keep_current and self.opts.current_peers else None
        # only the last message per (exchange, routing key) of the batch becomes current
        # and is copied to the other instances: the earlier ones are superseded at once
        last: dict[tuple[str, str], int] = {}
        if keep_current:
            last = {(ex, key): i for i, (ex, key, internal) in enumerate(targets) if not internal}
        out: list[bytes] = []
        pendings: list[_Pending] = []
        current: list[tuple[Binding, StoredMessage]] = []
        timestamp = int(time.time())
        instance = self.current.instance
        for i, message in enumerate(messages):
            exchange, key, _internal = targets[i]
            headers: dict[str, Any] = dict(message.headers)
            headers[HEADER_MESSAGE_ID] = message.message_id
            # the topic headers name the message's own topic when core gave them (a copy
            # routed into a pull point inbox keeps the topic it was published on)
            topic = message.topic
            if HEADER_TOPIC_NAMESPACE not in headers:
                headers[HEADER_TOPIC_NAMESPACE] = topic.namespace
            if HEADER_TOPIC_PATH not in headers:
                headers[HEADER_TOPIC_PATH] = "/".join(topic.path)
            headers[HEADER_ORIGIN] = "gateway"
            frames.message(
                out,
                frames.method(exchange, key, self.opts.report_unrouted),
                message.body,
                content_type=message.content_type,
                table=encode_table(headers),
                persistent=True,
                message_id=message.message_id,
                timestamp=timestamp,
            )
            pendings.append(_Pending(batch, i, exchange, key, message.message_id))
            if last.get((exchange, key)) != i:
                continue
            current.append(
                (
                    (exchange, key),
                    StoredMessage(topic, message.body, headers, message.content_type),
                )
            )
            if peers is not None:
                # for the other instances' taps, right behind the original on the same
                # channel: they see gateway and native messages of one topic in (almost
                # exactly) routing order; this instance's own tap never gets it
                copy_headers = {
                    **headers,
                    TAP_EXCHANGE_HEADER: exchange,
                    TAP_KEY_HEADER: key,
                    TAP_INSTANCE_HEADER: instance,
                }
                frames.message(
                    out,
                    frames.method(peers, "", False),
                    message.body,
                    content_type=message.content_type,
                    table=encode_table(copy_headers),
                    persistent=False,
                    message_id=message.message_id,
                    timestamp=timestamp,
                )
                pendings.append(_Pending(batch, -1, peers, "", message.message_id))
        return b"".join(out), pendings, current

    # --- writing and waiting ---------------------------------------------------------

    def _register(self, pendings: list[_Pending]) -> None:
        """Number ``pendings`` with the channel's next delivery tags (with ``_lock``
        and the connection's write lock held, right before their frames are written)."""
        pending = self.pending
        tag = self._tag
        for p in pendings:
            tag += 1
            pending[tag] = p
        pendings[0].batch.remaining = len(pendings)
        self._tag = tag

    def _send(self, ch: Channel, data: bytes, pendings: list[_Pending]) -> None:
        """Number ``pendings`` and write ``data`` (loop thread)."""
        with self._lock, ch.write_lock:
            self._register(pendings)
            ch.write(data)

    def _send_now(
        self, ch: Channel, frames: PublishFrames, data: bytes, pendings: list[_Pending]
    ) -> bool:
        """Number ``pendings`` and write ``data`` from the calling thread, when the
        publishing channel is current and nothing waits to be written before it; False
        (nothing done) otherwise.  This saves the loop wake-up per publish."""
        with self._lock, ch.write_lock:
            if self.channel is not ch or self.frames is not frames or not ch.can_send_now():
                return False
            self._register(pendings)
            ch.send_now(data)
            return True

    async def _publish(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt]:
        link = self.link
        try:
            await link.ready(timeout)
        except LinkDown as exc:
            raise PublishUnavailable(str(exc)) from None
        targets = [self._target(m.topic) for m in messages]
        for exchange, internal in {t[0]: t[2] for t in targets}.items():
            await self.declarations.ensure_exchange(link, exchange, internal)
        ch = self.channel
        if ch is None or not ch.is_open:
            ch = await self._open_channel(link)
        frames = self.frames
        if frames is None:
            frames = self.frames = ch.frames()
        done: asyncio.Future[None] = link.loop.create_future()
        batch = _Batch(done, len(messages), self._receipt)
        data, pendings, current = self._encode(messages, targets, frames, batch)
        self._send(ch, data, pendings)
        await done
        # confirmed (with the peer copies: another instance's following current_message()
        # sees this publish): this instance's current-message map has them from now on,
        # without a tap round trip through the broker
        if current:
            self.current.remember(current)
        return batch.receipts

    def _publish_direct(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt] | None:
        """The common case without a coroutine: connected, publishing channel open, every
        exchange declared.  Encodes on the calling thread, hands the bytes to the loop in
        one callback and waits for the batch's confirms.  None when the case does not
        apply (or the channel changed before the write): then :meth:`_publish` runs."""
        link = self.link
        ch, frames = self.channel, self.frames
        if not link.is_up or ch is None or frames is None or not ch.is_open:
            return None
        targets = [self._target(m.topic) for m in messages]
        declared = self.declarations.declared.get(link.name, ())
        if any(t[0] not in declared for t in targets):
            return None
        done = Completion()
        batch = _Batch(done, len(messages), self._receipt)
        data, pendings, current = self._encode(messages, targets, frames, batch)
        if self._send_now(ch, frames, data, pendings):
            return self._wait_confirms(done, batch, current, timeout)

        def send() -> None:
            if self.channel is not ch or self.frames is not frames or not ch.is_open:
                batch.fail(_Stale())  # nothing written: take the coroutine path
                return
            self._send(ch, data, pendings)

        try:
            link.loop.call_soon_threadsafe(send)
        except RuntimeError:
            return None  # the loop is closed
        return self._wait_confirms(done, batch, current, timeout)

    def _wait_confirms(
        self,
        done: Completion,
        batch: _Batch,
        current: list[tuple[Binding, StoredMessage]],
        timeout: float,
    ) -> list[PublishReceipt] | None:
        """Wait for a directly published batch's confirms (None: take the coroutine path)."""
        try:
            done.result(timeout)
        except _Stale:
            return None
        except TimeoutError:
            raise PublishFailed(
                f"not confirmed: RabbitMQ did not answer within {timeout:.1f}s"
            ) from None
        if current:
            self.current.remember(current)
        return batch.receipts

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt]:
        """Publish ``messages`` (not empty) and wait for their confirms."""
        try:
            receipts = self._publish_direct(messages, timeout)
            if receipts is not None:
                return receipts
            return self.link.submit(self._publish(messages, timeout), timeout + 1)
        except PublishFailed:
            raise
        except (LinkDown, TimeoutError) as exc:
            raise PublishFailed(f"not confirmed: {exc}") from exc
        except ChannelError as exc:
            raise PublishFailed(f"RabbitMQ refused the publish: {exc}") from exc
