"""Core acts on the adapter's capabilities (Core v2): in-order settling for offset and
ordered-ack middleware, a pull buffer where the middleware has no pull, limits the
gateway enforces where the middleware does not, one bulk depth call for the backlog and
the sweep, and the restore hold around recovery.  Run on the file-log reference adapter
(log shape) next to the embedded one (queue shape)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core import metrics
from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.delivery import DeliveryEngine
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService

from tests.support.pull_breach import GraveRefusal
from tests.support.waiting import wait_until

from .conftest import Broker, FakeClock, RecordingOutbound, note, simple, sub_req
from .test_pull_feed_stall import expired_count

FILELOG = "filelog://{tmp}/log?partitions=1"
C = "http://127.0.0.1:9/consumer"
XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"


# --------------------------------------------------------------------------- in-order settle


class _Msg(Received):
    """A received message that records when it is settled."""

    def __init__(self, n: int, log: list[tuple[int, str]], lock: threading.Lock) -> None:
        self.n = n
        self._log = log
        self._lock = lock
        self.body = b"%d" % n
        self.headers = {}
        self.content_type = "application/xml"
        self.redelivered = False

    def ack(self) -> None:
        with self._lock:
            self._log.append((self.n, "ack"))

    def nack(self, requeue: bool = True) -> None:
        with self._lock:
            self._log.append((self.n, "nack"))


class _Handle(SubscriptionHandle):
    name = "h"

    def __init__(self) -> None:
        self.callback: Callable[[Received], None] | None = None

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        self.callback = on_message

    def stop(self) -> None:
        self.callback = None

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        return []

    def depth(self) -> int | None:
        return 0

    def delete(self) -> None:
        return None


@pytest.mark.parametrize("ordered", [False, True])
def test_filtered_messages_wait_for_those_before_them_when_ordered(ordered: bool) -> None:
    """Messages 0..5; odd ones are filtered out; the first send fails once.  An ordered
    channel settles 0..5 in arrival order; an unordered one acks filtered ones at once."""
    settled: list[tuple[int, str]] = []
    lock = threading.Lock()
    sends: list[list[int]] = []
    failed_once = threading.Event()

    def prepare(batch: Sequence[Received]) -> list[int | None]:
        assert all(isinstance(r, _Msg) for r in batch)
        return [None if r.n % 2 else r.n for r in batch]  # type: ignore[attr-defined]

    def send(batch: Sequence[int]) -> None:
        sends.append(list(batch))
        if not failed_once.is_set():
            failed_once.set()
            raise DeliveryFailed("first attempt fails")

    engine = DeliveryEngine(workers=2)
    try:
        from wsnmom.core.delivery import Backoff

        engine.backoff = Backoff(max_attempts=5, initial_delay=0.05, max_delay=0.05)
        handle = _Handle()
        channel = engine.open_channel(
            "c", handle, prepare, send, lambda _reason: None, batch_size=10, ordered=ordered
        )
        channel.start()
        assert handle.callback is not None
        msgs = [_Msg(i, settled, lock) for i in range(6)]
        for m in msgs:
            handle.callback(m)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with lock:
                if len(settled) == 6:
                    break
            time.sleep(0.01)
        with lock:
            order = [n for n, how in settled if how == "ack"]
        assert sorted(order) == list(range(6))
        if ordered:
            assert order == list(range(6))
        else:  # filtered ones are acked at once, before the batch that failed first
            assert order.index(1) < order.index(0) and order.index(5) < order.index(4)
    finally:
        engine.close()


# --------------------------------------------------------------------------- log-shaped broker


@pytest.fixture
def log_broker(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker(adapter_url=FILELOG, limits__max_age=None)


def test_log_push_with_filter_delivers_matching_in_order(
    log_broker: Broker, outbound: RecordingOutbound
) -> None:
    service = log_broker.service
    assert service is not None
    content = ExpressionSource(XPATH, "boolean(/*[@keep='1'])", {})
    service.subscribe(sub_req(C, topic=simple("t:a"), message_content=content))
    items = [note(f'<m keep="{i % 2}">{i}</m>', simple("t:a")) for i in range(10)]
    service.notify(items)
    got = outbound.wait_messages(C, 5)
    assert [d.message.payload for d in got] == [
        f'<m keep="1">{i}</m>'.encode() for i in range(1, 10, 2)
    ]


def test_pull_point_on_a_push_only_adapter_uses_a_pull_buffer(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    assert not service.adapter.capabilities.native_pull
    pp = service.create_pull_point(CreatePullPointRequest())
    assert isinstance(service.registry.pull_points[pp.id].reader, PullBuffer)
    service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:p")))
    service.notify([note(f"<n>{i}</n>", simple("t:p")) for i in range(5)])
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += [m.payload for m in service.get_messages(pp.id, 2 - len(got))]
        time.sleep(0.05)
    assert got == [b"<n>0</n>", b"<n>1</n>"]
    # buffered but not handed out: still in the middleware after a restart
    service = log_broker.restart()
    rest: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(rest) < 3 and time.monotonic() < deadline:
        rest += [m.payload for m in service.get_messages(pp.id, 0)]
        time.sleep(0.05)
    assert rest == [b"<n>2</n>", b"<n>3</n>", b"<n>4</n>"]


@pytest.mark.parametrize(
    ("overflow", "kept"), [("drop_oldest", [7, 8, 9, 10, 11]), ("drop_newest", [0, 1, 2, 3, 4])]
)
def test_gateway_enforces_max_messages_on_a_log(
    make_broker: Callable[..., Broker],
    outbound: RecordingOutbound,
    overflow: str,
    kept: list[int],
) -> None:
    broker = make_broker(
        adapter_url=FILELOG,
        limits__max_age=None,
        limits__max_messages=5,
        limits__overflow=overflow,
    )
    service = broker.service
    assert service is not None
    policy = service.policy().accumulation
    assert policy.enforced_by["max_messages"] == "gateway"
    sub = service.subscribe(sub_req(C, topic=simple("t:l")))
    service.pause(sub.id)
    service.notify([note(f"<n>{i}</n>", simple("t:l")) for i in range(12)])
    handle = service.registry.subscriptions[sub.id].handle
    assert handle is not None
    wait_until(lambda: handle.depth() == 12, 5, what="12 messages held")
    dropped_before = metrics.NOTIFICATIONS_DROPPED._value.get()
    service.sweep()
    assert metrics.NOTIFICATIONS_DROPPED._value.get() - dropped_before == 7
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:l"))])  # the barrier
    got = outbound.wait_messages(C, 6)
    assert [d.message.payload for d in outbound.messages_to(C)] == [
        f"<n>{i}</n>".encode() for i in kept
    ] + [b"<sentinel/>"]
    assert len(got) == 6


def test_gateway_drops_messages_past_max_age_on_a_log(
    make_broker: Callable[..., Broker], outbound: RecordingOutbound, clock: FakeClock
) -> None:
    clock.value = datetime.now(UTC)
    broker = make_broker(adapter_url=FILELOG, limits__max_age=timedelta(minutes=1))
    service = broker.service
    assert service is not None
    sub = service.subscribe(sub_req(C, topic=simple("t:age")))
    service.pause(sub.id)
    service.notify([note("<old/>", simple("t:age"))])
    clock.advance(minutes=5)
    service.notify([note("<young/>", simple("t:age"))])  # published "now" (gateway clock)
    expired_before = metrics.NOTIFICATIONS_EXPIRED._value.get()
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:age"))])  # the barrier
    got = outbound.wait_messages(C, 2)
    # the middleware's timestamp says both are recent in real time, so the gateway's own
    # published-at header is what is compared: only the first is older than max_age
    payloads = [d.message.payload for d in outbound.messages_to(C)]
    assert payloads == [b"<young/>", b"<sentinel/>"], payloads
    assert metrics.NOTIFICATIONS_EXPIRED._value.get() - expired_before == 1
    assert got


def test_a_pushed_message_past_max_age_is_counted_once_however_often_its_dead_letter_is_tried(
    make_broker: Callable[..., Broker], outbound: RecordingOutbound, clock: FakeClock
) -> None:
    """A push subscription's message past max_age whose dead letter is refused twice: its
    channel prepares it again later (``PrepareLater``) until the dead letter is confirmed;
    ``wsnmom_notifications_expired_total`` counts it once.  Before, once per try."""
    clock.value = datetime.now(UTC)
    broker = make_broker(adapter_url=FILELOG, limits__max_age=timedelta(minutes=1))
    service = broker.service
    assert service is not None
    sub = service.subscribe(sub_req(C, topic=simple("t:age")))
    service.pause(sub.id)
    service.notify([note("<old/>", simple("t:age"))])
    clock.advance(minutes=5)
    refusal = GraveRefusal(service, refuse=2)
    expired_before = expired_count()
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:age"))])  # the barrier, behind old
    outbound.wait_messages(C, 1)
    assert [d.message.payload for d in outbound.messages_to(C)] == [b"<sentinel/>"]
    assert refusal.tries >= 3  # refused twice, then tried a third time
    # the third try's publish may still be on its way when the sentinel is delivered
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter of <old/>")
    assert letter.body == b"<old/>" and letter.reason == "max-age"
    assert expired_count() - expired_before == 1


def test_policy_says_who_enforces_limits(
    make_broker: Callable[..., Broker],
) -> None:
    embedded = make_broker().service
    log = make_broker(adapter_url=FILELOG).service
    assert embedded is not None and log is not None
    assert set(embedded.policy().accumulation.enforced_by.values()) == {"middleware"}
    enforced = log.policy().accumulation.enforced_by
    assert enforced["max_messages"] == "gateway" and enforced["max_age"] == "gateway"
    assert enforced["max_bytes"] == "not enforced"


# --------------------------------------------------------------------------- bulk depths


@pytest.mark.parametrize("adapter_url", [None, FILELOG])
def test_backlog_and_sweep_use_one_bulk_depths_call(
    make_broker: Callable[..., Broker], adapter_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(adapter_url=adapter_url, limits__on_full="end", limits__max_age=None)
    service: BrokerService | None = broker.service
    assert service is not None
    for i in range(20):
        service.subscribe(sub_req(f"{C}{i}", topic=simple("t:b")))
    service.create_pull_point(CreatePullPointRequest())
    adapter = service.adapter
    calls: list[int] = []
    real = adapter.depths

    def counting(handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        calls.append(len(handles))
        return real(handles)

    def forbidden(self: Any) -> int | None:
        raise AssertionError("depth() called per subscription")

    monkeypatch.setattr(adapter, "depths", counting)
    for handle in service.registry.handles():
        monkeypatch.setattr(type(handle), "depth", forbidden)
    service._backlog()
    service.sweep()
    assert calls == [21, 21]


# --------------------------------------------------------------------------- restore hold


def test_recovery_tells_the_adapter_before_and_after(
    make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make_broker(adapter_url=FILELOG, limits__max_age=None)
    service = broker.service
    assert service is not None
    service.subscribe(sub_req(C, topic=simple("t:r")))
    events: list[str] = []
    from wsnmom.adapters.filelog.adapter import FileLogAdapter

    for name in ("restoring", "restored", "subscription"):
        real = getattr(FileLogAdapter, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            events.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(FileLogAdapter, name, spy)
    broker.restart()
    assert events[0] == "restoring" and events[-1] == "restored"
    assert "subscription" in events[1:-1]


# --------------------------------------------------------------------------- per instance


def test_capabilities_are_per_instance_and_read_after_open(
    make_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """An adapter may learn its capabilities when it opens (MQTT 3.1.1 and 5 differ per
    connection): it sets them on the instance, the class and other instances keep theirs,
    and a broker built before the adapter opened (a gateway started before its middleware)
    advertises what the open instance does."""
    from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
    from wsnmom.core.store_sqlite import SqliteStore

    class LearnsAtOpen(EmbeddedAdapter):
        def open(self) -> None:
            super().open()
            self.capabilities = dataclasses.replace(
                type(self).capabilities, native_queue_limits=False
            )

    learned = LearnsAtOpen(f"embedded://{tmp_path / 'mw'}")
    other = EmbeddedAdapter(f"embedded://{tmp_path / 'mw2'}")
    broker = make_broker()
    store = SqliteStore(str(tmp_path / "store.db"))
    service = BrokerService(broker.settings, learned, store, broker.outbound, autostart=False)
    try:
        assert set(service.policy().accumulation.enforced_by.values()) == {"middleware"}
        learned.open()
        service.start()
        assert service.policy().accumulation.enforced_by["max_messages"] == "gateway"
        assert EmbeddedAdapter.capabilities.native_queue_limits
        assert other.capabilities.native_queue_limits
    finally:
        service.close()
        store.close()
        learned.close()
