"""The orphan sweep by intents (``core.orphans``) on the middleware that cannot list its
durable subscriptions, RabbitMQ and Kafka, in one process: a stale intent whose record
exists never costs its subscription anything; an orphan's intent is swept by the leader
of a cluster only; a Subscribe slower than the grace, whose intent was swept while it made
its durable subscription, is refused and leaves nothing behind.

The intents' age is set by writing them with an earlier time (``Store.put_intent``):
nothing waits for the grace.  A process killed between declaring and storing is in
tests/cluster/test_orphan_kill.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from wsnmom.core import errors, metrics
from wsnmom.core.adapter import Adapter, QueueLimits, SubscriptionSpec
from wsnmom.core.model import CreatePullPointRequest, PullPoint, Subscription
from wsnmom.core.service import BrokerService
from wsnmom.core.store import StoreUnavailable
from wsnmom.topic_mapping.model import PathPattern

from tests.core.conftest import NS, Broker, RecordingOutbound, concrete, note, sub_req
from tests.fixtures.server import kafka_gateway_url
from tests.support.rabbitmq_queues import queue_exists
from tests.support.waiting import wait_until

GRACE = 600.0
#: an intent written this long ago is older than the grace
LONG_AGO = timedelta(seconds=2 * GRACE)
CONSUMER = "http://127.0.0.1:9/live"


def _adapter_url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "rabbitmq":
        return str(request.getfixturevalue("rabbitmq_url"))
    return kafka_gateway_url(str(request.getfixturevalue("kafka_url")))


def _declare(adapter: Adapter, name: str) -> None:
    adapter.subscription(
        SubscriptionSpec(
            name=name, patterns=(PathPattern(NS, ("orphans", name)),), limits=QueueLimits()
        )
    )


def _removed() -> float:
    return float(metrics.ORPHANS_REMOVED._value.get())


def _service(broker: Broker) -> BrokerService:
    assert broker.service is not None
    broker.service.orphans.grace = GRACE
    return broker.service


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ],
)
def test_a_stale_intent_whose_record_exists_never_touches_its_subscription(
    kind: str,
    request: pytest.FixtureRequest,
    make_broker: Callable[..., Broker],
    outbound: RecordingOutbound,
) -> None:
    """An intent older than the grace whose subscription's record is stored (written
    again behind the record's back) is removed, and the subscription keeps delivering:
    a notification published after the sweep arrives."""
    broker = make_broker(adapter_url=_adapter_url(kind, request))
    service = _service(broker)
    live = service.subscribe(sub_req(CONSUMER, topic=concrete("t:orphans/live")))
    service.store.put_intent(live.id, datetime.now(UTC) - LONG_AGO)
    before = _removed()
    assert service.orphans.sweep() == []
    assert service.store.list_intents() == [] and _removed() == before
    if kind == "rabbitmq":
        queue = broker.adapter.queue_name(live.id)  # type: ignore[attr-defined]
        assert queue_exists(str(request.getfixturevalue("rabbitmq_url")), queue)
    service.notify([note("<m>after the sweep</m>", concrete("t:orphans/live"))])
    got = outbound.wait_messages(CONSUMER, 1, timeout=30)
    assert [d.message.payload for d in got] == [b"<m>after the sweep</m>"]


@pytest.mark.rabbitmq
def test_only_the_leader_sweeps_an_orphans_intent(
    postgres_store_url: str, make_broker: Callable[..., Broker], rabbitmq_url: str
) -> None:
    """Two instances on one PostgreSQL store: the follower's sweep leaves the orphan's
    intent and queue alone, the leader's deletes the queue (a passive declaration then
    fails with 404) and the intent, once; a younger intent stays.  (``postgres_store_url``
    first: its database outlives the brokers.)"""
    a = make_broker(adapter_url=rabbitmq_url, store_url=postgres_store_url)
    b = make_broker(adapter_url=rabbitmq_url, store_url=postgres_store_url)
    services = [_service(a), _service(b)]
    wait_until(lambda: any(s.cluster.leads() for s in services), 30, what="a leader")
    leader, follower = (a, b) if services[0].cluster.leads() else (b, a)
    lead, follow = _service(leader), _service(follower)
    assert not follow.cluster.leads()
    store = lead.store
    _declare(follower.adapter, "orphan1")
    store.put_intent("orphan1", datetime.now(UTC) - LONG_AGO)
    _declare(follower.adapter, "young1")
    store.put_intent("young1")
    queue = leader.adapter.queue_name("orphan1")  # type: ignore[attr-defined]
    assert follow.orphans.sweep() == []
    assert queue_exists(rabbitmq_url, queue)
    assert [name for name, _ in store.list_intents()] == ["orphan1", "young1"]
    before = _removed()
    assert lead.orphans.sweep() == ["orphan1"]
    assert not queue_exists(rabbitmq_url, queue)
    assert [name for name, _ in store.list_intents()] == ["young1"]
    assert _removed() == before + 1
    assert lead.orphans.sweep() == [] and follow.orphans.sweep() == []
    assert queue_exists(rabbitmq_url, leader.adapter.queue_name("young1"))  # type: ignore[attr-defined]
    follower.adapter.delete_subscription("young1")


@pytest.mark.rabbitmq
def test_a_subscribe_whose_intent_was_swept_meanwhile_is_refused_and_leaves_nothing(
    make_broker: Callable[..., Broker], rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Subscribe slower than the grace: the sweep (grace 0) runs after its queue was
    declared and before its record is written.  The record's write finds no intent, so
    the Subscribe is refused with SubscribeCreationFailed; no record, no intent and no
    queue stay, and the next Subscribe works."""
    broker = make_broker(adapter_url=rabbitmq_url)
    service = _service(broker)
    store: Any = service.store
    real_add = store.add_subscription
    made: list[str] = []

    def late(sub: Subscription) -> None:
        made.append(sub.id)
        assert service.orphans.sweep_intents(0.0) == [sub.id]
        real_add(sub)

    monkeypatch.setattr(store, "add_subscription", late)
    with pytest.raises(errors.SubscribeCreationFailed, match="orphan grace"):
        service.subscribe(sub_req(CONSUMER, topic=concrete("t:orphans/late")))
    monkeypatch.undo()
    (sub_id,) = made
    assert store.get_subscription(sub_id) is None and store.list_intents() == []
    assert not queue_exists(rabbitmq_url, broker.adapter.queue_name(sub_id))  # type: ignore[attr-defined]
    assert sub_id not in service.registry.subscriptions
    again = service.subscribe(sub_req(CONSUMER, topic=concrete("t:orphans/late")))
    assert store.get_subscription(again.id) is not None and store.list_intents() == []


@pytest.mark.rabbitmq
def test_a_single_instance_sweeps_every_intent_at_start(
    make_broker: Callable[..., Broker], rabbitmq_url: str
) -> None:
    """A single instance (SQLite store) left an intent a moment ago, as a process killed
    between declaring and storing does: younger than the grace, the periodic sweep
    leaves it; the restart removes it, and its queue, before serving (no Subscribe can
    be under way then); the live subscription's queue stays."""
    broker = make_broker(adapter_url=rabbitmq_url)
    service = _service(broker)
    live = service.subscribe(sub_req(CONSUMER, topic=concrete("t:orphans/start")))
    name = "killed-" + uuid.uuid4().hex[:12]
    service.store.put_intent(name)
    _declare(broker.adapter, name)
    queue = broker.adapter.queue_name(name)
    assert service.orphans.sweep() == []
    assert queue_exists(rabbitmq_url, queue)
    before = _removed()
    again = broker.restart()
    assert not queue_exists(rabbitmq_url, queue)
    assert again.store.list_intents() == [] and _removed() == before + 1
    assert queue_exists(rabbitmq_url, broker.adapter.queue_name(live.id))
    # an instance of a cluster leaves even a young intent to its leader's sweep
    again.store.put_intent(name)
    assert again.orphans.at_start(shared=True) == []
    assert [n for n, _ in again.store.list_intents()] == [name]
    again.store.delete_intent(name)


@pytest.mark.rabbitmq
def test_a_create_pull_point_whose_record_is_not_stored_leaves_nothing(
    make_broker: Callable[..., Broker], rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreatePullPoint makes its queue before its record, as Subscribe does: a store that
    refuses the record's write (before intents: the queue stayed, an orphan nothing
    named), and an intent swept meanwhile (a CreatePullPoint slower than the grace),
    each leave no record, no intent and no queue; the first is the store's fault
    (ResourceUnavailable, retried by the client), the second UnableToCreatePullPoint."""
    broker = make_broker(adapter_url=rabbitmq_url)
    service = _service(broker)
    store: Any = service.store
    real_add = store.add_pull_point
    made: list[str] = []

    def refused(pp: PullPoint) -> None:
        made.append(pp.id)
        raise StoreUnavailable("connection lost")

    def late(pp: PullPoint) -> None:
        made.append(pp.id)
        assert service.orphans.sweep_intents(0.0) == [pp.id]
        real_add(pp)

    for add, fault in (
        (refused, errors.ResourceUnavailable),
        (late, errors.UnableToCreatePullPoint),
    ):
        monkeypatch.setattr(store, "add_pull_point", add)
        with pytest.raises(fault):
            service.create_pull_point(CreatePullPointRequest(name="orphans-pp"))
        monkeypatch.undo()
        pp_id = made[-1]
        assert store.get_pull_point(pp_id) is None and store.list_intents() == []
        assert pp_id not in service.registry.pull_points
        assert not queue_exists(rabbitmq_url, broker.adapter.queue_name(pp_id))  # type: ignore[attr-defined]
    kept = service.create_pull_point(CreatePullPointRequest(name="orphans-pp"))
    assert store.get_pull_point(kept.id) is not None and store.list_intents() == []
