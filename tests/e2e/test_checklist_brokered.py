"""docs/conformance.md §5.3, §5.11-§5.12, §10 and §11 over HTTP: GetCurrentMessage,
RegisterPublisher and DestroyRegistration, broker and registration resource properties,
Notify from unregistered publishers and on new topics.

Each test names the rule ids it proves; ``docs/conformance.md`` maps them back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import isodate
import pytest
from lxml import etree

from tests.e2e.conftest import Answer, Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, SIMPLE, epr_address
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def _register(wsn: Wsn, inner: str) -> Answer:
    return wsn.post(wsn.broker, f"<wsn-br:RegisterPublisher>{inner}</wsn-br:RegisterPublisher>")


def _topic(wsn: Wsn, local: str) -> str:
    return f'<wsn-br:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:{local}</wsn-br:Topic>'


def _itt(value: str) -> str:
    return f"<wsn-br:InitialTerminationTime>{value}</wsn-br:InitialTerminationTime>"


def _rp(wsn: Wsn, address: str, name: str) -> etree._Element:
    body = f"<wsrf-rp:GetResourceProperty>{name}</wsrf-rp:GetResourceProperty>"
    return wsn.post(address, body).ok()


def test_subscription_property_document(wsn: Wsn, consumer: ConsumerServer) -> None:
    """RP-02, SRP-03: the SubscriptionManagerRP document is b-2-valid (``post`` validates
    it) with ConsumerReference and CreationTime; the filter is echoed."""
    sub = wsn.subscribe(consumer.address())
    doc = wsn.post(sub.address, "<wsrf-rp:GetResourcePropertyDocument/>").ok()
    rp = doc.find("wsnt:SubscriptionManagerRP", NS)
    assert rp is not None
    assert [etree.QName(c).localname for c in rp] == ["ConsumerReference", "Filter", "CreationTime"]


def test_get_current_message_is_a_non_destructive_raw_read(wsn: Wsn) -> None:
    """GCM-01, GCM-04, GCM-B1, §14.5: the response holds the last payload itself (no
    NotificationMessage wrapper) and reading it twice gives it twice."""
    gcm = f"<wsnt:GetCurrentMessage>{wsn.simple('last')}</wsnt:GetCurrentMessage>"
    wsn.notify(("tns:last", '<p:v xmlns:p="urn:p">1</p:v>'))
    first = wait_until(lambda: (a := wsn.post(wsn.broker, gcm)).status == 200 and a, what="current")
    body = first.ok()
    assert [c.tag for c in body] == ["{urn:p}v"]
    assert wsn.post(wsn.broker, gcm).ok()[0].text == "1"


def test_get_current_message_faults(wsn: Wsn) -> None:
    """GCM-02, GCM-04: no cached message → NoCurrentMessageOnTopicFault; a bad dialect or
    expression → the topic faults; a missing Topic gets a fault too."""
    gcm = f"<wsnt:GetCurrentMessage>{wsn.simple('never')}</wsnt:GetCurrentMessage>"
    assert wsn.post(wsn.broker, gcm).fault == "NoCurrentMessageOnTopicFault"
    bad = gcm.replace(SIMPLE, "urn:nope")
    assert wsn.post(wsn.broker, bad).fault == "TopicExpressionDialectUnknownFault"
    bad = gcm.replace("tns:never", "tns:never/child")
    assert wsn.post(wsn.broker, bad).fault == "InvalidTopicExpressionFault"
    assert wsn.post(wsn.broker, "<wsnt:GetCurrentMessage/>", validate=False).status == 500


def test_register_publisher_response_and_properties(wsn: Wsn) -> None:
    """REG-01, REG-05, REG-07, REG-12, REG-13, REG-14, PRP-01, DEM-07, LIFE-02: every request
    creates a new registration; the response has the registration EPR and, for Demand=false,
    a ConsumerReference; the resource properties follow PublisherRegistrationRP."""
    when = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    inner = (
        "<wsn-br:PublisherReference><wsa:Address>http://publisher.example/reg</wsa:Address>"
        f"</wsn-br:PublisherReference>{_topic(wsn, 'r1')}{_topic(wsn, 'r2')}"
        f"<wsn-br:Demand>false</wsn-br:Demand>{_itt(when.strftime('%Y-%m-%dT%H:%M:%SZ'))}"
    )
    refs = []
    for _ in range(2):
        resp = _register(wsn, inner).ok()
        reg = resp.find("wsn-br:PublisherRegistrationReference", NS)
        assert reg is not None and resp.find("wsn-br:ConsumerReference", NS) is not None
        refs.append(epr_address(reg))
    assert refs[0] != refs[1]
    # the document is br-2-valid (``post`` validates it); the times are read one by one
    doc = wsn.post(refs[0], "<wsrf-rp:GetResourcePropertyDocument/>").ok()
    rp = doc.find("wsn-br:PublisherRegistrationRP", NS)
    assert rp is not None
    tt = _rp(wsn, refs[0], "wsnt:TerminationTime").findtext("wsnt:TerminationTime", namespaces=NS)
    assert isodate.parse_datetime(tt) == when
    assert rp.findtext("wsn-br:CreationTime", namespaces=NS)
    assert rp.findtext("wsn-br:Demand", namespaces=NS) == "false"
    assert len(rp.findall("wsn-br:Topic", NS)) == 2
    assert rp.findtext("wsn-br:PublisherReference/wsa:Address", namespaces=NS) == (
        "http://publisher.example/reg"
    )
    for ref in refs:
        wsn.post(ref, "<wsn-br:DestroyRegistration/>").ok()


def test_register_publisher_times(wsn: Wsn) -> None:
    """REG-07, REG-08, REG-10, LIFE-01, LIFE-02: a past time →
    UnacceptableInitialTerminationTimeFault; no timezone is UTC; absent → the finite
    configured default; nil follows the infinite-lifetime policy.  LIFE-01 (decision): an
    xsd:duration, outside the dateTime-only schema type, is accepted leniently like in
    Subscribe (relative to the broker's clock)."""
    assert _register(wsn, _topic(wsn, "t") + _itt("2001-01-01T00:00:00Z")).fault == (
        "UnacceptableInitialTerminationTimeFault"
    )
    resp = wsn.post(
        wsn.broker,
        f"<wsn-br:RegisterPublisher>{_topic(wsn, 't')}{_itt('PT1H')}</wsn-br:RegisterPublisher>",
        validate=False,
    ).ok(validate=False)
    reg = epr_address(resp.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    tt = _rp(wsn, reg, "wsnt:TerminationTime").findtext("wsnt:TerminationTime", namespaces=NS)
    delta = isodate.parse_datetime(tt) - datetime.now(UTC)
    assert timedelta(minutes=59) < delta <= timedelta(hours=1)
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    resp = _register(wsn, _topic(wsn, "t") + _itt(when.strftime("%Y-%m-%dT%H:%M:%S"))).ok()
    reg = epr_address(resp.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    tt = _rp(wsn, reg, "wsnt:TerminationTime").findtext("wsnt:TerminationTime", namespaces=NS)
    assert isodate.parse_datetime(tt) == when
    resp = _register(wsn, _topic(wsn, "t")).ok()
    reg = epr_address(resp.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    tt = _rp(wsn, reg, "wsnt:TerminationTime").findtext("wsnt:TerminationTime", namespaces=NS)
    assert datetime.now(UTC) < isodate.parse_datetime(tt) < datetime.now(UTC) + timedelta(days=400)
    nil = '<wsn-br:InitialTerminationTime xsi:nil="true"/>'
    ans = wsn.post(
        wsn.broker,
        f"<wsn-br:RegisterPublisher>{_topic(wsn, 't')}{nil}</wsn-br:RegisterPublisher>",
        validate=False,  # nil on a non-nillable element (§14.8): accepted leniently
    )
    policy = etree.fromstring(wsn.http.get(f"{wsn.server.base_url}/wsn/policy").content)
    if policy.findtext("{urn:wsnmom:policy:1}InfiniteTerminationAllowed") == "true":
        assert ans.status == 200
    else:
        assert ans.fault == "UnacceptableInitialTerminationTimeFault"


def test_register_publisher_faults(wsn: Wsn) -> None:
    """REG-04, REG-16, §5.11 [GAP] dialect: Demand=true without PublisherReference →
    PublisherRegistrationFailedFault; an unknown dialect or malformed topic →
    InvalidTopicExpressionFault (BR lists no dialect fault)."""
    demand = f"{_topic(wsn, 'd')}<wsn-br:Demand>true</wsn-br:Demand>"
    assert _register(wsn, demand).fault == "PublisherRegistrationFailedFault"
    assert _register(wsn, _topic(wsn, "d").replace(SIMPLE, "urn:nope")).fault == (
        "InvalidTopicExpressionFault"
    )
    assert _register(wsn, _topic(wsn, "a/b")).fault == "InvalidTopicExpressionFault"


def test_destroy_registration(wsn: Wsn) -> None:
    """DREG-02, DREG-03, PRM-01: DestroyRegistration succeeds once; afterwards the
    registration is unknown."""
    resp = _register(wsn, _topic(wsn, "x")).ok()
    reg = epr_address(resp.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    wsn.post(reg, "<wsn-br:DestroyRegistration/>").ok()
    assert wsn.post(reg, "<wsn-br:DestroyRegistration/>").fault == "ResourceUnknownFault"
    assert wsn.post(
        reg, "<wsrf-rp:GetResourceProperty>wsn-br:Demand</wsrf-rp:GetResourceProperty>"
    ).fault == ("ResourceUnknownFault")


def test_broker_property_document(wsn: Wsn) -> None:
    """BRP-01, RP-01, RP-03, RP-05, §14.7: the NotificationBrokerRP document has the four
    producer properties and RequiresRegistration (1..1); every property is readable by
    GetResourceProperty; the dialects include the three WS-Topics ones."""
    doc = wsn.post(wsn.broker, "<wsrf-rp:GetResourcePropertyDocument/>").ok()
    rp = doc[0]
    assert rp.tag == "{http://docs.oasis-open.org/wsn/br-2}NotificationBrokerRP"
    assert len(rp.findall("wsn-br:RequiresRegistration", NS)) == 1
    assert rp.findtext("wsn-br:RequiresRegistration", namespaces=NS) == "false"
    assert rp.find("{http://docs.oasis-open.org/wsn/t-1}TopicSet") is not None
    dialects = {e.text for e in rp.findall("wsnt:TopicExpressionDialect", NS)}
    assert {
        SIMPLE,
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete",
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full",
    } <= dialects
    assert rp.findtext("wsnt:FixedTopicSet", namespaces=NS) == "false"
    for name in ("wsnt:TopicExpressionDialect", "wsnt:FixedTopicSet", "wstop:TopicSet"):
        body = (
            '<wsrf-rp:GetResourceProperty xmlns:wstop="http://docs.oasis-open.org/wsn/t-1">'
            f"{name}</wsrf-rp:GetResourceProperty>"
        )
        wsn.post(wsn.broker, body).ok()


def test_unregistered_notify_on_a_new_topic_grows_the_topic_set(
    wsn: Wsn, consumer: ConsumerServer
) -> None:
    """BRK-08, BRK-10, BRK-12, BRK-15, NOT-B1, BRK-17, TE-06 [derived]: RequiresRegistration
    is false, so an unregistered Notify is distributed; FixedTopicSet is false, so a new
    topic is created and then listed in the TopicExpression property."""
    wsn.subscribe(consumer.address(), "tns:brandnew")
    wsn.notify(("tns:brandnew", "<b/>"))
    assert len(consumer.wait_for_messages(1)) == 1
    resp = _rp(wsn, wsn.broker, "wsnt:TopicExpression")
    listed = [
        (e.nsmap.get((e.text or "").split(":")[0]), (e.text or "").split(":")[-1])
        for e in resp.findall("wsnt:TopicExpression", NS)
    ]
    assert (wsn.ns, "brandnew") in listed


def test_notify_through_registration_consumer_reference(wsn: Wsn, consumer: ConsumerServer) -> None:
    """REG-15, BRK-13: Notify posted to the registration's ConsumerReference is
    distributed like any Notify."""
    wsn.subscribe(consumer.address(), "tns:viaReg")
    resp = _register(wsn, _topic(wsn, "viaReg")).ok()
    ref = resp.find("wsn-br:ConsumerReference", NS)
    assert ref is not None
    wsn.notify(("tns:viaReg", "<v/>"), url=epr_address(ref))
    assert len(consumer.wait_for_messages(1)) == 1


def test_unspecified_behaviour_is_advertised(wsn: Wsn) -> None:
    """§14.18, GCM-03, RES-05, CPP-04, PP-07, PP-09, PP-B1, BRK-03, BRK-04, DPP-04, SUB-03,
    POL-02: every choice the specifications leave open is in the broker policy document
    (``GET /wsn/policy``, also a resource property and WS-Policy in the WSDL)."""
    policy = etree.fromstring(wsn.http.get(f"{wsn.server.base_url}/wsn/policy").content)
    p = "{urn:wsnmom:policy:1}"
    for name in (
        "FilterCombination",
        "NoTopicFilter",
        "DefaultTerminationTime",
        "PauseBehaviour",
        "DeliveryOrder",
        "DeliveryGuarantee",
        "GetMessagesOrder",
        "GetMessagesMaximumNumber",
        "PullPointNotify",
        "PullPointDestroyWithSubscriptions",
        "UseRawSupported",
        "Demand",
        "UnregisteredNotify",
        "TopiclessNotify",
        "UnknownTopicNotify",
        "CurrentMessage",
        "SubscriptionPersistence",
        "Retry",
        "Accumulation",
    ):
        assert policy.findtext(f"{p}{name}") or len(policy.find(f"{p}{name}") or []), name
    assert (policy.findtext(f"{p}GetMessagesOrder") or "").startswith("FIFO")
    wsdl = wsn.http.get(wsn.broker + "?wsdl").content
    assert b"urn:wsnmom:policy:1" in wsdl
