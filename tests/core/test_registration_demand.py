"""RegisterPublisher, requires_registration, demand-based publishing (CXF testPublisher*,
ServiceMix testDemandBasedPublisher, DEM-*), GetCurrentMessage."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.coordination import SINGLE_EPOCH
from wsnmom.core.model import EndpointReference, ExpressionSource, RegisterPublisherRequest
from wsnmom.core.service import BrokerService
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.support.waiting import wait_until

from .conftest import NS, Broker, RecordingOutbound, full, note, simple, sub_req, wait_idle

P = "http://127.0.0.1:9/publisher"
C = "http://127.0.0.1:9/consumer"


def reg_req(**kw: Any) -> RegisterPublisherRequest:
    kw.setdefault("publisher_reference", EndpointReference(P))
    return RegisterPublisherRequest(**kw)


def test_register_publisher_faults(service: BrokerService) -> None:
    with pytest.raises(errors.PublisherRegistrationFailed):
        service.register_publisher(
            RegisterPublisherRequest(None, topics=(simple("t:a"),), demand=True)
        )
    with pytest.raises(errors.InvalidTopicExpression):
        service.register_publisher(reg_req(demand=True))
    with pytest.raises(errors.InvalidTopicExpression):  # BR lists no dialect fault
        service.register_publisher(
            reg_req(topics=(ExpressionSource("urn:unknown-dialect", "t:a", {"t": NS}),))
        )
    with pytest.raises(errors.InvalidTopicExpression):
        service.register_publisher(reg_req(topics=(simple("t:a/b"),)))


def test_null_publisher_reference(service: BrokerService, outbound: RecordingOutbound) -> None:
    """CXF testNullPublisherReference."""
    reg = service.register_publisher(
        RegisterPublisherRequest(None, topics=(simple("t:myTopicNullEPR"),))
    )
    assert service.get_registration(reg.id).publisher_reference is None
    service.subscribe(sub_req(C, topic=simple("t:myTopicNullEPR")))
    service.notify([note("<x/>", simple("t:myTopicNullEPR"))])
    assert len(outbound.wait_messages(C, 1)) == 1
    service.destroy_registration(reg.id)
    with pytest.raises(errors.ResourceUnknown):
        service.destroy_registration(reg.id)


def test_producer_reference_forwarded(service: BrokerService, outbound: RecordingOutbound) -> None:
    """CXF testPublisher."""
    service.subscribe(sub_req(C, topic=simple("t:myTopic")))
    reg = service.register_publisher(reg_req(topics=(simple("t:myTopic"),)))
    service.notify([note("<x/>", simple("t:myTopic"), producer=P)])
    got = outbound.wait_messages(C, 1)
    assert got[0].message.producer_reference == EndpointReference(P)
    service.destroy_registration(reg.id)


def test_requires_registration(make_broker: Any, outbound: RecordingOutbound) -> None:
    b = make_broker(requires_registration=True)
    service: BrokerService = b.service
    assert service.broker_properties().requires_registration is True
    service.subscribe(sub_req(C))
    with pytest.raises(errors.PublisherRegistrationRejected):
        service.notify([note("<x>anon</x>", simple("t:a"))])
    with pytest.raises(errors.PublisherRegistrationRejected):
        service.notify([note("<x>unregistered</x>", simple("t:a"), producer=P)])
    reg = service.register_publisher(reg_req(topics=(simple("t:a"),)))
    service.notify([note("<x>ok</x>", simple("t:a"), producer=P)])
    with pytest.raises(errors.PublisherRegistrationRejected):  # outside its topics
        service.notify([note("<x>other topic</x>", simple("t:b"), producer=P)])
    service.destroy_registration(reg.id)
    with pytest.raises(errors.PublisherRegistrationRejected):
        service.notify([note("<x>after destroy</x>", simple("t:a"), producer=P)])
    wait_idle(service)
    assert outbound.payloads_to(C) == [b"<x>ok</x>"]


def test_demand_based_publishing(service: BrokerService, outbound: RecordingOutbound) -> None:
    """CXF testPublisherOnDemand / ServiceMix testDemandBasedPublisher, with DEM-03 pause."""
    reg = service.register_publisher(
        reg_req(topics=(simple("t:myTopic1"), simple("t:myTopic2")), demand=True)
    )
    service.demand.reconcile()
    assert outbound.events == []  # nobody wants it yet: the publisher is not contacted
    other = service.subscribe(sub_req(C, topic=simple("t:unrelated")))
    service.demand.reconcile()
    assert outbound.events == []
    sub = service.subscribe(sub_req(C, topic=full("t:myTopic1//.")))
    assert outbound.wait(lambda: len(outbound.events) >= 1)
    kind, ref = outbound.events[0]
    assert kind == "subscribe"
    stored = service.get_registration(reg.id)
    assert stored.demand_subscription == EndpointReference(ref)
    # the publisher's notifications come back through Notify
    service.notify([note("<x/>", simple("t:myTopic1"), producer=P)])
    assert len(outbound.wait_messages(C, 1)) == 1
    service.unsubscribe(sub.id)
    assert outbound.wait(lambda: ("pause", ref) in outbound.events)
    assert service.get_registration(reg.id).demand_paused is True
    service.subscribe(sub_req(C))  # no topic filter: wants everything
    assert outbound.wait(lambda: ("resume", ref) in outbound.events)
    service.destroy_registration(reg.id)
    assert outbound.wait(lambda: ("unsubscribe", ref) in outbound.events)
    del other


def test_demand_pause_failure_falls_back_to_unsubscribe(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.fail_publisher_pause = True
    reg = service.register_publisher(reg_req(topics=(simple("t:d"),), demand=True))
    sub = service.subscribe(sub_req(C, topic=simple("t:d")))
    assert outbound.wait(lambda: any(k == "subscribe" for k, _ in outbound.events))
    ref = outbound.events[0][1]
    service.pause(sub.id)  # a paused subscription is no demand
    assert outbound.wait(lambda: ("unsubscribe", ref) in outbound.events)
    assert service.get_registration(reg.id).demand_subscription is None
    service.resume(sub.id)
    assert outbound.wait(lambda: [k for k, _ in outbound.events].count("subscribe") == 2)


def test_get_current_message(service: BrokerService) -> None:
    with pytest.raises(errors.NoCurrentMessageOnTopic):
        service.get_current_message(simple("t:cm"))
    service.notify([note("<m>1</m>", simple("t:cm")), note("<m>2</m>", simple("t:cm"))])
    assert service.get_current_message(simple("t:cm")).payload == b"<m>2</m>"
    with pytest.raises(errors.MultipleTopicsSpecified):
        service.get_current_message(full("t:cm/*"))
    with pytest.raises(errors.TopicExpressionDialectUnknown):
        service.get_current_message(ExpressionSource("urn:nope", "t:cm", {"t": NS}))
    with pytest.raises(errors.InvalidTopicExpression):
        service.get_current_message(simple("t:cm/x"))


def test_fixed_topic_set(make_broker: Any) -> None:
    from wsnmom.topic_mapping.model import Topic

    def topic_set() -> TopicSet:
        return TopicSet(topics=[Topic(NS, ("known",))], fixed=True)

    b = make_broker(topic_set=topic_set, fixed_topic_set=True)
    service: BrokerService = b.service
    props = service.broker_properties()
    assert props.fixed_topic_set is True
    assert [e.text for e in props.topic_expressions] == ["tns:known"]
    service.subscribe(sub_req(C, topic=simple("t:known")))
    with pytest.raises(errors.TopicNotSupported):
        service.subscribe(sub_req(C, topic=simple("t:unknown")))
    with pytest.raises(errors.TopicNotSupported):
        service.notify([note("<x/>", simple("t:unknown"))])
    with pytest.raises(errors.TopicNotSupported):
        service.register_publisher(reg_req(topics=(simple("t:unknown"),)))


def test_topics_grow_ad_hoc(service: BrokerService) -> None:
    service.notify([note("<x/>", simple("t:grown"))])
    props = service.broker_properties()
    assert "tns:grown" in [e.text for e in props.topic_expressions]
    assert props.topic_set.tag == "{http://docs.oasis-open.org/wsn/t-1}TopicSet"
    assert props.fixed_topic_set is False


def test_a_new_leader_takes_the_publisher_subscription_its_predecessor_saved(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    """An instance taking the leadership may not have followed its predecessor's last save
    of a publisher subscription (milliseconds, up to ``cluster.poll`` when a NOTIFY is
    lost): its first pass as leader reads the store, and pauses that subscription when
    demand goes.  Before, it subscribed again, and the predecessor's subscription stayed
    at the publisher for good."""
    leading = threading.Event()
    service._ctx.leads = leading.is_set  # another instance leads
    service.demand.reconcile()  # a pass while not leading
    reg = service.register_publisher(reg_req(topics=(simple("t:handover"),), demand=True))
    sub = service.subscribe(sub_req(C, topic=simple("t:handover")))
    service.demand.reconcile()
    theirs = EndpointReference(P + "/subscriptions/predecessor")
    assert service.store.save_registration_demand(reg.id, theirs, False, epoch=SINGLE_EPOCH)
    assert service.get_registration(reg.id).demand_subscription is None  # not followed
    leading.set()
    service.demand.reconcile()  # the first pass as leader (a background one waits for it)
    assert service.get_registration(reg.id).demand_subscription == theirs
    service.unsubscribe(sub.id)
    assert outbound.wait(lambda: ("pause", theirs.address) in outbound.events)
    assert outbound.events == [("pause", theirs.address)]


class DeposingOutbound(RecordingOutbound):
    """The recording publisher side; the first Subscribe runs :attr:`during_subscribe`
    before it answers (the leader deposed while the call is in flight)."""

    during_subscribe: Callable[[], None] | None = None

    def subscribe(
        self,
        producer: EndpointReference,
        consumer: EndpointReference,
        topics: Sequence[ExpressionSource],
        *,
        timeout: float,
    ) -> EndpointReference:
        hook, self.during_subscribe = self.during_subscribe, None
        if hook is not None:
            hook()
        return super().subscribe(producer, consumer, topics, timeout=timeout)


def test_a_leader_deposed_during_its_subscribe_unsubscribes_it_and_saves_nothing(
    postgres_store_url: str, make_broker: Callable[..., Broker], caplog: pytest.LogCaptureFixture
) -> None:
    """On a PostgreSQL store: while the leader's Subscribe at the publisher is in flight,
    its lock's connection ends and another instance takes the leadership.  The leader's
    save of the answer is refused (its epoch is not the store's any more): it logs one
    line, unsubscribes what it made, writes nothing, and a pass after it calls no
    publisher.  (The database is asked for first: the broker stops before it goes.)"""
    soap = DeposingOutbound()
    service = make_broker(store_url=postgres_store_url, soap=soap).service
    assert service is not None and service.cluster.leads()
    other = open_store(postgres_store_url, instance_id="successor")
    successor = other.coordination("successor")

    def depose() -> None:
        with other.transaction() as conn:  # type: ignore[attr-defined]
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (f"{service.instance_id}/leader",),
            )
        wait_until(successor.lead, 10, what="the other instance taking the leadership")

    soap.during_subscribe = depose
    with caplog.at_level(logging.WARNING, logger="wsnmom.core.demand"):
        reg = service.register_publisher(reg_req(topics=(simple("t:deposed"),), demand=True))
        sub = service.subscribe(sub_req(C, topic=simple("t:deposed")))
        service.demand.reconcile()
        made = P + "/subscriptions/1"
        assert soap.wait(lambda: ("unsubscribe", made) in soap.events)
        service.demand.reconcile()  # under the refused epoch, or not leading: no call
    assert soap.events == [("subscribe", made), ("unsubscribe", made)]
    stored = other.get_registration(reg.id)
    assert stored is not None and stored.demand_subscription is None
    refused = [r for r in caplog.records if "save refused" in r.getMessage()]
    assert len(refused) == 1 and reg.id in refused[0].getMessage(), refused
    service.unsubscribe(sub.id)
    successor.leave()
    other.close()
