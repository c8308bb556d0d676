"""Fixtures for service-level tests: the real embedded adapter (SQLite files under
``tmp_path``), a real SQLite store, a controllable clock, and a recording consumer side
(``RecordingOutbound``: the consumer/publisher endpoints, not the middleware)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core.config import Settings, load_settings
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    SoapVersion,
    SubscribeRequest,
    WireVersion,
)
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ownership import Ownership
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.service import BrokerService
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, SIMPLE
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.support.waiting import wait_until

NS = "urn:test:topics"
NSMAP: dict[str | None, str] = {"t": NS}


def simple(text: str, ns: dict[str | None, str] | None = None) -> ExpressionSource:
    return ExpressionSource(SIMPLE, text, dict(ns or NSMAP))


def concrete(text: str, ns: dict[str | None, str] | None = None) -> ExpressionSource:
    return ExpressionSource(CONCRETE, text, dict(ns or NSMAP))


def full(text: str, ns: dict[str | None, str] | None = None) -> ExpressionSource:
    return ExpressionSource(FULL, text, dict(ns or NSMAP))


def note(
    payload: str | bytes,
    topic: ExpressionSource | None = None,
    producer: str | None = None,
) -> InboundNotification:
    body = payload.encode() if isinstance(payload, str) else payload
    return InboundNotification(
        payload=body,
        topic=topic,
        producer_reference=EndpointReference(producer) if producer else None,
    )


def consumer(address: str = "http://127.0.0.1:9/consumer") -> EndpointReference:
    return EndpointReference(address)


def sub_req(address: str = "http://127.0.0.1:9/consumer", **kw: Any) -> SubscribeRequest:
    return SubscribeRequest(consumer=consumer(address), **kw)


def documentation_address(host: str, port: int) -> list[str]:
    """Every name resolves to a documentation address (TEST-NET-1, RFC 5737): these tests
    look nothing up, and their recording outbound port never connects anywhere."""
    return ["192.0.2.1"]


class FakeClock:
    """A settable UTC clock."""

    def __init__(self, start: datetime | None = None) -> None:
        self.value = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.value

    def advance(self, **kw: float) -> None:
        with self._lock:
            self.value += timedelta(**kw)


@dataclass
class Call:
    at: float
    address: str
    messages: list[Delivered]
    use_raw: bool
    soap_version: SoapVersion
    #: the attempt's timeout (seconds)
    timeout: float = 0.0


@dataclass
class RecordingOutbound:
    """Consumer and publisher side of the broker's outbound SOAP calls."""

    down: set[str] = field(default_factory=set)
    #: address -> the failure a delivery to it raises (an HTTP answer: status, Retry-After)
    answers: dict[str, DeliveryFailed] = field(default_factory=dict)
    attempts: list[Call] = field(default_factory=list)
    delivered: list[Call] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    fail_publisher_pause: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    _n: int = 0

    def notify(
        self,
        consumer: EndpointReference,
        soap_version: SoapVersion,
        messages: Sequence[Delivered],
        *,
        use_raw: bool,
        timeout: float,
        wire_version: WireVersion = WireVersion.WSN_13,
    ) -> None:
        at = time.monotonic()
        call = Call(at, consumer.address, list(messages), use_raw, soap_version, timeout)
        with self.cond:
            self.attempts.append(call)
            if consumer.address in self.down:
                self.cond.notify_all()
                raise DeliveryFailed(f"{consumer.address} is down")
            answer = self.answers.get(consumer.address)
            if answer is not None:
                self.cond.notify_all()
                raise answer
            self.delivered.append(call)
            self.cond.notify_all()

    def subscribe(
        self,
        producer: EndpointReference,
        consumer: EndpointReference,
        topics: Sequence[ExpressionSource],
        *,
        timeout: float,
    ) -> EndpointReference:
        with self.cond:
            self._n += 1
            ref = EndpointReference(f"{producer.address}/subscriptions/{self._n}")
            self.events.append(("subscribe", ref.address))
            self.cond.notify_all()
            return ref

    def unsubscribe(self, subscription: EndpointReference, *, timeout: float) -> None:
        with self.cond:
            self.events.append(("unsubscribe", subscription.address))
            self.cond.notify_all()

    def pause(self, subscription: EndpointReference, *, timeout: float) -> None:
        with self.cond:
            if self.fail_publisher_pause:
                raise DeliveryFailed("pause not supported")
            self.events.append(("pause", subscription.address))
            self.cond.notify_all()

    def resume(self, subscription: EndpointReference, *, timeout: float) -> None:
        with self.cond:
            self.events.append(("resume", subscription.address))
            self.cond.notify_all()

    # -- helpers ---------------------------------------------------------------------------
    def messages_to(self, address: str) -> list[Delivered]:
        with self.cond:
            return [m for c in self.delivered if c.address == address for m in c.messages]

    def payloads_to(self, address: str) -> list[bytes]:
        return [d.message.payload for d in self.messages_to(address)]

    def wait(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
        return True

    def wait_messages(self, address: str, n: int, timeout: float = 5.0) -> list[Delivered]:
        """Every message delivered to ``address``, once there are at least ``n``; fails
        the test when fewer came within ``timeout`` seconds."""
        if not self.wait(
            lambda: sum(len(c.messages) for c in self.delivered if c.address == address) >= n,
            timeout,
        ):
            got = len(self.messages_to(address))
            raise AssertionError(f"{got} of {n} message(s) to {address} within {timeout:g} s")
        return self.messages_to(address)


def runtime_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings as ``wsnmom serve`` loads them (no environment), on an embedded middleware
    and a SQLite store under ``tmp_path`` unless ``overrides`` name others."""
    return load_settings(
        None,
        environ={},
        overrides={
            "adapter_url": f"embedded://{tmp_path}/mw",
            "store_url": f"sqlite:///{tmp_path}/store.db",
            **overrides,
        },
    )


def make_settings(**overrides: Any) -> Settings:
    s = Settings()
    s.public_url = "http://broker.test:8080"
    s.retry.initial_delay = timedelta(seconds=0.05)
    s.retry.multiplier = 2.0
    s.retry.max_delay = timedelta(seconds=0.2)
    s.retry.max_attempts = 3
    s.retry.timeout = 1.0
    s.delivery.workers = 4
    s.termination.sweep_interval = timedelta(seconds=3600)
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        if name:
            setattr(getattr(s, section), name, value)
        else:
            setattr(s, key, value)
    return s


@dataclass
class Broker:
    """A broker under test plus what is needed to restart it on the same data."""

    tmp: Path
    outbound: RecordingOutbound
    clock: FakeClock
    settings: Settings
    topic_set_factory: Callable[[], TopicSet]
    service: BrokerService | None = None
    adapter: Any = None
    #: a ``PluginManager`` whose observer hooks the service calls (None: none)
    plugins: Any = None
    #: adapter URL template (``{tmp}`` = the broker's directory); default embedded
    adapter_url: str | None = None
    #: resolves names for the outbound policy (None: ``documentation_address``)
    resolver: Any = None
    #: the store (None: a SQLite file in ``tmp``); a PostgreSQL one makes it a cluster's
    #: instance, following the store
    store_url: str | None = None

    def start(self) -> BrokerService:
        if self.adapter_url is None:
            self.adapter = EmbeddedAdapter(f"embedded://{self.tmp / 'mw'}")
        else:
            from wsnmom.core.plugins import resolve

            url = self.adapter_url.format(tmp=self.tmp)
            self.adapter = resolve(url)(url)
        self.adapter.open()
        store = (
            SqliteStore(str(self.tmp / "store.db"))
            if self.store_url is None
            else open_store(self.store_url, instance_id=self.tmp.name)
        )
        self.service = BrokerService(
            self.settings,
            self.adapter,
            store,
            self.outbound,
            topic_set=self.topic_set_factory(),
            clock=self.clock,
            demand_interval=0.2,
            plugins=self.plugins,
            outbound_policy=OutboundPolicy(
                self.settings.outbound, resolver=self.resolver or documentation_address
            ),
        )
        return self.service

    def stop(self) -> None:
        if self.service is not None:
            self.service.close()
            self.service.store.close()
            self.service = None
        if self.adapter is not None:
            self.adapter.close()
            self.adapter = None

    def restart(self) -> BrokerService:
        self.stop()
        return self.start()


@pytest.fixture
def outbound() -> RecordingOutbound:
    return RecordingOutbound()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_broker(
    tmp_path: Path, outbound: RecordingOutbound, clock: FakeClock
) -> Iterator[Callable[..., Broker]]:
    brokers: list[Broker] = []

    def make(
        topic_set: Callable[[], TopicSet] | None = None,
        *,
        plugins: Any = None,
        adapter_url: str | None = None,
        resolver: Any = None,
        soap: Any = None,
        store_url: str | None = None,
        **overrides: Any,
    ) -> Broker:
        """``soap``: the outbound SOAP port (default: the recording one)."""
        b = Broker(
            tmp_path / f"b{len(brokers)}",
            soap if soap is not None else outbound,
            clock,
            make_settings(**overrides),
            topic_set or (lambda: TopicSet(fixed=False)),
            plugins=plugins,
            adapter_url=adapter_url,
            resolver=resolver,
            store_url=store_url,
        )
        brokers.append(b)
        b.start()
        return b

    yield make
    for b in brokers:
        b.stop()


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker()


@pytest.fixture
def service(broker: Broker) -> BrokerService:
    assert broker.service is not None
    return broker.service


@pytest.fixture
def ownership(service: BrokerService) -> Iterator[Ownership]:
    """An ``Ownership`` on ``service`` that the test drives (``gained``, ``lost``,
    ``reconcile``); closed at the end, which ends its opener threads (left open, each
    test left :data:`~wsnmom.core.ownership.OPEN_AT_ONCE` idle threads behind)."""
    made = Ownership(service._ctx, service.subscriptions)
    yield made
    made.close()


def _unsettled(handle: Any) -> int:
    """Messages a subscription's middleware still holds for it: waiting (not handed out)
    plus handed out and not yet settled (acked or requeued).  Counted from the adapter's
    own bookkeeping, so a message that core took from the middleware and is still
    preparing, filtering or sending counts too (``Channel.held`` misses a batch in
    ``prepare``)."""
    from wsnmom.adapters.embedded.adapter import EmbeddedHandle
    from wsnmom.adapters.logbase.cursor import CursorHandle

    if isinstance(handle, EmbeddedHandle):
        # a dispatch round holds ``_delivering`` from taking rows out of the store until
        # they are in ``_inflight``: not counted twice, nor missed in between
        with handle._delivering:
            waiting = handle.depth() or 0
            with handle._state:
                return waiting + len(handle._inflight)
    if isinstance(handle, CursorHandle):
        # the head hands a record out (``unsettled``) under the engine's lock
        with handle._cursor.engine.lock:
            return (handle.depth() or 0) + handle._cursor.unsettled
    raise TypeError(f"wait_idle cannot count what {handle!r} holds")


def _sync_heads(service: BrokerService, timeout: float) -> None:
    """On a log adapter: wait until its head reader has read every record published so far
    and handed it to the cursors that want it (after this, ``_unsettled`` counts it)."""
    from wsnmom.adapters.logbase.cursor import CursorHandle

    engines = {
        id(state.handle._cursor.engine): state.handle._cursor.engine
        for state in list(service.registry.subscriptions.values())
        if isinstance(state.handle, CursorHandle)
    }
    for engine in engines.values():
        with engine.lock:
            engine._sync_head_locked(timeout)


def wait_idle(service: BrokerService, timeout: float = 10.0) -> None:
    """Wait until every active subscription has settled everything published to it so
    far: its middleware holds nothing for it, neither waiting nor handed out (so nothing
    is on its way to a consumer), and the delivery engine holds nothing in memory.

    Exact, not a quiet period: the messages were routed when ``notify`` returned (the
    embedded store routes in the publishing transaction; a log's head reader is synced
    first), and a message counts until core settles it, after its consumer answered.
    Paused and routed subscriptions (no channel, or an inactive one) are not waited for."""

    def idle() -> bool:
        if service.engine.held() > 0:
            return False
        for state in list(service.registry.subscriptions.values()):
            channel = service.engine.channel(state.record.id)
            if channel is None or not channel.active or state.handle is None:
                continue
            if channel.held() > 0 or _unsettled(state.handle) > 0:
                return False
        return True

    _sync_heads(service, timeout)
    wait_until(idle, timeout, what="every active subscription to settle what it holds")
