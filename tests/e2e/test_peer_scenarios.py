"""Peer scenarios over HTTP against the running gateway: Apache CXF WsnBrokerTest 1-8
(peer-implementations §4.1) and ServiceMix WSNComponentTest (§4.2), with NCIA semantics
where they differ (expiry destroys the subscription)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, SIMPLE, epr_address
from tests.support.waiting import wait_until
from tests.support.wsn_schemas import assert_body_valid
from wsnmom.client import (
    Notification,
    NotificationConsumer,
    ResourceUnknownFault,
    WsnClient,
)
from wsnmom.client.errors import PublisherRegistrationFailedFault

pytestmark = pytest.mark.e2e


def _from(consumer: ConsumerServer, sub_address: str) -> list[etree._Element]:
    """The messages ``consumer`` received for the subscription at ``sub_address``."""
    return [
        m
        for m in consumer.messages()
        if (ref := m.find("wsnt:SubscriptionReference", NS)) is not None
        and epr_address(ref) == sub_address
    ]


def _payload_texts(consumer: ConsumerServer, sub_address: str) -> list[str | None]:
    return [m.findtext("wsnt:Message/*", namespaces=NS) for m in _from(consumer, sub_address)]


def _until_sentinel(source: Callable[[], list[Notification]]) -> list[Notification]:
    """Everything ``source`` (a drain or a GetMessages) yields up to a ``<sentinel/>``."""
    got: list[Notification] = []

    def seen() -> bool:
        got.extend(source())
        return any(n.payload.tag == "sentinel" for n in got)

    wait_until(seen, what="the <sentinel/> notification")
    return got


# --- CXF WsnBrokerTest --------------------------------------------------------------------
def test_cxf_broker(wsn: Wsn, consumer: ConsumerServer) -> None:
    sub = wsn.subscribe(consumer.address())
    wsn.notify(("tns:myTopic", '<foo xmlns="urn:test:org">bar</foo>'))
    (msg,) = consumer.wait_for_messages(1)
    ref = msg.find("wsnt:SubscriptionReference", NS)
    assert ref is not None and epr_address(ref) == sub.address
    payload = msg.find("wsnt:Message/{urn:test:org}foo", NS)
    assert payload is not None and payload.text == "bar"
    # the outbound Notify is schema-valid and carries the Notify action and wsa:To
    rec = consumer.notifies()[0]
    assert_body_valid(rec.body)
    assert rec.header(f"{{{NS['wsa']}}}Action")[0].text == (
        "http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"
    )
    assert rec.header(f"{{{NS['wsa']}}}To")[0].text == consumer.address()
    # barrier: a witness on the same topic and consumer gets what comes after, then a sentinel
    witness = wsn.subscribe(consumer.address())
    wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
    wsn.notify(("tns:myTopic", "<foo>after</foo>"), ("tns:myTopic", "<foo>sentinel</foo>"))
    wait_until(
        lambda: "sentinel" in _payload_texts(consumer, witness.address),
        what="the sentinel at the witness subscription",
    )
    assert _payload_texts(consumer, witness.address) == ["after", "sentinel"]
    assert len(_from(consumer, sub.address)) == 1


def test_cxf_renew_expiry_destroys_and_renew_before_expiry_keeps_receiving(
    client: WsnClient, inbox: NotificationConsumer
) -> None:
    """CXF's two Renew cases side by side, so that one wait passes both termination times:
    a subscription renewed before its 2 s run out keeps receiving past them; one of 1 s
    that is not renewed is destroyed (a Renew after its time faults)."""
    with NotificationConsumer() as kept_inbox:
        kept = client.subscribe(kept_inbox, "tns:myTopic", initial_termination_time="PT2S")
        subscribed_at = time.monotonic()
        kept.renew(timedelta(seconds=60))
        sub = client.subscribe(inbox, "tns:myTopic", initial_termination_time="PT1S")
        created_at = time.monotonic()
        # past both termination times: the probe below renews what is still alive
        time.sleep(
            max(0.0, subscribed_at + 2.3 - time.monotonic(), created_at + 1.6 - time.monotonic())
        )

        def renew_faults() -> bool:
            try:
                sub.renew(timedelta(seconds=60))
            except ResourceUnknownFault:
                return True
            return False

        wait_until(renew_faults, what="the expired subscription to be destroyed")
        witness = client.subscribe(inbox, "tns:myTopic")
        client.notify("<foo/>", "tns:myTopic")
        client.notify("<sentinel/>", "tns:myTopic")
        got = _until_sentinel(inbox.drain)
        assert [n.subscription_address for n in got] == [witness.address] * 2
        assert kept_inbox.get(timeout=5).subscription_address == kept.address


@pytest.mark.parametrize("queue_name", [None, "testQueue"])
def test_cxf_pull_point(client: WsnClient, wsn: Wsn, queue_name: str | None) -> None:
    pp = client.create_pull_point(name=f"{queue_name}-{wsn.ns[-6:]}" if queue_name else None)
    sub = client.subscribe(pp, "tns:myTopic")
    client.notify("<foo>1</foo>", "tns:myTopic")
    msgs = wait_until(lambda: pp.get_messages(10), timeout=5, what="pulled message")
    assert len(msgs) >= 1
    assert msgs[0].payload.tag == "foo" and msgs[0].payload.text == "1"
    # fed through a subscription: GetMessages names it
    assert msgs[0].subscription_address == sub.address
    sub.unsubscribe()
    pp.destroy()
    with pytest.raises(ResourceUnknownFault):
        pp.get_messages()


def _register(wsn: Wsn, publisher: str | None, topics: list[str], demand: bool) -> etree._Element:
    ref = (
        f"<wsn-br:PublisherReference><wsa:Address>{publisher}</wsa:Address>"
        "</wsn-br:PublisherReference>"
        if publisher
        else ""
    )
    tops = "".join(
        f'<wsn-br:Topic xmlns:tns="{wsn.ns}" '
        f'Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple">tns:{t}'
        "</wsn-br:Topic>"
        for t in topics
    )
    body = (
        f"<wsn-br:RegisterPublisher>{ref}{tops}<wsn-br:Demand>{str(demand).lower()}"
        "</wsn-br:Demand></wsn-br:RegisterPublisher>"
    )
    return wsn.post(wsn.broker, body).ok()


def test_cxf_publisher(wsn: Wsn, consumer: ConsumerServer) -> None:
    sub = wsn.subscribe(consumer.address())
    resp = _register(wsn, "http://publisher.example/p", ["myTopic"], False)
    reg = resp.find("wsn-br:PublisherRegistrationReference", NS)
    consumer_ref = resp.find("wsn-br:ConsumerReference", NS)
    assert reg is not None and consumer_ref is not None
    wsn.notify(
        ("tns:myTopic", "<foo/>"),
        url=epr_address(consumer_ref),
        producer="http://publisher.example/p",
    )
    (msg,) = consumer.wait_for_messages(1)
    assert epr_address(msg.find("wsnt:SubscriptionReference", NS)) == sub.address  # type: ignore[arg-type]
    producer = msg.find("wsnt:ProducerReference", NS)
    assert producer is not None and epr_address(producer) == "http://publisher.example/p"
    wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
    wsn.post(epr_address(reg), "<wsn-br:DestroyRegistration/>").ok()
    assert wsn.post(epr_address(reg), "<wsn-br:DestroyRegistration/>").fault == (
        "ResourceUnknownFault"
    )


def test_cxf_null_publisher_reference(client: WsnClient, inbox: NotificationConsumer) -> None:
    client.register_publisher(None, ["tns:myTopicNullEPR"])
    client.subscribe(inbox, "tns:myTopicNullEPR")
    client.notify("<foo/>", "tns:myTopicNullEPR")
    assert inbox.get(timeout=5).payload.tag == "foo"


def test_cxf_publisher_on_demand(wsn: Wsn, consumer_factory: object) -> None:
    make = consumer_factory  # type: ignore[assignment]
    publisher: ConsumerServer = make()  # type: ignore[operator]
    sink: ConsumerServer = make()  # type: ignore[operator]
    _register(wsn, publisher.address("/producer"), ["myTopic1", "myTopic2"], True)
    sub = wsn.subscribe(sink.address(), "tns:myTopic1")
    wait_until(
        lambda: any(op in ("Subscribe", "ResumeSubscription") for op, _ in publisher.control),
        timeout=5,
        what="the broker to subscribe to the demand-based publisher",
    )
    wsn.notify(("tns:myTopic1", "<demand/>"))
    assert len(sink.wait_for_messages(1)) == 1
    wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
    wait_until(
        lambda: any(op in ("Unsubscribe", "PauseSubscription") for op, _ in publisher.control),
        timeout=5,
        what="the broker to pause/unsubscribe at the publisher",
    )


def test_cxf_demand_without_publisher_reference(client: WsnClient) -> None:
    with pytest.raises(PublisherRegistrationFailedFault):
        client.register_publisher(None, ["tns:t"], demand=True)


def test_cxf_custom_payload_round_trips(wsn: Wsn, consumer: ConsumerServer) -> None:
    payload = (
        '<c:CustomType xmlns:c="urn:custom" xmlns:x="urn:other" c:version="2">'
        '<c:a>1</c:a><c:b x:unit="m">2</c:b><c:qname>x:Thing</c:qname></c:CustomType>'
    )
    wsn.subscribe(consumer.address())
    wsn.notify(("tns:myTopic", payload))
    (msg,) = consumer.wait_for_messages(1)
    got = msg.find("wsnt:Message/{urn:custom}CustomType", NS)
    assert got is not None
    assert etree.tostring(got, method="c14n", exclusive=True) == etree.tostring(
        etree.fromstring(payload), method="c14n", exclusive=True
    )
    q = got.findtext("{urn:custom}qname")
    assert q is not None and got.nsmap[q.split(":")[0]] == "urn:other"


# --- ServiceMix WSNComponentTest ------------------------------------------------------------
def test_smx_wsdl_has_notification_broker(wsn: Wsn) -> None:
    data = wsn.http.get(wsn.broker + "?wsdl").content
    doc = etree.fromstring(data)
    wsdl = {"wsdl": "http://schemas.xmlsoap.org/wsdl/"}
    assert doc.xpath("//wsdl:portType[@name='NotificationBroker']", namespaces=wsdl)
    locations = doc.xpath("//*[local-name()='address']/@location")
    assert f"{wsn.server.base_url}/wsn/broker" in locations


def test_smx_invalid_subscription(wsn: Wsn) -> None:
    assert wsn.post(wsn.broker, "<wsnt:Subscribe/>").status == 500


def test_smx_notify_wrapped(wsn: Wsn, consumer: ConsumerServer) -> None:
    wsn.subscribe(consumer.address())
    wsn.notify(("tns:myTopic", "<hello>world</hello>"))
    (rec,) = consumer.wait_for_requests(1)
    assert etree.QName(rec.body_child).localname == "Notify"


def test_smx_raw_notify(client: WsnClient, inbox: NotificationConsumer) -> None:
    client.subscribe(inbox, "tns:myTopic", use_raw=True)
    client.notify("<hello>world</hello>", "tns:myTopic")
    got = inbox.get(timeout=5)
    assert got.raw and got.payload.tag == "hello" and got.payload.text == "world"


def test_smx_unsubscribe_pull(client: WsnClient) -> None:
    pp = client.create_pull_point()
    sub = client.subscribe(pp, "tns:myTopic")
    client.notify("<m/>", "tns:myTopic")
    assert len(wait_until(lambda: pp.get_messages(0), what="message")) == 1
    sub.unsubscribe()
    witness = client.subscribe(pp, "tns:myTopic")
    client.notify("<m/>", "tns:myTopic")
    client.notify("<sentinel/>", "tns:myTopic")
    got = _until_sentinel(lambda: pp.get_messages(0))
    assert [n.subscription_address for n in got] == [witness.address] * 2


def test_smx_pause_resume(client: WsnClient) -> None:
    pp = client.create_pull_point()
    sub = client.subscribe(pp, "tns:myTopic")
    client.notify("<m>1</m>", "tns:myTopic")
    assert len(wait_until(lambda: pp.get_messages(), what="message")) == 1
    sub.pause()
    sub.pause()  # idempotent
    witness = client.subscribe(pp, "tns:myTopic")
    client.notify("<m>2</m>", "tns:myTopic")
    client.notify("<sentinel/>", "tns:myTopic")
    got = _until_sentinel(pp.get_messages)
    assert [n.subscription_address for n in got] == [witness.address] * 2
    sub.resume()
    client.notify("<m>3</m>", "tns:myTopic")
    # policy: paused subscriptions accumulate; resume delivers everything in order
    mine: list[Notification] = []

    def all_three() -> bool:
        mine.extend(n for n in pp.get_messages() if n.subscription_address == sub.address)
        return len(mine) >= 3

    wait_until(all_three, what="the held messages and the new one after resume")
    assert [(m.payload.tag, m.payload.text) for m in mine] == [
        ("m", "2"),
        ("sentinel", None),
        ("m", "3"),
    ]


def test_smx_pull_with_message_content_filter(client: WsnClient) -> None:
    pps = []
    for kind in ("a", "b"):
        pp = client.create_pull_point()
        client.subscribe(pp, "tns:myTopic", message_content=f"@type = '{kind}'")
        pps.append(pp)
    for kind in ("a", "b", "c"):
        client.notify(f"<msg type='{kind}'/>", "tns:myTopic")
    # barrier: a sentinel after them that each filter lets through
    for kind in ("a", "b"):
        client.notify(f"<sentinel type='{kind}'/>", "tns:myTopic")
    for kind, pp in zip(("a", "b"), pps, strict=True):
        got = _until_sentinel(pp.get_messages)
        assert [(n.payload.tag, n.payload.get("type")) for n in got] == [
            ("msg", kind),
            ("sentinel", kind),
        ]


def test_smx_ws_rf_rp(client: WsnClient) -> None:
    assert SIMPLE in client.topic_expression_dialects()


def test_get_current_message(wsn: Wsn) -> None:
    gcm = f"<wsnt:GetCurrentMessage>{wsn.simple('current')}</wsnt:GetCurrentMessage>"
    assert wsn.post(wsn.broker, gcm).fault == "NoCurrentMessageOnTopicFault"
    wsn.notify(
        ("tns:current", '<p:v xmlns:p="urn:p">1</p:v>'),
        ("tns:current", '<p:v xmlns:p="urn:p">2</p:v>'),
    )
    resp = wait_until(
        lambda: (a := wsn.post(wsn.broker, gcm)).status == 200 and a, what="current message"
    )
    body = resp.ok()
    assert body[0].tag == "{urn:p}v" and body[0].text == "2"
    multi = (
        f'<wsnt:GetCurrentMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
        'Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full">tns:current//*'
        "</wsnt:Topic></wsnt:GetCurrentMessage>"
    )
    assert wsn.post(wsn.broker, multi).fault == "MultipleTopicsSpecifiedFault"


def test_notify_batch_many_messages_one_request(
    client: WsnClient, inbox: NotificationConsumer, wsn: Wsn
) -> None:
    client.subscribe(inbox, "tns:myTopic")
    assert client.notify_many([(f"<n>{i}</n>", "tns:myTopic") for i in range(5)]) == 5
    msgs = inbox.wait_for(5)
    assert [m.payload.text for m in msgs] == [str(i) for i in range(5)]
    assert all(m.topic is not None and str(m.topic) == f"{{{wsn.ns}}}myTopic" for m in msgs)
