"""``EmbeddedAdapter``: the adapter contract on top of :mod:`wsnmom.adapters.embedded.store`.

Handles, received messages and URL parsing live here; storage, routing and the
dispatcher thread live in the store module.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from wsnmom.core.adapter import (
    Adapter,
    AdapterUnavailable,
    Capabilities,
    OutboundMessage,
    PublishReceipt,
    Received,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError, option, parse_options
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.syntax import WildcardSyntax

from .records import MEMORY, Row
from .storage import _synchronous
from .store import Engine, acquire_engine, release_engine

SCHEME = "embedded"

log = logging.getLogger(__name__)


def _any_char(ch: str) -> bool:
    return ch != "\x00"


#: The embedded middleware routes canonical patterns directly (``TopicIndex``), so it has
#: RabbitMQ's full wildcard power -- ``*`` one level, ``#`` zero or more levels anywhere --
#: without RabbitMQ's 255-byte key limit; the namespace is kept apart from the name.
EMBEDDED_SYNTAX = WildcardSyntax(
    name="embedded",
    separator=".",
    single_level="*",
    multi_level="#",
    multi_level_mid_path=True,
    multi_level_matches_parent=True,
    allowed_char=_any_char,
    max_length=None,
    length_unit="chars",
    root_in_name=False,
)


def _synchronous_mode(value: Any) -> str:
    return _synchronous(str(value))


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedOptions:
    """The embedded adapter's options (docs/adapters/embedded.md lists them)."""

    synchronous: str = option(
        "NORMAL",
        parse=_synchronous_mode,
        doc="SQLite durability: `normal` keeps every commit when the process dies, `full` "
        "also on a power failure (`off` and `extra` as SQLite defines them)",
    )


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """Split ``embedded://PATH?opt=value`` into the directory (or ``:memory:``) and options.

    ``embedded:///var/lib/wsnmom`` is absolute, ``embedded://data`` relative to the working
    directory, ``embedded://:memory:`` a private non-durable database.
    """
    prefix = SCHEME + "://"
    if not url.startswith(prefix):
        raise ValueError(f"not an embedded adapter URL: {url!r} (expected {prefix}PATH)")
    rest = url[len(prefix) :]
    rest, _, query = rest.partition("?")
    path = unquote(rest)
    if not path:
        raise ValueError(f"the embedded adapter URL needs a directory: {prefix}PATH")
    return path, dict(parse_qsl(query))


class EmbeddedReceived(Received):
    """A message handed out by an embedded subscription."""

    def __init__(self, handle: EmbeddedHandle, row: Row, *, settled: bool = False) -> None:
        self._handle = handle
        self._mid = row.mid
        self._settled = settled
        self._lock = threading.Lock()
        self.topic = row.topic
        self.body = row.body
        self.headers = row.headers
        self.content_type = row.content_type
        self.redelivered = row.redelivered

    def _settle(self, remove: bool) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        self._handle._settle(self._mid, remove=remove)

    def ack(self) -> None:
        """Remove the message from the subscription."""
        self._settle(remove=True)

    def nack(self, requeue: bool = True) -> None:
        """Return the message to its place in the queue, or drop it."""
        self._settle(remove=not requeue)

    def __repr__(self) -> str:
        return f"<EmbeddedReceived {self.topic} mid={self._mid} redelivered={self.redelivered}>"


class EmbeddedHandle(SubscriptionHandle):
    """A handle on one embedded durable subscription (push or pull).

    One exists per subscription: ``__slots__``, and the in-flight message ids are kept in
    a dict (an empty one is a quarter of an empty set).
    """

    __slots__ = (
        "__weakref__",
        "_adapter",
        "_delivering",
        "_detached",
        "_engine",
        "_inflight",
        "_on_message",
        "_prefetch",
        "_sid",
        "_started",
        "_state",
        "name",
    )

    def __init__(self, adapter: Adapter, engine: Engine, sid: int, name: str) -> None:
        self.name = name
        self._adapter = adapter
        self._engine = engine
        self._sid = sid
        #: held while a batch is delivered, so ``stop`` waits for deliveries in progress
        self._delivering = threading.RLock()
        self._state = threading.Lock()
        #: message ids handed out and not settled (a dict used as an ordered set)
        self._inflight: dict[int, None] = {}
        self._on_message: Callable[[Received], None] | None = None
        self._prefetch = 64
        self._started = False
        self._detached = False

    # -- push

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        """Deliver on the engine's dispatcher thread, at most ``prefetch`` unsettled."""
        if self._detached:
            raise AdapterUnavailable(f"subscription {self.name!r} is deleted or closed")
        with self._state:
            self._on_message = on_message
            self._prefetch = max(1, int(prefetch))
            self._started = True
        self._engine.started[self._sid].add(self)
        self._engine.schedule_start(self)

    def stop(self) -> None:
        """Stop delivering and return unsettled messages to the queue (redelivered)."""
        with self._delivering:
            with self._state:
                self._started = False
                mids = sorted(self._inflight)
                self._inflight.clear()
            started = self._engine.started.get(self._sid)
            if started is not None:
                started.discard(self)
        if mids and not self._engine.closed:
            self._engine.settle(self._sid, mids, remove=False)

    def dispatch_round(self, batch: int) -> bool:
        """Deliver one batch; True when more may be waiting (called by the dispatcher)."""
        with self._delivering:
            with self._state:
                if not self._started or self._detached or self._on_message is None:
                    return False
                credit = self._prefetch - len(self._inflight)
                callback = self._on_message
            if credit <= 0:
                return False
            n = min(credit, batch)
            rows = self._engine.fetch(self._sid, n)
            with self._state:
                self._inflight.update(dict.fromkeys(r.mid for r in rows))
            for row in rows:
                if not self._started:
                    break  # stopped from inside the callback: the rest was returned
                try:
                    callback(EmbeddedReceived(self, row))
                except Exception:  # pragma: no cover - core's callback must not raise
                    log.exception("on_message raised for subscription %s", self.name)
            return len(rows) == n

    def _settle(self, mid: int, *, remove: bool) -> None:
        if self._detached:
            return
        self._engine.settle(self._sid, [mid], remove=remove)
        with self._state:
            was = mid in self._inflight
            self._inflight.pop(mid, None)
            started = self._started
        if was and started:
            self._engine.schedule([self])

    # -- pull

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        """Take up to ``max_messages``, oldest first, waiting up to ``timeout`` for one."""
        if self._detached:
            raise AdapterUnavailable(f"subscription {self.name!r} is deleted or closed")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            since = self._engine.arrivals
            rows = self._engine.fetch(self._sid, max_messages)
            if rows:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._engine.closed:
                return []
            self._engine.wait_arrival(since, remaining)
        with self._state:
            self._inflight.update(dict.fromkeys(r.mid for r in rows))
        return [EmbeddedReceived(self, r) for r in rows]

    def take(self, max_messages: int) -> list[Received]:
        """Up to ``max_messages`` ready messages, removed in the transaction that reads
        them (nothing to settle)."""
        if self._detached:
            raise AdapterUnavailable(f"subscription {self.name!r} is deleted or closed")
        rows = self._engine.take(self._sid, max_messages)
        return [EmbeddedReceived(self, r, settled=True) for r in rows]

    # -- admin

    def peek(self, max_messages: int) -> list[StoredMessage]:
        """The first ``max_messages`` ready messages, read in SQLite and left in place
        (handed-out ones are not waiting and not shown)."""
        if self._detached:
            return []
        return [
            StoredMessage(
                topic=row.topic,
                body=row.body,
                headers=row.headers,
                content_type=row.content_type,
                timestamp=datetime.fromtimestamp(published, UTC),
            )
            for row, published in self._engine.peek(self._sid, max_messages)
        ]

    def purge(self) -> int | None:
        """Remove every ready message in one transaction (handed-out ones stay)."""
        if self._detached:
            return 0
        return self._engine.purge(self._sid)

    def depth(self) -> int | None:
        """Ready messages (handed-out ones not counted)."""
        if self._detached:
            return 0
        return self._engine.depth(self._sid)

    def delete(self) -> None:
        """Destroy the subscription and its messages."""
        if self._engine.closed:
            raise AdapterUnavailable("the embedded adapter is closed")
        self._engine.delete_subscription(self.name)
        self.detach()

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Destroy the subscription in the transaction that sends its whole queue to its
        dead-letter topic (``Engine.delete_into_dead_letters``)."""
        if self._engine.closed:
            raise AdapterUnavailable("the embedded adapter is closed")
        sent = self._engine.delete_into_dead_letters(self.name, reason, context)
        self.detach()
        return sent or 0

    def detach(self) -> None:
        """Make this handle inert (subscription deleted or adapter closed)."""
        with self._delivering, self._state:
            self._started = False
            self._detached = True
            self._inflight.clear()

    def __repr__(self) -> str:
        return f"<EmbeddedHandle {self.name!r} started={self._started}>"


class EmbeddedAdapter(Adapter):
    """In-process, SQLite-backed middleware; see :mod:`wsnmom.adapters.embedded`."""

    name = "embedded"
    schemes = (SCHEME,)
    extra = None
    capabilities = Capabilities(
        syntax=EMBEDDED_SYNTAX,
        ack_mode="per_message",
        durable_subscriptions=True,
        native_pull=True,
        retained_current_message=True,
        native_headers=True,
        native_queue_limits=True,
        ordering="subscription",
        competing_consumers=False,
        max_message_bytes=None,
        sole_publisher=True,
        local_queues=True,
        # its queues are in this gateway's data directory (core's orphan sweep)
        own_names=True,
        peek=True,
        # what its limits drop goes to SubscriptionSpec.dead_letters in the same transaction
        native_dead_letters=True,
    )

    declared_options = EmbeddedOptions

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        try:
            path, query = parse_url(url)
        except ValueError as exc:
            raise AdapterOptionError(str(exc)) from None
        super().__init__(url, {**dict(query), **(options or {})})
        #: the options, checked
        self.opts = parse_options(EmbeddedOptions, adapter="embedded", query=query, options=options)
        self.path = path
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._handles: weakref.WeakSet[EmbeddedHandle] = weakref.WeakSet()
        if self.memory:
            # nothing outlives the adapter: say so, so the conformance kit skips durability
            self.capabilities = dataclasses.replace(
                type(self).capabilities, durable_subscriptions=False
            )

    @property
    def memory(self) -> bool:
        """True for ``embedded://:memory:`` (nothing survives ``close``)."""
        return self.path == MEMORY

    def _require(self) -> Engine:
        eng = self._engine
        if eng is None or eng.closed:
            raise AdapterUnavailable("the embedded adapter is not open")
        return eng

    def open(self) -> None:
        """Open (or share) the database of ``PATH``; idempotent."""
        with self._lock:
            if self._engine is None:
                self._engine = acquire_engine(self.path, dataclasses.asdict(self.opts))

    def close(self) -> None:
        """Stop this adapter's handles (unsettled messages return); idempotent."""
        with self._lock:
            eng, self._engine = self._engine, None
        if eng is None:
            return
        for h in list(self._handles):
            h.stop()
            h.detach()
        release_engine(eng)

    def ping(self, timeout: float = 1.0) -> bool:
        """True while open."""
        eng = self._engine
        return eng is not None and eng.ping()

    def available(self) -> bool:
        """True while open (no I/O)."""
        eng = self._engine
        return eng is not None and not eng.closed

    def unavailable_reason(self) -> str | None:
        """Not open, or the last ping's database error (no I/O)."""
        eng = self._engine
        if eng is None or eng.closed:
            return "the embedded adapter is not open"
        return eng.ping_error or None

    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        """Store and route one message; returns after the commit."""
        return self.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        """Store and route ``messages`` in one transaction (one commit)."""
        if not messages:
            return []
        fanouts = self._require().publish_many(messages)
        return [PublishReceipt(routed=f > 0) for f in fanouts]

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        """Create or re-attach to the durable subscription ``spec.name``."""
        eng = self._require()
        st = eng.attach(spec.name, spec.patterns, spec.limits, spec.dead_letters)
        handle = EmbeddedHandle(self, eng, st.id, st.name)
        self._handles.add(handle)
        return handle

    def restoring(self) -> None:
        """Hold back the rounds of handles started during the restore (:mod:`.dispatch`)."""
        if self._engine is not None:
            self._engine.restoring()

    def restored(self) -> None:
        """Schedule the restored handles whose queues hold messages, in one query."""
        if self._engine is not None:
            self._engine.restored()

    def delete_subscription(self, name: str) -> None:
        """Destroy ``name``; idempotent."""
        self._require().delete_subscription(name)

    def current_message(self, topic: Topic) -> StoredMessage | None:
        """The last message published on ``topic`` (kept in the store)."""
        return self._require().current_message(topic)

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """Depths of many subscriptions in one transaction (see ``Engine.depths``)."""
        engine = self._require()
        out: list[int | None] = []
        at: list[int] = []  # where each of ours goes in ``out``
        sids: list[int] = []
        for i, h in enumerate(handles):  # one pass: the overview passes every handle
            if not isinstance(h, EmbeddedHandle):
                out.append(h.depth())
                continue
            out.append(0)
            if h._engine is engine and not h._detached:
                at.append(i)
                sids.append(h._sid)
        for i, depth in zip(at, engine.depths(sids), strict=True):
            out[i] = depth
        return out

    def subscription_names(self) -> list[str]:
        """Names of every durable subscription in the store (diagnostics)."""
        return self._require().subscription_names()

    def __repr__(self) -> str:
        return f"<EmbeddedAdapter {self.url!r} open={self._engine is not None}>"
