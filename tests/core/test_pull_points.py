"""Pull points: FIFO GetMessages with MaximumNumber, Notify to a pull point, pull point as a
subscription's consumer, destruction (CXF/ServiceMix scenarios, GM-*, PP-*)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.access import Principal, bound_principal
from wsnmom.core.adapter import AdapterError, AdapterUnavailable, MiddlewareBusy
from wsnmom.core.filters import XPATH10
from wsnmom.core.model import CreatePullPointRequest, EndpointReference, ExpressionSource
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping import CONCRETE

from tests.support.waiting import wait_until

from .conftest import concrete, full, note, simple, sub_req


def texts(messages: list[Any]) -> list[str]:
    return [etree.fromstring(m.payload).text or "" for m in messages]


def drain(service: BrokerService, pp_id: str, n: int, timeout: float = 5.0) -> list[Any]:
    """Poll GetMessages until ``n`` messages arrived (forwarding is asynchronous)."""
    out: list[Any] = []

    def enough() -> bool:
        out.extend(service.get_messages(pp_id, None))
        return len(out) >= n

    wait_until(enough, timeout, what=f"{n} message(s) from the pull point")
    return out


def until_sentinel(service: BrokerService, pp_id: str, count: int = 1) -> list[Any]:
    """Everything the pull point hands out until ``count`` ``<sentinel/>`` messages came
    (a barrier: see docs/testing.md)."""
    out: list[Any] = []

    def seen() -> bool:
        out.extend(service.get_messages(pp_id, None))
        return sum(etree.fromstring(m.payload).tag == "sentinel" for m in out) >= count

    wait_until(seen, what=f"{count} <sentinel/> message(s) at the pull point")
    return out


def test_notify_to_pull_point_fifo_and_maximum_number(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    ref = EndpointReference("http://producer.test/sub/1")
    service.notify_pull_point(
        pp.id,
        [note(f"<m>{i}</m>", simple("t:a")) if i % 2 else note(f"<m>{i}</m>") for i in range(7)],
    )
    first = service.get_messages(pp.id, 3)
    assert texts(first) == ["0", "1", "2"]
    assert first[1].topic is not None and first[1].topic.path == ("a",)
    assert first[0].topic is None
    rest = service.get_messages(pp.id, None)  # absent = all available
    assert texts(rest) == ["3", "4", "5", "6"]
    assert service.get_messages(pp.id, 0) == []  # destructive: nothing left
    del ref


def test_get_messages_zero_means_all_up_to_cap(make_broker: Any) -> None:
    b = make_broker(limits__get_messages_cap=4)
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(6)])
    assert texts(service.get_messages(pp.id, 0)) == ["0", "1", "2", "3"]
    assert texts(service.get_messages(pp.id, 10)) == ["4", "5"]


def test_get_messages_beyond_the_cap_gets_the_cap(make_broker: Any) -> None:
    """Issue 22 item 9: a MaximumNumber past SQLite's integer range raised OverflowError
    in the embedded store; any number beyond the cap is served as the cap."""
    b = make_broker(limits__get_messages_cap=4)
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(6)])
    assert texts(service.get_messages(pp.id, 99999999999999999999999)) == ["0", "1", "2", "3"]
    assert texts(service.get_messages(pp.id, 2**63)) == ["4", "5"]


def test_subscription_with_pull_point_consumer(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(
        sub_req(service.pull_point_address(pp.id), topic=simple("t:myTopic"), use_raw=True)
    )
    assert sub.pull_point_id == pp.id
    assert sub.use_raw is False  # pull points hold NotificationMessages (PP-10)
    service.notify([note("<hello>world</hello>", simple("t:myTopic"))])
    service.notify([note("<other/>", simple("t:other"))])
    got = drain(service, pp.id, 1)
    assert texts(got) == ["world"]
    assert got[0].subscription_reference == EndpointReference(service.subscription_address(sub.id))
    # ServiceMix testUnsubscribe: after Unsubscribe nothing more arrives
    witness = service.subscribe(
        sub_req(service.pull_point_address(pp.id), topic=simple("t:myTopic"))
    )
    service.unsubscribe(sub.id)
    service.notify([note("<hello>again</hello>", simple("t:myTopic"))])
    service.notify([note("<sentinel/>", simple("t:myTopic"))])
    got = until_sentinel(service, pp.id)
    witness_ref = EndpointReference(service.subscription_address(witness.id))
    assert [m.subscription_reference for m in got] == [witness_ref] * 2


def test_servicemix_pull_with_filter(service: BrokerService) -> None:
    pp1 = service.create_pull_point(CreatePullPointRequest())
    pp2 = service.create_pull_point(CreatePullPointRequest())
    for pp, kind in ((pp1, "a"), (pp2, "b")):
        service.subscribe(
            sub_req(
                service.pull_point_address(pp.id),
                message_content=ExpressionSource(XPATH10, f"@type = '{kind}'", {}),
            )
        )
    service.notify([note("<msg type='a'/>"), note("<msg type='b'/>"), note("<msg type='c'/>")])
    # the barrier: a sentinel each filter lets through, after the messages it must drop
    service.notify([note("<sentinel type='a'/>"), note("<sentinel type='b'/>")])
    a = until_sentinel(service, pp1.id)
    b = until_sentinel(service, pp2.id)
    assert [etree.fromstring(m.payload).get("type") for m in a] == ["a", "a"]
    assert [etree.fromstring(m.payload).get("type") for m in b] == ["b", "b"]


def test_pause_resume_pull_point_subscription(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id)))
    service.notify([note("<m>0</m>")])
    assert texts(drain(service, pp.id, 1)) == ["0"]
    service.pause(sub.id)
    witness = service.subscribe(sub_req(service.pull_point_address(pp.id)))
    service.notify([note("<m>1</m>"), note("<m>2</m>"), note("<sentinel/>")])
    held = until_sentinel(service, pp.id)
    witness_ref = EndpointReference(service.subscription_address(witness.id))
    assert [m.subscription_reference for m in held] == [witness_ref] * 3
    service.resume(sub.id)
    got = until_sentinel(service, pp.id)
    assert texts(got) == ["1", "2", ""]


def test_destroy_pull_point_destroys_feeding_subscriptions(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id)))
    service.destroy_pull_point(pp.id)
    with pytest.raises(errors.ResourceUnknown):
        service.get_pull_point(pp.id)
    with pytest.raises(errors.ResourceUnknown):
        service.get_subscription(sub.id)
    with pytest.raises(errors.ResourceUnknown):
        service.get_messages(pp.id, 1)
    with pytest.raises(errors.ResourceUnknown):
        service.destroy_pull_point(pp.id)


def test_named_pull_point_reattaches(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest(name="testQueue"))
    again = service.create_pull_point(CreatePullPointRequest(name="testQueue"))
    assert again.id == pp.id
    other = service.create_pull_point(CreatePullPointRequest())
    assert other.id != pp.id


def test_unfiltered_subscription_gets_no_pull_point_inbox_traffic(
    service: BrokerService, outbound: Any
) -> None:
    """Copies into a pull point's inbox travel on an internal namespace, which
    ``patterns=None`` (a subscription without topic filter) does not include: the
    unfiltered subscription's durable queue never holds them (nothing to ack away)."""
    from wsnmom.core import metrics

    everything = "http://127.0.0.1:9/everything"
    pp = service.create_pull_point(CreatePullPointRequest(None))
    service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:inbox")))
    service.pause(service.subscribe(sub_req(everything)).id)  # accumulates: count its queue
    unfiltered = next(
        s
        for s in service.registry.subscriptions.values()
        if s.record.consumer.address == everything
    )
    filtered_before = metrics.NOTIFICATIONS_FILTERED._value.get()
    service.notify([note(f"<n>{i}</n>", simple("t:inbox")) for i in range(5)])
    service.notify_pull_point(pp.id, [note("<n>direct</n>", simple("t:inbox"))])
    assert len(drain(service, pp.id, 6)) == 6  # 5 forwarded + 1 sent to the pull point
    # the unfiltered subscription holds the 5 notifications, not the 6 inbox copies
    assert unfiltered.handle is not None and unfiltered.handle.depth() == 5
    assert metrics.NOTIFICATIONS_FILTERED._value.get() == filtered_before


def test_internal_namespaces_are_reserved(service: BrokerService) -> None:
    for ns in ("urn:wsnmom:internal:pull-point", "urn:wsnmom:internal:other"):
        with pytest.raises(errors.TopicNotSupported):
            service.subscribe(sub_req(topic=simple("x:p1", {"x": ns})))


# -- what mutation testing found untested (make mutation ARGS=pull_points) ------------------


def test_a_pull_point_without_a_termination_time_gets_the_pull_point_default(
    make_broker: Any,
) -> None:
    b = make_broker(termination__pull_point_default=timedelta(minutes=7))
    pp = b.service.create_pull_point(CreatePullPointRequest())
    assert pp.termination_time == b.clock() + timedelta(minutes=7)


@pytest.mark.parametrize(
    ("raised", "fault"),
    [
        (MiddlewareBusy("busy"), errors.MiddlewareOverloaded),
        (AdapterUnavailable("down"), errors.ResourceUnavailable),
        (AdapterError("refused"), errors.UnableToCreatePullPoint),
    ],
)
def test_a_middleware_failure_on_create_is_its_own_fault(
    broker: Any, monkeypatch: pytest.MonkeyPatch, raised: Exception, fault: type[Exception]
) -> None:
    def refuse(spec: Any) -> Any:
        raise raised

    monkeypatch.setattr(broker.adapter, "subscription", refuse)
    with pytest.raises(fault) as caught:
        broker.service.create_pull_point(CreatePullPointRequest())
    # a refusal (busy, unavailable) is not "unable to create"
    assert isinstance(caught.value, errors.UnableToCreatePullPoint) == (
        fault is errors.UnableToCreatePullPoint
    )
    assert broker.service.registry.pull_points == {}


@pytest.mark.parametrize(
    ("raised", "fault"),
    [
        (MiddlewareBusy("busy"), errors.MiddlewareOverloaded),
        (AdapterError("refused"), errors.UnableToGetMessages),
    ],
)
def test_a_middleware_failure_on_get_messages_is_its_own_fault(
    service: BrokerService, monkeypatch: pytest.MonkeyPatch, raised: Exception, fault: type
) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    state = service.registry.live_pull_point(pp.id)

    def fail(self: Any, limit: int) -> Any:
        raise raised

    monkeypatch.setattr(type(state.handle), "hand_out", fail)  # handles have __slots__
    with pytest.raises(fault) as caught:
        service.get_messages(pp.id, None)
    assert isinstance(caught.value, errors.UnableToGetMessages) == (
        fault is errors.UnableToGetMessages
    )


def test_an_expired_message_is_skipped_and_the_next_one_handed_out(make_broker: Any) -> None:
    """On a log (core enforces ``max_age``), one expired message among live ones."""
    b = make_broker(adapter_url="filelog://{tmp}/log", limits__max_age=timedelta(minutes=1))
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<m>old</m>")])
    b.clock.advance(minutes=2)  # "old" is past max_age now
    service.notify_pull_point(pp.id, [note("<m>new</m>"), note("<sentinel/>")])
    # all three wait in the pull point: one GetMessages gets them together
    wait_until(lambda: service.overview().pull_points[0].waiting == 3, what="3 waiting")
    assert texts(service.get_messages(pp.id, None)) == ["new", ""]


def test_messages_are_handed_out_in_the_concrete_dialect_when_configured(
    make_broker: Any,
) -> None:
    b = make_broker(topic_dialect="concrete")
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<m>1</m>", simple("t:a"))])
    (message,) = service.get_messages(pp.id, None)
    assert message.topic_dialect == CONCRETE


def test_named_pull_points_are_one_per_name_and_owner(service: BrokerService) -> None:
    a = service.create_pull_point(CreatePullPointRequest(name="a"))
    assert service.create_pull_point(CreatePullPointRequest(name="b")).id != a.id
    with bound_principal(Principal("alice", method="basic")):
        alices = service.create_pull_point(CreatePullPointRequest(name="a"))
        assert alices.id != a.id and alices.owner == "alice"
        assert service.create_pull_point(CreatePullPointRequest(name="a")).id == alices.id
    assert service.create_pull_point(CreatePullPointRequest(name="a")).id == a.id


def test_renew_sets_a_pull_points_termination_time(make_broker: Any) -> None:
    """ONVIF's Renew of a pull-point subscription renews its pull point with it."""
    b = make_broker(termination__maximum=timedelta(hours=2))
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest(timedelta(minutes=1)))
    renewed = service.renew_pull_point(pp.id, timedelta(minutes=30))
    assert renewed.termination_time == b.clock() + timedelta(minutes=30)
    assert service.get_pull_point(pp.id).termination_time == renewed.termination_time
    stored = service.store.get_pull_point(pp.id)
    assert stored is not None and stored.termination_time == renewed.termination_time
    with pytest.raises(errors.UnacceptableTerminationTime):
        service.renew_pull_point(pp.id, None)
    with pytest.raises(errors.UnacceptableTerminationTime):
        service.renew_pull_point(pp.id, timedelta(hours=3))  # beyond termination.maximum
    assert service.get_pull_point(pp.id).termination_time == renewed.termination_time
    with pytest.raises(errors.ResourceUnknown):
        service.renew_pull_point("nope", timedelta(minutes=1))


def test_synchronize_puts_the_current_messages_of_the_subscriptions_topics_again(
    service: BrokerService,
) -> None:
    """ONVIF's SetSynchronizationPoint: the current message of every topic the feeding
    subscription selects, and of no other, goes into its pull point again."""
    service.notify([note("<m>a-old</m>", simple("t:a")), note("<m>a</m>", simple("t:a"))])
    service.notify([note("<m>b</m>", concrete("t:a/b"))])
    service.notify([note("<m>other</m>", simple("t:other"))])
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=full("t:a//.")))
    assert service.get_messages(pp.id, None) == []
    assert service.synchronize(sub.id) == 2
    got = drain(service, pp.id, 2)
    assert sorted(texts(got)) == ["a", "b"]
    push = service.subscribe(sub_req(topic=simple("t:a")))
    with pytest.raises(errors.ResourceUnknown, match="does not feed a pull point"):
        service.synchronize(push.id)
    service.destroy_pull_point(pp.id)
    with pytest.raises(errors.ResourceUnknown):
        service.synchronize(sub.id)
