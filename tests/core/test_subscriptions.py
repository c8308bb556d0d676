"""The subscription lifecycle of ``core/subscriptions.py`` outcome by outcome, on the real
embedded adapter (and the file-log one where a log's behaviour is the point): filter
compilation and its start-up memo, which consumer addresses designate a pull point,
Subscribe's refusals, the lost count, Renew, Pause/Resume of queued, routed and fed
subscriptions (also when the middleware refuses), purges, SubscriptionEnd after a restart
and the filters demand-based publishing sees.  Written against the mutants that survived
``make mutation ARGS=subscriptions`` (docs/testing.md, "Mutation testing")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    SubscribeRequest,
    SubscriptionState,
)
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.namespaces import TopicSet

from tests.support.waiting import wait_until

from .conftest import NS, Broker, FakeClock, RecordingOutbound, note, simple, sub_req, wait_idle

A = "http://127.0.0.1:9/a"
B = "http://127.0.0.1:9/b"
WITNESS = "http://127.0.0.1:9/witness"
FILELOG = "filelog://{tmp}/log?partitions=1"
SENTINEL = b"<sentinel/>"


def publish(service: BrokerService, *bodies: str, topic: str = "t:a") -> None:
    service.notify([note(body, simple(topic)) for body in bodies])


def pull_all(service: BrokerService, pp_id: str, n: int) -> list[bytes]:
    """At least ``n`` payloads from the pull point (all it handed out meanwhile)."""
    out: list[bytes] = []

    def enough() -> bool:
        out.extend(m.payload for m in service.get_messages(pp_id, None))
        return len(out) >= n

    wait_until(enough, what=f"{n} message(s) at pull point {pp_id}")
    return out


def new_pp(service: BrokerService) -> str:
    return service.create_pull_point(CreatePullPointRequest()).id


def feed(service: BrokerService, pp_id: str, topic: str = "t:a", **kw: Any) -> str:
    """A subscription whose consumer is the pull point ``pp_id``; its id."""
    consumer = EndpointReference(service.pull_point_address(pp_id))
    return service.subscribe(SubscribeRequest(consumer, topic=simple(topic), **kw)).id


# -- filters ---------------------------------------------------------------------------------
def test_the_start_up_memo_compiles_each_expression_once(service: BrokerService) -> None:
    subs = service.subscriptions
    memo: dict[tuple[Any, ...], Any] = {}
    a = subs.compile_filter(simple("t:a"), None, None, memo)
    again = subs.compile_filter(simple("t:a"), None, None, memo)
    b = subs.compile_filter(simple("t:b"), None, None, memo)
    assert again.topic is a.topic  # shared, not compiled twice
    assert b.topic is not None and b.topic is not a.topic
    assert b.topic.matches(Topic(NS, ("b",))) and not b.topic.matches(Topic(NS, ("a",)))
    assert len(memo) == 2
    # without a memo every call compiles afresh
    assert subs.compile_filter(simple("t:a"), None, None).topic is not a.topic


def test_restored_subscriptions_keep_their_own_topic_filters(
    broker: Broker, outbound: RecordingOutbound
) -> None:
    """The restart compiles the stored filters through the memo: each subscription keeps
    its own expression."""
    service = broker.service
    assert service is not None
    service.subscribe(sub_req(A, topic=simple("t:a")))
    service.subscribe(sub_req(B, topic=simple("t:b")))
    service = broker.restart()
    publish(service, "<for-a/>", topic="t:a")
    publish(service, "<for-b/>", topic="t:b")
    outbound.wait_messages(A, 1)
    outbound.wait_messages(B, 1)
    wait_idle(service)
    assert outbound.payloads_to(A) == [b"<for-a/>"]
    assert outbound.payloads_to(B) == [b"<for-b/>"]


def test_producer_properties_filters_are_refused_precisely(service: BrokerService) -> None:
    with pytest.raises(errors.InvalidProducerPropertiesExpression) as info:
        service.subscribe(sub_req(A, producer_properties=simple("t:whatever")))
    assert "t:whatever" in str(info.value)
    assert service.registry.subscriptions == {}


# -- which consumer address is a pull point --------------------------------------------------
def test_a_pull_point_path_on_another_authority_feeds_the_pull_point(
    service: BrokerService,
) -> None:
    """The broker may be reached under another name (a proxy): the path decides."""
    pp = new_pp(service)
    other = f"http://gateway.example:9999/wsn/pullpoints/{pp}/"
    sub = service.subscribe(SubscribeRequest(EndpointReference(other), topic=simple("t:a")))
    assert sub.pull_point_id == pp
    publish(service, "<m>1</m>")
    assert pull_all(service, pp, 1) == [b"<m>1</m>"]


def test_the_own_address_with_a_query_feeds_the_pull_point(service: BrokerService) -> None:
    pp = new_pp(service)
    address = service.pull_point_address(pp) + "?client=x"
    sub = service.subscribe(SubscribeRequest(EndpointReference(address), topic=simple("t:a")))
    assert sub.pull_point_id == pp


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:9/wsn/pullpoints/{gone}",  # a pull point that does not exist
        "http://127.0.0.1:9/wsn/subscriptions/{sub}",  # another kind of resource
        "http://127.0.0.1:9/consumer",
    ],
    ids=["unknown-pull-point", "subscription-path", "plain"],
)
def test_other_addresses_are_consumers(
    service: BrokerService, outbound: RecordingOutbound, address: str
) -> None:
    other = service.subscribe(sub_req(B, topic=simple("t:x")))
    address = address.format(gone="f" * 32, sub=other.id)
    sub = service.subscribe(sub_req(address, topic=simple("t:a")))
    assert sub.pull_point_id is None
    publish(service, "<m>pushed</m>")
    assert [d.message.payload for d in outbound.wait_messages(address, 1)] == [b"<m>pushed</m>"]


def test_an_address_that_is_no_url_is_refused_by_the_policy(service: BrokerService) -> None:
    with pytest.raises(errors.SubscribeCreationFailed) as info:
        service.subscribe(sub_req("http://[::1/wsn/pullpoints/x", topic=simple("t:a")))
    assert "not a URL" in str(info.value)
    assert service.registry.subscriptions == {}


def test_a_pull_point_made_through_another_instance_is_loaded_at_subscribe(
    broker: Broker,
) -> None:
    """With a shared store the registry's loader brings in what another instance made a
    moment ago (here: a pull point stored behind the running broker's back)."""
    service = broker.service
    assert service is not None
    pp = new_pp(service)
    record = service.registry.pull_points[pp].record
    service.registry.pull_points.pop(pp).stop()  # this instance has not seen it yet
    loads: list[tuple[str, str]] = []

    def loader(kind: str, resource_id: str) -> object:
        loads.append((kind, resource_id))
        return service.follower.load(kind, resource_id)

    service.registry.loader = loader
    sub = feed(service, pp)
    assert service.get_subscription(sub).pull_point_id == pp == record.id
    assert ("pull_point", pp) in loads
    # a pull point it knows is not loaded again
    loads.clear()
    feed(service, pp, "t:b")
    assert loads == []
    publish(service, "<m>1</m>")
    assert pull_all(service, pp, 1) == [b"<m>1</m>"]
