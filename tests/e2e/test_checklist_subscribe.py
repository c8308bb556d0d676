"""docs/conformance.md §5.2, §6, §7 and §8 over HTTP: Subscribe semantics, filters,
policy and UseRaw, initial termination time, notification metadata and raw delivery.

Each test names the rule ids it proves; ``docs/conformance.md`` maps them back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import isodate
import pytest
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import CONCRETE, FULL, NS, SIMPLE, XPATH, epr_address, subscribe_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

NOTIFY_ACTION = "http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"


def _settle(
    wsn: Wsn, consumer: ConsumerServer, count: int, sentinel: tuple[str, str], subscriptions: int
) -> None:
    """Nothing beyond ``count`` messages arrives: ``sentinel`` (a payload with a
    ``sentinel`` attribute that each of the ``subscriptions`` lets through) is published
    after them, and once every copy of it has come, exactly ``count`` others have."""
    wsn.notify(sentinel)

    def marked(m: etree._Element) -> bool:
        return bool(m.xpath("wsnt:Message/*[@sentinel]", namespaces=NS))

    wait_until(
        lambda: sum(map(marked, consumer.messages())) >= subscriptions,
        what=f"{subscriptions} sentinel(s)",
    )
    assert len([m for m in consumer.messages() if not marked(m)]) == count


def test_identical_subscribes_make_two_subscriptions(wsn: Wsn, consumer: ConsumerServer) -> None:
    """SUB-01, SUB-02: each Subscribe returns its own EPR; the consumer gets two copies."""
    a = wsn.subscribe(consumer.address())
    b = wsn.subscribe(consumer.address())
    assert a.address != b.address
    wsn.notify(("tns:myTopic", "<twice/>"))
    msgs = consumer.wait_for_messages(2)
    refs = {m.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NS) for m in msgs}
    assert refs == {a.address, b.address}
    _settle(wsn, consumer, 2, ("tns:myTopic", '<s sentinel="1"/>'), 2)


def test_filter_children_combine_with_and(wsn: Wsn, consumer: ConsumerServer) -> None:
    """FLT-01, FLT-02, TE-01, MC-01: a TopicExpression and a MessageContent combine with
    AND; any false child suppresses the notification.  Two children of the same kind are
    refused with InvalidFilterFault naming the repeated element (documented deviation:
    one expression per kind; a union is written with the Full dialect's ``|``)."""
    mc = f'<wsnt:MessageContent Dialect="{XPATH}">@ok = "yes"</wsnt:MessageContent>'
    wsn.subscribe(consumer.address(), "tns:a|tns:b", dialect=FULL, extra_filter=mc)
    wsn.subscribe(consumer.address(), "tns:a", extra_filter=mc)
    wsn.notify(
        ("tns:a", '<m ok="yes">1</m>'),  # both subscriptions: topic and content match
        ("tns:b", '<m ok="yes">2</m>'),  # only the union's topic matches
        ("tns:a", '<m ok="no">3</m>'),  # MessageContent false for both
        ("tns:c", '<m ok="yes">4</m>'),  # no topic matches
    )
    msgs = consumer.wait_for_messages(3)
    assert sorted(m.findtext("wsnt:Message/m", namespaces=NS) or "" for m in msgs) == [
        "1",
        "1",
        "2",
    ]
    _settle(wsn, consumer, 3, ("tns:a", '<m ok="yes" sentinel="1"/>'), 2)
    te2 = (
        f'<wsnt:TopicExpression xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:b'
        "</wsnt:TopicExpression>"
    )
    ans = wsn.post(wsn.broker, subscribe_body(consumer.address(), ns=wsn.ns, extra_filter=te2))
    assert ans.fault == "InvalidFilterFault"
    assert ans.body.findtext(".//wsnt:UnknownFilter", namespaces=NS) == "wsnt:TopicExpression"


def test_empty_filter_places_no_constraint(wsn: Wsn, consumer: ConsumerServer) -> None:
    """FLT-03 [derived]: ``<wsnt:Filter/>`` is the same as no Filter: everything arrives."""
    body = subscribe_body(consumer.address(), None, ns=wsn.ns).replace(
        "</wsnt:ConsumerReference>", "</wsnt:ConsumerReference><wsnt:Filter/>"
    )
    ref = wsn.post(wsn.broker, body).ok().find("wsnt:SubscriptionReference", NS)
    assert ref is not None
    marker = f"m{wsn.ns[-8:]}"
    try:
        wsn.notify(("tns:anything", f'<{marker} xmlns="{wsn.ns}"/>'))
        wait_until(
            lambda: any(
                m.find(f"wsnt:Message/{{{wsn.ns}}}{marker}", NS) is not None
                for m in consumer.messages()
            ),
            what="notification through an empty filter",
        )
    finally:  # a subscription to everything is demand for every publisher: remove it
        wsn.post(epr_address(ref), "<wsnt:Unsubscribe/>").ok()


def test_filter_fault_precedence(wsn: Wsn, consumer: ConsumerServer) -> None:
    """FLT-04, FLT-06: an unknown filter child wins over a bad dialect in a sibling, and
    the fault names it; a bad dialect wins over a malformed expression."""
    odd = '<x:Odd xmlns:x="urn:x"/>'
    assert (
        wsn.subscribe_fault(consumer.address(), "tns:a", dialect="urn:nope", extra_filter=odd)
        == "InvalidFilterFault"
    )
    assert (
        wsn.subscribe_fault(consumer.address(), "tns:a//", dialect="urn:nope")
        == "TopicExpressionDialectUnknownFault"
    )


def test_topic_expression_faults_by_dialect(wsn: Wsn, consumer: ConsumerServer) -> None:
    """TE-02, TE-04, TE-05: each WS-Topics dialect is accepted, an unknown dialect URI gets
    TopicExpressionDialectUnknownFault, text that breaks the dialect's grammar gets
    InvalidTopicExpressionFault."""
    for dialect, good, bad in (
        (SIMPLE, "tns:a", "tns:a/b"),
        (CONCRETE, "tns:a/b", "tns:a/*"),
        (FULL, "tns:a//*", "tns:a///"),
    ):
        wsn.subscribe(consumer.address(), good, dialect=dialect)
        assert (
            wsn.subscribe_fault(consumer.address(), bad, dialect=dialect)
            == "InvalidTopicExpressionFault"
        ), dialect
    assert (
        wsn.subscribe_fault(consumer.address(), dialect="http://example.org/my-dialect")
        == "TopicExpressionDialectUnknownFault"
    )


def test_message_content_decisions(wsn: Wsn, consumer: ConsumerServer) -> None:
    """MC-03, MC-04, MC-06 (a, b, c, e): prefixes resolve against the MessageContent
    element, the context is the payload root in its own document (relative and absolute
    paths work), a non-boolean result is converted with boolean(), whitespace is trimmed."""
    p = "urn:checklist:payload"
    for expr in (
        "  p:v = 1  ",  # relative to the payload root, padded
        "/p:Data/p:v = 1",  # absolute
        "p:v[. = 1]",  # a node-set: boolean() of it
    ):
        mc = f'<wsnt:MessageContent xmlns:p="{p}" Dialect="{XPATH}">{expr}</wsnt:MessageContent>'
        wsn.subscribe(consumer.address(), "tns:mc", extra_filter=mc)
    wsn.notify(
        ("tns:mc", f'<q:Data xmlns:q="{p}"><q:v>1</q:v></q:Data>'),
        ("tns:mc", f'<q:Data xmlns:q="{p}"><q:v>2</q:v></q:Data>'),
    )
    msgs = consumer.wait_for_messages(3)
    assert {m.findtext(f"wsnt:Message/{{{p}}}Data/{{{p}}}v", namespaces=NS) for m in msgs} == {"1"}
    sentinel = f'<q:Data xmlns:q="{p}" sentinel="1"><q:v>1</q:v></q:Data>'
    _settle(wsn, consumer, 3, ("tns:mc", sentinel), 3)


def test_unrecognized_policy_names_the_request(wsn: Wsn, consumer: ConsumerServer) -> None:
    """POL-01, POL-03: an unknown SubscriptionPolicy element gets
    UnrecognizedPolicyRequestFault listing its QName."""
    ans = wsn.post(
        wsn.broker,
        subscribe_body(
            consumer.address(), ns=wsn.ns, policy='<x:Rate xmlns:x="urn:x:pol">5</x:Rate>'
        ),
    )
    assert ans.fault == "UnrecognizedPolicyRequestFault"
    el = ans.body.find(".//wsnt:UnrecognizedPolicy", NS)
    assert el is not None
    prefix, local = (el.text or "").split(":")
    assert el.nsmap[prefix] == "urn:x:pol" and local == "Rate"


def test_raw_delivery(wsn: Wsn, consumer: ConsumerServer) -> None:
    """RAW-01, RAW-02, RAW-03, SUB-07, META-07, ACT-01, META-08, META-10: UseRaw (given twice:
    tolerated) delivers the bare payload in the Body, under the Notify action."""
    wsn.subscribe(consumer.address(), policy="<wsnt:UseRaw/><wsnt:UseRaw/>")
    wsn.notify(("tns:myTopic", '<r:raw xmlns:r="urn:r">x</r:raw>'))
    (rec,) = consumer.wait_for_requests(1)
    assert rec.body_child.tag == "{urn:r}raw"
    assert rec.header(f"{{{NS['wsa']}}}Action")[0].text == NOTIFY_ACTION
    wsn.notify(("tns:myTopic", "<sentinel/>"))  # the barrier: nothing else before it
    _first, second = consumer.wait_for_requests(2)
    assert second.body_child.tag == "sentinel"
    assert len(consumer.notifies()) == 2


def test_wrapped_delivery_metadata(wsn: Wsn, consumer: ConsumerServer) -> None:
    """SUB-06, RAW-05, NOT-02, NOT-03, NOT-05, META-01..META-06, META-B1: without UseRaw the
    consumer gets a Notify (Notify action) whose NotificationMessage carries the broker-side
    SubscriptionReference, exactly one Topic in the subscriber's dialect, and the payload."""
    onvif = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"
    subs = {
        dialect: wsn.subscribe(consumer.address(), expr, dialect=dialect)
        for dialect, expr in (
            (SIMPLE, "tns:meta"),
            (CONCRETE, "tns:meta"),
            (FULL, "tns:*"),
            (XPATH, "tns:meta"),
            (onvif, "tns:meta|tns:other"),
        )
    }
    wsn.notify(("tns:meta", '<p:x xmlns:p="urn:p"/>'), producer="http://publisher.example/m")
    consumer.wait_for_messages(len(subs))
    for rec in consumer.notifies():
        assert rec.header(f"{{{NS['wsa']}}}Action")[0].text == NOTIFY_ACTION
    by_sub = {
        m.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NS): m
        for m in consumer.messages()
    }
    for dialect, sub in subs.items():
        msg = by_sub[sub.address]
        (topic,) = msg.findall("wsnt:Topic", NS)
        assert topic.get("Dialect") == dialect
        prefix, local = (topic.text or "").strip().split(":")
        assert topic.nsmap[prefix] == wsn.ns and local == "meta"
        assert msg.findtext("wsnt:ProducerReference/wsa:Address", namespaces=NS) == (
            "http://publisher.example/m"
        )
        assert msg.find("wsnt:Message/{urn:p}x", NS) is not None


def test_notify_without_topic_reaches_only_topicless_subscriptions(
    wsn: Wsn, consumer_factory: object
) -> None:
    """BRK-16, FLT-03: a Notify without wsnt:Topic matches subscriptions with no
    TopicExpression only."""
    make = consumer_factory  # type: ignore[assignment]
    topical: ConsumerServer = make()  # type: ignore[operator]
    everything: ConsumerServer = make()  # type: ignore[operator]
    wsn.subscribe(topical.address(), "tns:myTopic")
    marker = f"nt{wsn.ns[-8:]}"
    expr = f'self::*[local-name()="{marker}"]'
    mc = f'<wsnt:MessageContent Dialect="{XPATH}">{expr}</wsnt:MessageContent>'
    sub = wsn.subscribe(everything.address(), None, extra_filter=mc)
    try:
        wsn.notify((None, f"<{marker}/>"))
        (msg,) = everything.wait_for_messages(1)
        assert msg.find("wsnt:Topic", NS) is None
        wsn.notify(("tns:myTopic", "<sentinel/>"))  # the barrier: after the topic-less one
        (got,) = topical.wait_for_messages(1)
        assert got.find("wsnt:Message/sentinel", NS) is not None
    finally:  # a topic-less subscription is demand for every publisher: remove it
        wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()


def test_initial_termination_time_forms(wsn: Wsn, consumer: ConsumerServer) -> None:
    """ITT-01, ITT-02, ITT-05, ITT-08, TT-01, TT-02: a dateTime without timezone is UTC; a
    duration is added to the broker's clock; the granted time is the TerminationTime
    resource property; CurrentTime and TerminationTime are in the response."""
    when = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    sub = wsn.subscribe(consumer.address(), itt=when.strftime("%Y-%m-%dT%H:%M:%S"))
    tt = isodate.parse_datetime(sub.response.findtext("wsnt:TerminationTime", namespaces=NS))
    assert tt == when
    rp = "<wsrf-rp:GetResourceProperty>wsnt:TerminationTime</wsrf-rp:GetResourceProperty>"
    prop = wsn.post(sub.address, rp).ok()
    assert isodate.parse_datetime(prop.findtext("wsnt:TerminationTime", namespaces=NS)) == tt
    sub = wsn.subscribe(consumer.address(), itt="P1D")
    ct = isodate.parse_datetime(sub.response.findtext("wsnt:CurrentTime", namespaces=NS))
    tt = isodate.parse_datetime(sub.response.findtext("wsnt:TerminationTime", namespaces=NS))
    assert abs((tt - ct) - timedelta(days=1)) < timedelta(seconds=2)


def test_unacceptable_itt_hints_minimum_time(wsn: Wsn, consumer: ConsumerServer) -> None:
    """ITT-03, ITT-07: the fault carries the schema-required MinimumTime (and it is not in
    the past); ``post`` validates the detail against b-2."""
    ans = wsn.post(
        wsn.broker, subscribe_body(consumer.address(), ns=wsn.ns, itt="2001-01-01T00:00:00Z")
    )
    assert ans.fault == "UnacceptableInitialTerminationTimeFault"
    minimum = ans.body.findtext(".//wsnt:MinimumTime", namespaces=NS)
    assert minimum and isodate.parse_datetime(minimum) > datetime(2001, 1, 2, tzinfo=UTC)


def test_raw_payload_bytes_identical(wsn: Wsn, consumer: ConsumerServer) -> None:
    """NOT-03, GEN-08 (payload format is the publisher's): the delivered Message is the
    published payload, canonically equal."""
    payload = '<d:doc xmlns:d="urn:d" d:a="1"><d:c>text &amp; more</d:c><!--c--></d:doc>'
    wsn.subscribe(consumer.address())
    wsn.notify(("tns:myTopic", payload))
    (msg,) = consumer.wait_for_messages(1)
    got = msg.find("wsnt:Message/{urn:d}doc", NS)
    assert got is not None
    assert etree.tostring(
        got, method="c14n", exclusive=True, with_comments=False
    ) == etree.tostring(
        etree.fromstring(payload), method="c14n", exclusive=True, with_comments=False
    )
