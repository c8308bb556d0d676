"""``quotas.ad_hoc_topics`` at service level (docs/security.md, "Topics: a notifier inventing
them"): the bound refuses *new requests* naming a new topic; it never consumes room for a
request refused for another reason (an ACL, a missing registration), and it never
destroys what was accepted before (a restart restores every subscription and
registration, whatever the bound is now)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from wsnmom.core import errors
from wsnmom.core.access import Principal, bound_principal
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    NotificationMessage,
    RegisterPublisherRequest,
    SubscriptionState,
)
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.support.waiting import wait_until

from .conftest import NS, Broker, concrete, make_settings, note, simple, sub_req

#: may notify (and register) only on t:sensors/room1
SENSOR = Principal("sensor", notify=(PathPattern(NS, ("sensors", "room1")),), method="basic")
PRODUCER = "http://127.0.0.1:9/producer"


def _refused_notify(s: BrokerService) -> None:
    s.notify([note("<x/>", concrete("t:elsewhere"))])


def _refused_pull_point_notify(s: BrokerService) -> None:
    """A Notify to a pull point: its first message on the allowed new topic, its second on
    one the ACL refuses (the first is checked, not admitted)."""
    pp = s.create_pull_point(CreatePullPointRequest())
    s.notify_pull_point(
        pp.id,
        [note("<ok/>", concrete("t:sensors/room1")), note("<x/>", concrete("t:elsewhere"))],
    )


def _refused_register(s: BrokerService) -> None:
    s.register_publisher(RegisterPublisherRequest(None, (concrete("t:elsewhere"),)))


def _refused_end_topic(s: BrokerService) -> None:
    s.subscribe(sub_req(topic=simple("t:sensors"), subscription_end_topic=simple("t:ends")))


@pytest.mark.parametrize(
    ("refused", "fault"),
    [
        (_refused_notify, errors.NotificationRefused),
        (_refused_pull_point_notify, errors.NotificationRefused),
        (_refused_register, errors.PublisherRegistrationRejected),
        (_refused_end_topic, errors.NotificationRefused),
    ],
    ids=["notify", "pull-point-notify", "register", "end-topic"],
)
def test_a_request_the_acl_refuses_takes_no_room_under_the_bound(
    make_broker: Callable[..., Broker],
    refused: Callable[[BrokerService], None],
    fault: type[errors.WsnError],
) -> None:
    """Bound 1: an identity's request on a topic its notify ACL does not cover is refused
    by the ACL and admits nothing, so its allowed new topic still fits (before, the
    refused request admitted its topic first: any identity allowed to call Notify at all
    could fill the bound and lock every other notifier out of new topics)."""
    s = make_broker(quotas__ad_hoc_topics=1).service
    assert s is not None
    with bound_principal(SENSOR):
        for _ in range(3):
            with pytest.raises(fault):
                refused(s)
        s.notify([note("<ok/>", concrete("t:sensors/room1"))])  # the bound's one new topic
    with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
        s.notify([note("<x/>", concrete("t:another"))])  # (no ACL here: the bound refuses)
    assert s.topic_set.grown == 1


def test_an_unregistered_notify_takes_no_room_under_the_bound(
    make_broker: Callable[..., Broker],
) -> None:
    """``requires_registration``: a Notify from a producer not registered for its topic is
    refused (PublisherRegistrationRejected) and admits nothing; the registration of a
    new topic then still fits under a bound of 1."""
    s = make_broker(quotas__ad_hoc_topics=1, requires_registration=True).service
    assert s is not None
    for _ in range(3):
        with pytest.raises(errors.PublisherRegistrationRejected):
            s.notify([note("<x/>", simple("t:unregistered"), PRODUCER)])
    s.register_publisher(RegisterPublisherRequest(EndpointReference(PRODUCER), (simple("t:r"),)))
    s.notify([note("<ok/>", simple("t:r"), PRODUCER)])
    assert s.topic_set.grown == 1


def test_a_restart_under_a_lower_bound_keeps_every_subscription_and_registration(
    make_broker: Callable[..., Broker],
) -> None:
    """Resources made under one bound are restored under a lower one (an operator
    tightening ``quotas.ad_hoc_topics``, down to 0: declared topics only): their topics
    are admitted again, never refused; only new topics are.  Before, recovery admitted a
    SubscriptionEnd topic or a registration's topic under the bound: past it the
    subscription was ended ("filter no longer valid") and the registration deleted."""
    b = make_broker()
    s = b.service
    assert s is not None
    sub = s.subscribe(sub_req(topic=simple("t:a"), subscription_end_topic=simple("t:ends")))
    reg = s.register_publisher(RegisterPublisherRequest(None, (simple("t:registered"),)))
    b.settings = make_settings(quotas__ad_hoc_topics=0)
    s = b.restart()
    assert s.get_subscription(sub.id).state is SubscriptionState.ACTIVE
    assert s.get_registration(reg.id).topics[0].text == "t:registered"
    s.notify([note("<ok/>", simple("t:registered"))])  # restored: a member again
    with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
        s.notify([note("<x/>", simple("t:new"))])


@pytest.mark.rabbitmq
def test_an_instance_at_its_bound_follows_what_another_accepted(
    postgres_store_url: str, make_broker: Callable[..., Broker], rabbitmq_url: str
) -> None:
    """Two instances on one PostgreSQL store (B's bound tighter, as in a rolling change of
    ``quotas.ad_hoc_topics``): a subscription with a new SubscriptionEnd topic and a
    registration of a new topic, accepted by A, are followed by B, their topics admitted
    there whatever B's bound.  Before, B's follower admitted them under its bound: "cannot
    be followed", and B never knew them (a shard of B's would not deliver the
    subscription)."""
    a = make_broker(adapter_url=rabbitmq_url, store_url=postgres_store_url)
    b = make_broker(adapter_url=rabbitmq_url, store_url=postgres_store_url, quotas__ad_hoc_topics=0)
    sa, sb = a.service, b.service
    assert sa is not None and sb is not None
    sub = sa.subscribe(sub_req(topic=simple("t:a"), subscription_end_topic=simple("t:ends")))
    reg = sa.register_publisher(RegisterPublisherRequest(None, (simple("t:registered"),)))
    wait_until(
        lambda: sub.id in sb.registry.subscriptions and reg.id in sb.registry.registrations,
        30,
        what="B following A's subscription and registration",
    )
    assert sb.registry.subscriptions[sub.id].end_topic is not None
    with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
        sb.notify([note("<x/>", simple("t:new"))])  # B's bound still refuses new topics


#: may call Notify on any topic (no ACL); not the broker itself (the fan-out bound applies)
NOTIFIER = Principal("notifier", method="basic")


def _over_fanout(s: BrokerService) -> None:
    s.notify([note("<a-payload-past-the-fan-out-bound/>", concrete("t:refused"))])


def _second_topic_over_bound(s: BrokerService) -> None:
    s.notify([note("<x/>", concrete("t:refused")), note("<y/>", concrete("t:refused2"))])


def _pull_point_over_fanout(s: BrokerService) -> None:
    pp = s.create_pull_point(CreatePullPointRequest())
    s.notify_pull_point(pp.id, [note("<a-payload-past-the-fan-out-bound/>", concrete("t:refused"))])


def _register_two_over_bound(s: BrokerService) -> None:
    s.register_publisher(
        RegisterPublisherRequest(None, (concrete("t:refused"), concrete("t:refused2")))
    )


def _subscribe_refused_after_end_topic(s: BrokerService) -> None:
    s.subscribe(
        sub_req(
            topic=simple("t:sensors"),
            subscription_end_topic=simple("t:refused"),
            initial_termination_time_invalid=True,
        )
    )


@pytest.mark.parametrize(
    ("refused", "fault"),
    [
        (_over_fanout, errors.NotificationRefused),
        (_second_topic_over_bound, errors.TopicNotSupported),
        (_pull_point_over_fanout, errors.NotificationRefused),
        (_register_two_over_bound, errors.TopicNotSupported),
        (_subscribe_refused_after_end_topic, errors.UnacceptableInitialTerminationTime),
    ],
    ids=[
        "notify-fanout",
        "notify-second-topic",
        "pull-point-fanout",
        "register-second-topic",
        "subscribe-later",
    ],
)
def test_a_request_refused_after_its_topics_were_checked_leaves_none_behind(
    make_broker: Callable[..., Broker],
    refused: Callable[[BrokerService], None],
    fault: type[errors.WsnError],
) -> None:
    """Bound 1: a request refused after the check of its new topics (the Notify fan-out
    bound, a pull point's Notify's too; a later topic of the same Notify or
    RegisterPublisher past the bound; a Subscribe's InitialTerminationTime, checked after
    its SubscriptionEnd topic) admits none of them, so another request's new topic still
    fits.  Before, the topics checked first were admitted on the way and stayed: refused
    requests used up the bound."""
    s = make_broker(quotas__ad_hoc_topics=1, quotas__notify_fanout_bytes=16).service
    assert s is not None
    with bound_principal(NOTIFIER):
        for _ in range(2):
            with pytest.raises(fault):
                refused(s)
        assert s.topic_set.grown == 0
        assert not {t.path for t in s.topic_set.topics()} & {("refused",), ("refused2",)}
        s.notify([note("<ok/>", concrete("t:fits"))])  # the bound's one new topic
    assert s.topic_set.grown == 1


@pytest.mark.rabbitmq
def test_a_refused_notify_records_no_topic_for_the_cluster(
    postgres_store_url: str, make_broker: Callable[..., Broker], rabbitmq_url: str
) -> None:
    """On a PostgreSQL store, a Notify refused by the fan-out bound and one whose second
    new topic is past the bound leave nothing in the cluster's recorded topics: a
    sentinel topic admitted after them is recorded, theirs are not.  Before, their first
    topics were admitted, then recorded for every instance."""
    b = make_broker(
        adapter_url=rabbitmq_url,
        store_url=postgres_store_url,
        quotas__ad_hoc_topics=1,
        quotas__notify_fanout_bytes=16,
    )
    s = b.service
    assert s is not None
    with bound_principal(NOTIFIER):
        with pytest.raises(errors.NotificationRefused):
            _over_fanout(s)
        with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
            _second_topic_over_bound(s)
        s.notify([note("<ok/>", concrete("t:sentinel"))])
    store = s.store
    wait_until(
        lambda: any(t.path == ("sentinel",) for t in store.list_topics()),
        30,
        what="the sentinel topic recorded for the cluster",
    )
    assert [t.path for t in store.list_topics() if t.namespace == NS] == [("sentinel",)]


@pytest.mark.rabbitmq
def test_a_store_migrated_past_the_bound_keeps_its_topics_and_the_cluster_refuses_new_ones(
    postgres_store_url: str, make_broker: Callable[..., Broker], rabbitmq_url: str
) -> None:
    """``wsnmom store migrate`` (``copy_store``) carries recorded topics whatever the
    bound, as a restart keeps accepted state: a gateway's store holding three recorded
    topics, a subscription with a SubscriptionEnd topic and a registration's topic,
    moved to PostgreSQL and started there under a bound of 2, keeps all five topics
    (the subscription and the registration restored, a Notify on a migrated topic
    accepted) and refuses every new topic; the shared table holds only what was
    migrated."""
    from wsnmom.core.store_sqlite import SqliteStore
    from wsnmom.core.store_url import open_store

    from wsnmom.store_command import copy_store

    single = make_broker(adapter_url=rabbitmq_url)
    s = single.service
    assert s is not None
    sub = s.subscribe(sub_req(topic=simple("t:a"), subscription_end_topic=simple("t:ends")))
    reg = s.register_publisher(RegisterPublisherRequest(None, (simple("t:registered"),)))
    recorded = [Topic(NS, ("kept", f"k{i}")) for i in range(3)]
    s.store.record_topics(recorded)  # what a store carried from a cluster holds
    single.stop()
    source, destination = SqliteStore(str(single.tmp / "store.db")), open_store(postgres_store_url)
    try:
        assert copy_store(source, destination).topics == 3
    finally:
        source.close()
        destination.close()

    cluster = make_broker(
        adapter_url=rabbitmq_url, store_url=postgres_store_url, quotas__ad_hoc_topics=2
    )
    c = cluster.service
    assert c is not None
    assert c.get_subscription(sub.id).state is SubscriptionState.ACTIVE
    assert c.registry.subscriptions[sub.id].end_topic is not None
    assert c.get_registration(reg.id).topics[0].text == "t:registered"
    kept = [*recorded, Topic(NS, ("ends",)), Topic(NS, ("registered",))]
    assert all(topic in c.topic_set for topic in kept)
    c.notify([note("<ok/>", concrete("t:kept/k1"))])
    for name in ("t:new", "t:kept/new"):
        with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
            c.notify([note("<x/>", concrete(name))])
    assert c.topic_set.grown == len(kept)
    assert c.store.list_topics()[:3] == recorded
    assert not {("new",), ("kept", "new")} & {t.path for t in c.store.list_topics()}


def _held(s: BrokerService, pull_point_id: str, n: int) -> list[NotificationMessage]:
    """The first ``n`` messages GetMessages hands out from the pull point."""
    got: list[NotificationMessage] = []

    def enough() -> bool:
        got.extend(s.get_messages(pull_point_id, None))
        return len(got) >= n

    wait_until(enough, 10, what=f"{n} message(s) from the pull point")
    return got


def test_a_notify_to_a_pull_point_admits_no_topic(make_broker: Callable[..., Broker]) -> None:
    """Bound 1.  A Notify sent to a pull point on two new topics is accepted, and the pull
    point holds its messages on their topics, but it admits neither: the topic set is the
    broker's (the NotificationProducer's), a pull point is a NotificationConsumer, and its
    messages go only into its inbox.  So the bound's one new topic is still free for the
    broker's own Notify, and with the bound full a pull point's Notify on a new topic is
    still accepted.  Before, the pull point's Notify admitted its topics (or was refused
    by the bound): whoever could create a pull point could fill the broker's topic set."""
    s = make_broker(quotas__ad_hoc_topics=1).service
    assert s is not None
    with bound_principal(NOTIFIER):
        pp = s.create_pull_point(CreatePullPointRequest())
        s.notify_pull_point(
            pp.id, [note("<a/>", concrete("t:pp1")), note("<b/>", concrete("t:pp2"))]
        )
        assert s.topic_set.grown == 0
        s.notify([note("<ok/>", concrete("t:fits"))])  # the bound's one new topic
        with pytest.raises(errors.TopicNotSupported, match=r"quotas\.ad_hoc_topics"):
            s.notify([note("<x/>", concrete("t:over"))])
        s.notify_pull_point(pp.id, [note("<c/>", concrete("t:pp3"))])  # the bound full
    got = _held(s, pp.id, 3)
    assert [m.payload for m in got] == [b"<a/>", b"<b/>", b"<c/>"]
    assert [m.topic for m in got] == [Topic(NS, ("pp1",)), Topic(NS, ("pp2",)), Topic(NS, ("pp3",))]
    assert s.topic_set.grown == 1
    assert not {("pp1",), ("pp2",), ("pp3",)} & {t.path for t in s.topic_set.topics()}


def test_a_notify_to_a_pull_point_is_not_bound_to_a_fixed_topic_set(
    make_broker: Callable[..., Broker],
) -> None:
    """A fixed topic set (FixedTopicSet: the topics the broker, a NotificationProducer,
    supports) refuses a Notify to the broker on another topic; a Notify sent to a pull
    point on it is accepted and held (BN 5.1.1: the pull point accumulates what it is
    sent), and the set stays as it was."""

    def topic_set() -> TopicSet:
        return TopicSet(topics=[Topic(NS, ("known",))], fixed=True)

    s = make_broker(topic_set=topic_set, fixed_topic_set=True).service
    assert s is not None
    with pytest.raises(errors.TopicNotSupported):
        s.notify([note("<x/>", simple("t:elsewhere"))])
    pp = s.create_pull_point(CreatePullPointRequest())
    s.notify_pull_point(pp.id, [note("<held/>", simple("t:elsewhere"))])
    [got] = _held(s, pp.id, 1)
    assert got.payload == b"<held/>" and got.topic == Topic(NS, ("elsewhere",))
    assert list(s.topic_set.topics()) == [Topic(NS, ("known",))]
