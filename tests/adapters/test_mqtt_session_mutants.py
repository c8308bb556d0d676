"""The settling code of the MQTT adapter's session, driven without a broker: what the
worker stores, in which order it acknowledges (only after the commit, only on the
connection a message came on), what it drops (retained copies, twins through a second
filter, QoS 0 beyond the backlog) and how it retries a refusing store.

The worker's batch (``Session._process``) is called directly with paho-like messages and
a recording client; these tests kill the mutants of that code in
``adapters/mqtt/ingest.py``, ``session.py`` and ``barriers.py`` (``make mutation``).  The
session against a real Mosquitto is covered by tests/adapters/test_mqtt.py,
test_mqtt_attach.py and the MQTT conformance run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from wsnmom.adapters.mqtt import ingest
from wsnmom.adapters.mqtt.barriers import sentinel_topic
from wsnmom.adapters.mqtt.config import MqttSettings
from wsnmom.adapters.mqtt.inbox import _Acked, _Barrier, _Connected, _Removed, _SentinelRefused
from wsnmom.adapters.mqtt.ingest import _topic_of
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.adapters.mqtt.session import Session
from wsnmom.adapters.mqtt.state import SessionState
from wsnmom.adapters.mqtt.taps import Arrival, Tap, Taps
from wsnmom.core.adapter import AdapterUnavailable, OutboundMessage


class Store:
    """The queue store: records each committed batch; refuses while ``refusals`` last."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self.refusals: list[Exception] = []
        self.closed = False
        self.journal: list[Any] | None = None

    def publish_many(self, messages: list[OutboundMessage]) -> None:
        if self.refusals:
            raise self.refusals.pop(0)
        self.batches.append([m.body for m in messages])
        if self.journal is not None:
            self.journal.append(("store", [m.body for m in messages]))


class Client:
    def __init__(self, journal: list[Any]) -> None:
        self.journal = journal

    def ack(self, mid: int, qos: int) -> None:
        self.journal.append(("ack", mid, qos))

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        self.journal.append(("publish", topic, payload, qos))

    def subscribe(self, topic: str, **options: Any) -> tuple[int, int]:
        self.journal.append(("subscribe", topic))
        return 0, 99

    def unsubscribe(self, topic: str) -> tuple[int, int]:
        self.journal.append(("unsubscribe", topic))
        return 0, sum(e[0] == "unsubscribe" for e in self.journal)


def msg(
    mid: int,
    payload: bytes = b"<m/>",
    *,
    qos: int = 1,
    retain: bool = False,
    ids: list[int] | None = None,
    topic: str = "a/b",
    user: list[tuple[str, str]] | None = None,
    content_type: str | None = None,
) -> Any:
    props = SimpleNamespace(SubscriptionIdentifier=ids, UserProperty=user, ContentType=content_type)
    return SimpleNamespace(
        mid=mid, qos=qos, retain=retain, dup=False, topic=topic, payload=payload, properties=props
    )


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(ingest, "_RETRY_DELAY", 0.0)
    journal: list[Any] = []
    store = Store()
    store.journal = journal
    settings = MqttSettings(host="127.0.0.1", port=1, qos0_backlog=2, ingest_batch=3)
    s = Session(
        settings,
        "t",
        store,
        MqttMapping({}),
        SessionState(str(tmp_path)),  # type: ignore[arg-type]
    )
    s.link = SimpleNamespace(client=Client(journal))  # type: ignore[assignment]
    return SimpleNamespace(session=s, store=store, journal=journal)


def arrived(rig: Any, *messages: Any, generation: int = 0) -> None:
    rig.session._process([(generation, m) for m in messages])


def test_messages_are_stored_in_one_batch_before_their_pubacks_in_arrival_order(
    rig: Any,
) -> None:
    arrived(rig, msg(7, b"<a/>"), msg(8, b"<b/>"), msg(9, b"<c/>", qos=2))
    assert rig.journal == [
        ("store", [b"<a/>", b"<b/>", b"<c/>"]),
        ("ack", 7, 1),
        ("ack", 8, 1),
        ("ack", 9, 2),
    ]
    st = rig.session.stats
    assert (st.received, st.committed, st.batches) == (3, 3, 1)


def test_qos0_is_stored_and_never_acknowledged(rig: Any) -> None:
    arrived(rig, msg(0, b"<a/>", qos=0), msg(5, b"<b/>"))
    assert rig.journal == [("store", [b"<a/>", b"<b/>"]), ("ack", 5, 1)]


def test_a_retained_message_is_acknowledged_and_dropped(rig: Any) -> None:
    arrived(rig, msg(1, b"<old/>", retain=True), msg(2, b"<new/>"))
    assert rig.journal == [("store", [b"<new/>"]), ("ack", 1, 1), ("ack", 2, 1)]
    assert rig.session.stats.dropped_retained == 1
    arrived(rig, msg(3, b"<older/>", retain=True))
    assert rig.session.stats.dropped_retained == 2
    assert rig.session.stats.committed == 1


def test_only_dropped_messages_store_nothing_but_are_acknowledged(rig: Any) -> None:
    arrived(rig, msg(1, retain=True))
    assert rig.journal == [("ack", 1, 1)]
    assert rig.session.stats.batches == 0


def test_pubacks_of_an_older_connection_are_not_sent(rig: Any) -> None:
    rig.session._generation = 2
    arrived(rig, msg(1, b"<a/>"), generation=1)
    arrived(rig, msg(2, b"<b/>"), generation=2)
    assert rig.journal == [("store", [b"<a/>"]), ("store", [b"<b/>"]), ("ack", 2, 1)]


def test_a_lost_connection_bumps_the_generation_and_fails_waiting_barriers(rig: Any) -> None:
    s = rig.session
    barrier = _Barrier(lambda: "ran")
    s._unacked_barriers.append(barrier)
    s._sub_mids[1] = ("a", 1)
    s._disconnected_cb()
    assert s._generation == 1
    s._disconnected_cb()
    assert s._generation == 2
    assert s._sub_mids == {}
    assert barrier.done.is_set()
    assert isinstance(barrier.error, AdapterUnavailable)
    assert barrier.action() is None
    assert s._unacked_barriers == []


def sent(rig: Any, barrier: _Barrier, mid: int) -> Any:
    """Send ``barrier``; the sentinel message the broker sends back (as ``mid``)."""
    rig.session._send_barrier(barrier)
    kind, topic, token, qos = rig.journal.pop()
    assert (kind, topic, qos) == ("publish", rig.session.sentinel_topic, 1)
    rig.journal[:] = [e for e in rig.journal if e[0] != "subscribe"]
    return msg(mid, token, topic=topic)


def test_the_first_barrier_of_a_connection_subscribes_the_sentinel_topic_first(
    rig: Any,
) -> None:
    s = rig.session
    for _ in range(2):
        s._send_barrier(_Barrier(lambda: None))
    s._disconnected_cb()
    s._send_barrier(_Barrier(lambda: None))
    assert [e[:2] for e in rig.journal] == [
        ("subscribe", s.sentinel_topic),
        ("publish", s.sentinel_topic),
        ("publish", s.sentinel_topic),
        ("subscribe", s.sentinel_topic),
        ("publish", s.sentinel_topic),
    ]


def test_a_refused_sentinel_topic_falls_back_to_unsuback_barriers(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from wsnmom.adapters.mqtt.link import PacketTypes, ReasonCode

    s = rig.session
    waiting = _Barrier(lambda: "first")
    s._unacked_barriers.append(waiting)
    s._send_barrier(waiting)
    granted = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1")  # type: ignore[no-untyped-call]
    refused = ReasonCode(PacketTypes.SUBACK, "Not authorized")  # type: ignore[no-untyped-call]
    with caplog.at_level(logging.ERROR, "wsnmom.adapters.mqtt"):
        s._subscribe_cb(None, None, 99, [granted], None)
        assert s._inbox.empty()
        s._subscribe_cb(None, None, 99, [refused], None)
        s._process([s._inbox.get()])
        s._process([_SentinelRefused("again")])  # logged and resent once
    assert caplog.text.count("sentinel topic") == 1
    assert s.stats.refused_filters == {}
    later = _Barrier(lambda: "second")
    s._send_barrier(later)
    assert [e[:2] for e in rig.journal] == [
        ("subscribe", s.sentinel_topic),
        ("publish", s.sentinel_topic),
        ("unsubscribe", "wsnmom/barrier"),  # the waiting one, sent again
        ("unsubscribe", "wsnmom/barrier"),
    ]
    assert s._barriers == {}
    s._unsubscribe_cb(None, None, 1, [], None)
    s._unsubscribe_cb(None, None, 2, [], None)
    assert s._unacked_barriers == []
    s._process([(0, msg(1, b"<a/>")), s._inbox.get(), s._inbox.get()])
    assert (waiting.result, later.result) == ("first", "second")
    assert rig.store.batches == [[b"<a/>"]]


def test_a_refused_sentinel_publish_is_handed_to_the_worker(rig: Any) -> None:
    from wsnmom.adapters.mqtt.link import PacketTypes, ReasonCode

    s = rig.session
    ok = ReasonCode(PacketTypes.PUBACK, "Success")  # type: ignore[no-untyped-call]
    refused = ReasonCode(PacketTypes.PUBACK, "Not authorized")  # type: ignore[no-untyped-call]
    s._publish_cb(None, None, 1, ok, None)
    assert s._inbox.empty()
    s._publish_cb(None, None, 2, refused, None)
    assert s._inbox.get() == _SentinelRefused("Not authorized")


def test_an_unsuback_barrier_runs_after_everything_before_it_is_stored(rig: Any) -> None:
    seen: list[Any] = []
    barrier = _Barrier(lambda: seen.append(list(rig.store.batches)) or "done")
    rig.session._process([(0, msg(1, b"<a/>")), barrier, (0, msg(2, b"<b/>"))])
    assert seen == [[[b"<a/>"]]]
    assert barrier.result == "done" and barrier.done.is_set()
    assert rig.store.batches == [[b"<a/>"], [b"<b/>"]]


def test_a_barrier_runs_after_everything_before_its_sentinel_is_stored(rig: Any) -> None:
    seen: list[Any] = []
    barrier = _Barrier(lambda: seen.append(list(rig.store.batches)) or "done")
    s = rig.session
    s._unacked_barriers.append(barrier)
    sentinel = sent(rig, barrier, 5)
    s._process([(0, msg(1, b"<a/>")), (0, sentinel), (0, msg(2, b"<b/>"))])
    assert seen == [[[b"<a/>"]]]
    assert barrier.result == "done" and barrier.error is None
    assert barrier.done.is_set()
    assert s._unacked_barriers == [] and s._barriers == {}
    assert rig.store.batches == [[b"<a/>"], [b"<b/>"]]  # the sentinel is not stored
    assert rig.journal[-3:] == [("ack", 1, 1), ("ack", 5, 1), ("ack", 2, 1)]
    assert (s.stats.received, s.stats.committed) == (2, 2)


def test_a_sentinel_without_its_barrier_is_acknowledged_and_dropped(rig: Any) -> None:
    ran: list[str] = []
    barrier = _Barrier(lambda: ran.append("ran"))
    sentinel = sent(rig, barrier, 5)
    rig.session._process([(0, sentinel), (0, sentinel)])  # the second: a copy
    assert ran == ["ran"]
    rig.session._process([(0, msg(6, b"other-run:0", topic=rig.session.sentinel_topic))])
    assert ran == ["ran"]
    assert rig.store.batches == []
    assert rig.journal == [("ack", 5, 1), ("ack", 5, 1), ("ack", 6, 1)]
    assert rig.session.stats.received == 0


def test_each_barrier_has_its_own_token(rig: Any) -> None:
    first = sent(rig, _Barrier(lambda: 1), 1)
    second = sent(rig, _Barrier(lambda: 2), 2)
    assert first.payload != second.payload


def test_a_sentinel_topic_is_one_level_per_client_id() -> None:
    assert sentinel_topic("", "gw-1") == "wsnmom/sentinel/gw-1"
    assert sentinel_topic("pre/", "a/b+c#\x00") == "pre/wsnmom/sentinel/a_b_c__"
    assert sentinel_topic("", "") == "wsnmom/sentinel/_"


def test_a_failing_barrier_keeps_its_error(rig: Any) -> None:
    def boom() -> None:
        raise KeyError("x")

    barrier = _Barrier(boom)
    rig.session._process([(0, sent(rig, barrier, 1))])
    assert isinstance(barrier.error, KeyError)
    assert barrier.done.is_set()


def test_acknowledged_filters_are_recorded_after_the_batch(rig: Any) -> None:
    recorded: list[Any] = []
    rig.session.state.update = lambda added, removed: recorded.append((added, removed))
    rig.session._process([_Acked("a/#", 3), (0, msg(1)), _Removed("b/#", 2)])
    assert recorded == [([("a/#", 3)], [("b/#", 2)])]
    rig.session._process([(0, msg(2))])
    assert len(recorded) == 1
    rig.session._process([_Acked("c/#", 4)])
    rig.session._process([_Removed("a/#", 3)])
    assert recorded[1:] == [([("c/#", 4)], []), ([], [("a/#", 3)])]


def test_a_failing_filter_record_does_not_stop_the_acks(rig: Any) -> None:
    def boom(added: Any, removed: Any) -> None:
        raise OSError("disk")

    rig.session.state.update = boom
    rig.session._process([_Acked("a/#", 3), (0, msg(1))])
    assert rig.journal[-1] == ("ack", 1, 1)


# -- twins -----------------------------------------------------------------------------------
def test_a_copy_through_a_second_filter_is_dropped_but_acknowledged(rig: Any) -> None:
    arrived(rig, msg(1, b"<a/>", ids=[1]), msg(2, b"<a/>", ids=[2]))
    assert rig.journal == [("store", [b"<a/>"]), ("ack", 1, 1), ("ack", 2, 1)]
    assert rig.session.stats.dropped_twins == 1


def test_three_overlapping_filters_drop_two_copies(rig: Any) -> None:
    arrived(rig, msg(1, ids=[1]), msg(2, ids=[2]), msg(3, ids=[3]))
    assert rig.session.stats.dropped_twins == 2
    assert rig.store.batches == [[b"<m/>"]]


def test_the_same_message_published_twice_comes_through_a_filter_already_seen(
    rig: Any,
) -> None:
    arrived(rig, msg(1, ids=[1]), msg(2, ids=[2]), msg(3, ids=[1]))
    assert rig.store.batches == [[b"<m/>", b"<m/>"]]
    assert rig.session.stats.dropped_twins == 1


@pytest.mark.parametrize(
    "other",
    [
        msg(2, b"<other/>", ids=[2]),
        msg(2, ids=[2], topic="a/c"),
        msg(2, ids=[2], user=[("k", "v")]),
        msg(2, ids=[2], content_type="text/plain"),
    ],
)
def test_a_different_message_is_no_twin(rig: Any, other: Any) -> None:
    arrived(rig, msg(1, ids=[1]), other)
    assert rig.session.stats.dropped_twins == 0
    assert len(rig.store.batches[0]) == 2


def test_without_subscription_identifiers_nothing_is_a_twin(rig: Any) -> None:
    arrived(rig, msg(1), msg(2))
    arrived(rig, msg(3, b"<x/>", ids=[1]), msg(4, b"<x/>"), msg(5, b"<x/>", ids=[2]))
    no_props = msg(6, b"<y/>")
    no_props.properties = None
    arrived(rig, msg(7, b"<y/>", ids=[1]), no_props, msg(8, b"<y/>", ids=[2]))
    assert rig.session.stats.dropped_twins == 0


def test_a_reconnect_forgets_the_previous_message(rig: Any) -> None:
    s = rig.session
    s._reconcile = lambda connected: None
    arrived(rig, msg(1, ids=[1]))
    s._process([_Connected(True, False), (0, msg(2, ids=[2]))])
    assert s.stats.dropped_twins == 0


def test_topic_of_a_name_that_is_not_utf8_is_empty() -> None:
    class Bad:
        @property
        def topic(self) -> str:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")

    assert _topic_of(Bad()) == ""
    assert _topic_of(SimpleNamespace(topic="x/y")) == "x/y"


def test_conversion_keeps_body_headers_and_content_type(rig: Any) -> None:
    arrival = rig.session._convert(
        msg(1, b"plain", user=[("k", "v"), ("k", "w")], content_type="text/plain")
    )
    assert arrival.name == "a/b"
    assert (arrival.message.body, arrival.message.content_type) == (b"plain", "text/plain")
    assert arrival.message.headers == {"k": "v"}
    assert arrival.redelivered is False


# -- QoS 0 backlog ---------------------------------------------------------------------------
def test_qos0_beyond_the_backlog_is_dropped_with_one_warning(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    s = rig.session
    with caplog.at_level(logging.WARNING, logger="wsnmom.adapters.mqtt"):
        for mid in range(6):
            s._message_cb(None, None, msg(mid, qos=0))
        s._message_cb(None, None, msg(9, qos=1))
    assert s.backlog() == 4  # 3 QoS 0 taken (backlog 2: taken while at most 2 wait), 1 QoS 1
    assert s.stats.dropped_qos0 == 3
    assert len([r for r in caplog.records if "dropping QoS 0" in r.getMessage()]) == 1


def test_arrivals_carry_the_connection_generation(rig: Any) -> None:
    s = rig.session
    s._generation = 4
    m = msg(1)
    s._message_cb(None, None, m)
    assert s._inbox.get_nowait() == (4, m)


# -- storing and taps ------------------------------------------------------------------------
def test_a_refusing_store_is_retried_until_it_takes_the_batch(rig: Any) -> None:
    rig.store.refusals += [RuntimeError("busy"), AdapterUnavailable("locked")]
    arrived(rig, msg(1, b"<a/>"))
    assert rig.journal == [("store", [b"<a/>"]), ("ack", 1, 1)]


def test_a_stopping_session_gives_up_storing_and_acknowledges_nothing(rig: Any) -> None:
    rig.session._stopping = True
    rig.store.refusals.append(RuntimeError("busy"))
    with pytest.raises(RuntimeError):
        arrived(rig, msg(1))
    assert rig.journal == []


def test_a_closed_store_is_not_retried(rig: Any) -> None:
    rig.store.closed = True
    rig.store.refusals.append(AdapterUnavailable("closed"))
    with pytest.raises(AdapterUnavailable):
        arrived(rig, msg(1))
    assert rig.journal == []


def test_an_unavailable_store_of_a_stopping_session_is_not_retried(rig: Any) -> None:
    rig.session._stopping = True
    rig.store.refusals.append(AdapterUnavailable("gone"))
    with pytest.raises(AdapterUnavailable):
        arrived(rig, msg(1))


def test_taps_get_the_batch_after_the_store_and_before_the_acks(rig: Any) -> None:
    def sink(arrivals: Sequence[Arrival]) -> None:
        rig.journal.append(("tap", [a.message.body for a in arrivals]))

    rig.session.taps = Taps([Tap("t1", None, sink)])
    arrived(rig, msg(1, b"<a/>"))
    assert rig.journal == [("store", [b"<a/>"]), ("tap", [b"<a/>"]), ("ack", 1, 1)]


def test_a_session_of_taps_only_hands_them_the_batch(rig: Any) -> None:
    got: list[Any] = []
    rig.session.engine = None
    rig.session.taps = Taps([Tap("t1", None, lambda arrivals: got.extend(arrivals))])
    arrived(rig, msg(1, b"<a/>"))
    assert [a.message.body for a in got] == [b"<a/>"]
    assert rig.journal == [("ack", 1, 1)]
    assert rig.session.stats.committed == 1


def test_a_failing_tap_of_a_stopping_session_is_not_retried(rig: Any) -> None:
    def sink(arrivals: Sequence[Arrival]) -> None:
        raise OSError("sink down")

    rig.session.taps = Taps([Tap("t1", None, sink)])
    rig.session._stopping = True
    with pytest.raises(OSError):
        arrived(rig, msg(1, b"<a/>"))
    assert ("ack", 1, 1) not in rig.journal


def test_counts_accumulate_over_batches(rig: Any) -> None:
    arrived(rig, msg(1), msg(2))
    arrived(rig, msg(3))
    st = rig.session.stats
    assert (st.received, st.committed, st.batches) == (3, 3, 2)


def test_a_refusing_store_is_reported_once_per_batch(
    rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig.store.refusals += [RuntimeError("busy"), RuntimeError("busy"), RuntimeError("busy")]
    with caplog.at_level(logging.ERROR, logger="wsnmom.adapters.mqtt"):
        arrived(rig, msg(1, b"<a/>"))
    reports = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(reports) == 1
    assert rig.journal == [("store", [b"<a/>"]), ("ack", 1, 1)]
