"""The orphan sweep (``core.orphans``): a durable subscription the middleware keeps whose
subscription or pull point is gone from the store is removed once it stayed so for the
grace; a live one, one being made (its durable subscription declared before its record is
stored, as CreatePullPoint does, on any instance), a dead-letter box and another
gateway's are not.  On the embedded adapter, on a single MQTT instance and on MQTT in
cluster mode (two instances on one PostgreSQL store), each on the real middleware.

The sweeps are called directly with a settable monotonic clock: the grace is passed by
setting the clock, not by waiting."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pytest
from wsnmom.core import metrics
from wsnmom.core.adapter import Adapter, QueueLimits, SubscriptionSpec
from wsnmom.core.dead_letter_records import box_name
from wsnmom.core.model import PullPoint
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import PathPattern

from tests.adapters import test_mqtt_cluster as mqtt_cluster
from tests.adapters.test_mqtt_cluster import Instance, session_present
from tests.core.conftest import NS, Broker, concrete, sub_req
from tests.fixtures.server import mqtt_gateway_url
from tests.support.waiting import wait_until

GRACE = 600.0
#: adapters in MQTT cluster mode under a topic prefix of their own: another cluster
cluster = mqtt_cluster.cluster


def _mqtt_url(mqtt_url: str, tag: str | None = None) -> str:
    """An MQTT gateway URL with the broker's directory as its data directory."""
    return mqtt_gateway_url(mqtt_url, tag) + "&data_dir={tmp}/mw"


class Monotonic:
    """A settable monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


def _declare(adapter: Adapter, name: str) -> None:
    """The durable subscription ``name`` on the middleware, with no record in the store
    (as a delete that failed, or a refused Subscribe, leaves it)."""
    adapter.subscription(
        SubscriptionSpec(
            name=name, patterns=(PathPattern(NS, ("orphans", name)),), limits=QueueLimits()
        )
    )


def _clocked(service: BrokerService) -> Monotonic:
    clock = Monotonic()
    service.orphans.clock = clock
    service.orphans.grace = GRACE
    return clock


def _removed() -> float:
    return metrics.ORPHANS_REMOVED._value.get()


def test_an_orphan_is_removed_after_the_grace_and_nothing_else(
    make_broker: Callable[..., Broker], caplog: pytest.LogCaptureFixture
) -> None:
    """Embedded: the orphan survives sweeps within the grace and is removed by the first
    one after it (one log line, the metric); the live subscription, the pull point whose
    record was stored while the grace ran (made as CreatePullPoint makes one: durable
    subscription first) and a dead-letter box stay."""
    broker = make_broker()
    service = broker.service
    assert service is not None
    adapter = broker.adapter
    clock = _clocked(service)
    live = service.subscribe(sub_req(topic=concrete("t:orphans/live")))
    _declare(adapter, "orphan1")
    _declare(adapter, "pp-being-made")
    _declare(adapter, box_name("elsewhere"))
    assert service.orphans.sweep() == []
    clock.value += GRACE / 2
    service.store.put_pull_point(PullPoint("pp-being-made", service.now(), None))
    assert service.orphans.sweep() == []
    assert "orphan1" in adapter.subscription_names()
    before = _removed()
    clock.value += GRACE / 2
    with caplog.at_level(logging.INFO, logger="wsnmom.core.orphans"):
        assert service.orphans.sweep() == ["orphan1"]
    names = adapter.subscription_names()
    assert "orphan1" not in names
    assert {live.id, "pp-being-made", box_name("elsewhere")} <= set(names)
    assert _removed() == before + 1
    lines = [r.getMessage() for r in caplog.records if "orphan1" in r.getMessage()]
    assert len(lines) == 1 and "removed the orphan durable subscription" in lines[0]
    # a name found with a record again starts its grace anew when the record goes
    service.store.delete_pull_point("pp-being-made")
    assert service.orphans.sweep() == []
    clock.value += GRACE
    assert service.orphans.sweep() == ["pp-being-made"]


def test_a_round_stopped_after_its_store_read_does_not_count_the_stop(
    make_broker: Callable[..., Broker],
) -> None:
    """Embedded: a round that reads the list and the store, and is then stopped for a
    grace (SIGSTOP, then SIGCONT) while the pull point being made stores its record,
    keeps that pull point's durable subscription: the stop is not time without a record.
    The clock stands for the stop: its read stores the record and moves a grace on.
    Before, the round read its clock after the store, and removed the live pull point's
    queue."""
    broker = make_broker()
    service = broker.service
    assert service is not None
    adapter = broker.adapter
    clock = _clocked(service)
    _declare(adapter, "pp-made-while-stopped")
    assert service.orphans.sweep() == []  # found without a record: its grace begins
    stopped = False

    def stop() -> float:
        nonlocal stopped
        if not stopped:
            stopped = True
            record = PullPoint("pp-made-while-stopped", service.now(), None)
            service.store.put_pull_point(record)
            clock.value += GRACE
        return clock.value

    service.orphans.clock = stop
    assert service.orphans.sweep() == []
    assert "pp-made-while-stopped" in adapter.subscription_names()
    service.store.delete_pull_point("pp-made-while-stopped")


def test_what_a_follower_left_in_the_middleware_gets_an_intent_the_sweep_finishes(
    make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster mode: another instance ended a subscription and this one, following it,
    left its durable subscription because messages waited in it (RabbitMQ: the other's
    drain into a pull point; ``Adapter.forget_subscription`` answers True).  Core writes
    an intent for the name, so the sweep deletes it once the intent is a grace old:
    before, such a queue (declared here again after the other's delete) stayed for
    ever.  A forget that left nothing writes no intent."""
    broker = make_broker()
    service = broker.service
    assert service is not None
    adapter = broker.adapter
    _declare(adapter, "left-by-forget")
    _declare(adapter, "forgotten")
    answers = {"left-by-forget": True, "forgotten": False}
    monkeypatch.setattr(adapter, "forget_subscription", lambda name: answers[name])
    ctx = service._ctx
    ctx.forget_native("left-by-forget")
    ctx.forget_native("forgotten")
    assert [name for name, _ in service.store.list_intents()] == ["left-by-forget"]
    service.orphans.grace = 0.0
    assert "left-by-forget" in service.orphans.sweep()
    assert "left-by-forget" not in adapter.subscription_names()
    assert service.store.list_intents() == []
    adapter.delete_subscription("forgotten")


@pytest.mark.mqtt
def test_a_single_mqtt_instance_removes_its_orphan_queue(
    make_broker: Callable[..., Broker], mqtt_url: str
) -> None:
    """MQTT, one instance: its queues (the data directory's) are listed; an orphan is
    removed after the grace, a live subscription stays."""
    broker = make_broker(adapter_url=_mqtt_url(mqtt_url))
    service = broker.service
    assert service is not None
    clock = _clocked(service)
    live = service.subscribe(sub_req(topic=concrete("t:orphans/live")))
    _declare(broker.adapter, "orphan1")
    assert service.orphans.sweep() == []
    clock.value += GRACE
    assert service.orphans.sweep() == ["orphan1"]
    assert set(broker.adapter.subscription_names()) & {"orphan1", live.id} == {live.id}


@pytest.mark.mqtt
def test_mqtt_cluster_mode_removes_an_orphan_session_once_and_never_another_gateways(
    postgres_store_url: str,
    make_broker: Callable[..., Broker],
    mqtt_url: str,
    cluster: Callable[[], Instance],
) -> None:
    """MQTT in cluster mode, two instances on one store: the leader alone removes the
    orphan session (and its record) after the grace; the live subscription's session, a
    dead-letter box and the session of another cluster on the same broker (another topic
    prefix) stay.  (``postgres_store_url`` first: its database outlives the brokers.)"""
    url = _mqtt_url(mqtt_url, uuid.uuid4().hex[:10])
    a = make_broker(adapter_url=url, store_url=postgres_store_url)
    b = make_broker(adapter_url=url, store_url=postgres_store_url)
    services = [x.service for x in (a, b) if x.service is not None]
    wait_until(lambda: any(s.cluster.leads() for s in services), 30, what="a leader")
    leader, follower = (a, b) if services[0].cluster.leads() else (b, a)
    assert leader.service is not None and follower.service is not None
    assert not follower.service.cluster.leads()
    clocks = [_clocked(leader.service), _clocked(follower.service)]
    live = follower.service.subscribe(sub_req(topic=concrete("t:orphans/live")))
    _declare(follower.adapter, "orphan1")
    _declare(leader.adapter, box_name("elsewhere"))  # listed by its instance only
    other = cluster()
    other.handle("theirs1")
    assert leader.service.orphans.sweep() == []
    assert follower.service.orphans.sweep() == []
    for clock in clocks:
        clock.value += GRACE
    assert follower.service.orphans.sweep() == []
    assert "orphan1" in leader.adapter.subscription_names()
    assert leader.service.orphans.sweep() == ["orphan1"]
    names = leader.adapter.subscription_names()
    assert "orphan1" not in names and {live.id, box_name("elsewhere")} <= set(names)
    sessions = leader.adapter._cnode.sessions
    assert sessions.recorded(sessions.client_id("orphan1")) is None
    assert not session_present(mqtt_url, sessions.client_id("orphan1"))
    assert other.adapter.subscription_names() == ["theirs1"]
