"""Unit tests of the XML layer, envelope parsing, the WS-N codec and fault rendering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import isodate
import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    SoapVersion,
    Subscription,
)
from wsnmom.soap_frontend import codec
from wsnmom.soap_frontend.envelope import HttpError, build_envelope, parse_request
from wsnmom.soap_frontend.faults import BaseFaultError, fault_detail, fault_for_error
from wsnmom.soap_frontend.splice import Spliced
from wsnmom.soap_frontend.xml import XmlRejected, parse_xml, serialize_standalone
from wsnmom.topic_mapping.model import Topic

from tests.support.soap import CONCRETE, SIMPLE, WSA, WSNT, envelope, notify_body, subscribe_body
from tests.support.wsn_schemas import assert_valid

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CT12 = "application/soap+xml"


def body_of(body: str) -> etree._Element:
    return parse_request("POST", CT12, envelope(body)).body


# --- hardened parser ------------------------------------------------------------------
def test_parser_refuses_dtd_and_entities() -> None:
    bomb = b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "yyyy">]><a>&x;</a>'
    with pytest.raises(XmlRejected):
        parse_xml(bomb)


def test_parser_refuses_external_entity() -> None:
    xxe = b'<!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]><a>&x;</a>'
    with pytest.raises(XmlRejected):
        parse_xml(xxe)


def test_parser_depth_limit() -> None:
    deep = b"<a>" * 200 + b"</a>" * 200
    with pytest.raises(XmlRejected, match="deeper"):
        parse_xml(deep)
    assert parse_xml(b"<a>" * 50 + b"</a>" * 50) is not None


def test_serialize_standalone_keeps_needed_namespaces() -> None:
    doc = parse_xml(
        b'<r xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:p="urn:p" xmlns:q="urn:q">'
        b"<p:payload><q:x>p:QNameInText</q:x></p:payload></r>"
    )
    data = serialize_standalone(doc[0])
    again = etree.fromstring(data)
    assert again.tag == "{urn:p}payload"
    assert again.nsmap.get("p") == "urn:p"
    assert b"soap-envelope" not in data
    nested = parse_xml(
        b'<r xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2"><wsnt:Filter>'
        b'<wsnt:TopicExpression xmlns:tns="urn:t">tns:a</wsnt:TopicExpression></wsnt:Filter></r>'
    )
    again = etree.fromstring(serialize_standalone(nested[0]))
    assert again[0].nsmap["tns"] == "urn:t"


# --- envelope ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "ctype", "data", "status"),
    [
        ("GET", CT12, b"", 405),
        ("POST", "application/json", b"{}", 415),
        ("POST", CT12, b"garbage <<", 400),
        ("POST", CT12, b"<notsoap/>", 400),
    ],
)
def test_transport_errors(method: str, ctype: str, data: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        parse_request(method, ctype, data)
    assert info.value.status == status


def test_soap11_and_addressing_headers() -> None:
    data = envelope(
        "<wsnt:Unsubscribe/>",
        version="1.1",
        action="urn:a",
        to="http://h/wsn/subscriptions/x",
        message_id="urn:uuid:1",
        headers='<wsnmom:ResourceId xmlns:wsnmom="urn:wsnmom:ns:1" '
        'wsa:IsReferenceParameter="true">x</wsnmom:ResourceId>',
    )
    req = parse_request("POST", "application/soap+xml", data)  # lenient on the media type
    assert req.version is SoapVersion.SOAP11
    assert req.addressing.action == "urn:a"
    assert req.addressing.to == "http://h/wsn/subscriptions/x"
    assert req.addressing.message_id == "urn:uuid:1"
    assert [h.text for h in req.addressing.other_headers] == ["x"]
    assert req.operation == f"{{{WSNT}}}Unsubscribe"


def test_build_envelope_relates_to() -> None:
    env = build_envelope(SoapVersion.SOAP11, [], action="urn:x", relates_to="urn:uuid:1")
    assert env.tag == "{http://schemas.xmlsoap.org/soap/envelope/}Envelope"
    assert env.findtext("{*}Header/{http://www.w3.org/2005/08/addressing}RelatesTo") == (
        "urn:uuid:1"
    )


# --- Subscribe --------------------------------------------------------------------------
def test_parse_subscribe_full() -> None:
    body = body_of(
        subscribe_body(
            "http://c/x",
            "tns:a/b",
            dialect=CONCRETE,
            itt="PT60S",
            extra_filter=(
                '<wsnt:MessageContent xmlns:m="urn:m" '
                'Dialect="http://www.w3.org/TR/1999/REC-xpath-19991116">'
                "boolean(m:x)</wsnt:MessageContent>"
            ),
            policy="<wsnt:UseRaw/>",
            extra=(
                '<nato:SubscriptionEndTopic xmlns:nato="http://nc3a.nato.int/ces/wsn/extension" '
                f'xmlns:e="urn:end" Dialect="{SIMPLE}">e:End</nato:SubscriptionEndTopic>'
            ),
            consumer_params='<p:Key xmlns:p="urn:p">42</p:Key>',
        )
    )
    req = codec.parse_subscribe(body, SoapVersion.SOAP11)
    assert req.consumer.address == "http://c/x"
    assert len(req.consumer.reference_parameters) == 1
    assert req.topic is not None and req.topic.text == "tns:a/b"
    assert req.topic.namespaces["tns"] == "urn:test:topics"
    assert req.topic.dialect == CONCRETE
    assert req.message_content is not None and req.message_content.namespaces["m"] == "urn:m"
    assert req.initial_termination_time == timedelta(seconds=60)
    assert req.use_raw
    assert req.subscription_end_topic is not None
    assert req.subscription_end_topic.namespaces["e"] == "urn:end"
    assert req.soap_version is SoapVersion.SOAP11
    assert req.filter_xml and b"TopicExpression" in req.filter_xml


@pytest.mark.parametrize(
    ("itt", "expected", "invalid"),
    [
        ("2030-01-01T00:00:00Z", datetime(2030, 1, 1, tzinfo=UTC), False),
        ("2030-01-01T00:00:00", datetime(2030, 1, 1, tzinfo=UTC), False),  # no tz → UTC
        ("P1D", timedelta(days=1), False),
        ("PT48H2M1S", timedelta(hours=48, minutes=2, seconds=1), False),
        ("P48H2M1S", None, True),  # hours need the T designator in xsd:duration
        ("P2Y", isodate.Duration(years=2), False),
        ("gibberish", None, True),
    ],
)
def test_parse_subscribe_times(itt: str, expected: object, invalid: bool) -> None:
    req = codec.parse_subscribe(body_of(subscribe_body("http://c", itt=itt)), SoapVersion.SOAP12)
    assert req.initial_termination_time == expected
    assert req.initial_termination_time_invalid is invalid


def test_parse_subscribe_nil_and_empty_itt() -> None:
    nil = subscribe_body("http://c").replace(
        "</wsnt:Filter>",
        '</wsnt:Filter><wsnt:InitialTerminationTime xsi:nil="true"/>',
    )
    req = codec.parse_subscribe(body_of(nil), SoapVersion.SOAP12)
    assert req.initial_termination_time is codec.INFINITE
    empty = nil.replace(' xsi:nil="true"', "")
    req = codec.parse_subscribe(body_of(empty), SoapVersion.SOAP12)
    assert req.initial_termination_time_invalid


def test_parse_subscribe_without_consumer() -> None:
    with pytest.raises(errors.SubscribeCreationFailed):
        codec.parse_subscribe(body_of("<wsnt:Subscribe/>"), SoapVersion.SOAP12)


def test_parse_subscribe_unknown_filter_lists_qnames() -> None:
    body = body_of(subscribe_body("http://c", extra_filter='<x:Odd xmlns:x="urn:x"/>'))
    with pytest.raises(errors.InvalidFilter) as info:
        codec.parse_subscribe(body, SoapVersion.SOAP12)
    assert info.value.unknown_filters == ("{urn:x}Odd",)  # type: ignore[attr-defined]
    detail = fault_detail(info.value, now=NOW, originator=None)
    assert_valid(detail)
    assert detail.findtext(f"{{{WSNT}}}UnknownFilter", "").endswith(":Odd")


def test_parse_subscribe_policy_collects_unknown() -> None:
    body = body_of(subscribe_body("http://c", policy='<x:Rate xmlns:x="urn:x">3</x:Rate>'))
    req = codec.parse_subscribe(body, SoapVersion.SOAP12)
    assert req.unsupported_policy == ("{urn:x}Rate",)


# --- other requests ---------------------------------------------------------------------
def test_parse_notify_many_messages() -> None:
    body = body_of(
        notify_body(
            ("tns:a", '<foo xmlns="urn:test:org">bar</foo>'),
            (None, '<p:x xmlns:p="urn:p" a="1"/>'),
            producer="http://producer",
        )
    )
    msgs = codec.parse_notify(body)
    assert len(msgs) == 2
    assert msgs[0].topic is not None and msgs[0].topic.namespaces["tns"] == "urn:test:topics"
    assert etree.fromstring(msgs[0].payload).tag == "{urn:test:org}foo"
    assert msgs[1].topic is None
    assert msgs[0].producer_reference == EndpointReference("http://producer")


@pytest.mark.parametrize(
    "body",
    [
        "<wsnt:Notify/>",
        "<wsnt:Notify><wsnt:NotificationMessage/></wsnt:Notify>",
        "<wsnt:Notify><wsnt:NotificationMessage><wsnt:Message>text only</wsnt:Message>"
        "</wsnt:NotificationMessage></wsnt:Notify>",
    ],
)
def test_parse_notify_malformed(body: str) -> None:
    with pytest.raises(BaseFaultError):
        codec.parse_notify(body_of(body))


def test_parse_register_publisher() -> None:
    body = body_of(
        "<wsn-br:RegisterPublisher><wsn-br:PublisherReference><wsa:Address>http://p"
        "</wsa:Address></wsn-br:PublisherReference>"
        f'<wsn-br:Topic xmlns:t="urn:t" Dialect="{SIMPLE}">t:a</wsn-br:Topic>'
        f'<wsn-br:Topic xmlns:t="urn:t" Dialect="{SIMPLE}">t:b</wsn-br:Topic>'
        "<wsn-br:Demand>true</wsn-br:Demand>"
        "<wsn-br:InitialTerminationTime>2030-01-01T00:00:00Z</wsn-br:InitialTerminationTime>"
        "</wsn-br:RegisterPublisher>"
    )
    req = codec.parse_register_publisher(body)
    assert req.publisher_reference == EndpointReference("http://p")
    assert [t.text for t in req.topics] == ["t:a", "t:b"]
    assert req.demand
    assert req.initial_termination_time == datetime(2030, 1, 1, tzinfo=UTC)


def test_parse_register_publisher_demand_without_reference() -> None:
    body = body_of(
        "<wsn-br:RegisterPublisher><wsn-br:Demand>true</wsn-br:Demand></wsn-br:RegisterPublisher>"
    )
    with pytest.raises(errors.PublisherRegistrationFailed):
        codec.parse_register_publisher(body)


def test_parse_create_pull_point_queue_name() -> None:
    body = body_of('<wsnt:CreatePullPoint wsnt:pullPointQueueName="testQueue"/>')
    assert codec.parse_create_pull_point(body).name == "testQueue"
    assert codec.parse_create_pull_point(body_of("<wsnt:CreatePullPoint/>")).name is None


@pytest.mark.parametrize(("text", "value"), [("10", 10), ("0", 0), (None, None)])
def test_parse_get_messages(text: str | None, value: int | None) -> None:
    inner = f"<wsnt:MaximumNumber>{text}</wsnt:MaximumNumber>" if text is not None else ""
    assert codec.parse_get_messages(body_of(f"<wsnt:GetMessages>{inner}</wsnt:GetMessages>")) == (
        value
    )


@pytest.mark.parametrize("text", ["-1", "ten", ""])
def test_parse_get_messages_invalid(text: str) -> None:
    with pytest.raises(errors.UnableToGetMessages):
        codec.parse_get_messages(
            body_of(
                f"<wsnt:GetMessages><wsnt:MaximumNumber>{text}</wsnt:MaximumNumber>"
                "</wsnt:GetMessages>"
            )
        )


def test_parse_renew_and_rp_names() -> None:
    value, invalid = codec.parse_renew(
        body_of("<wsnt:Renew><wsnt:TerminationTime>P1D</wsnt:TerminationTime></wsnt:Renew>")
    )
    assert value == timedelta(days=1) and not invalid
    assert codec.parse_renew(body_of("<wsnt:Renew/>")) == (None, True)
    name = codec.parse_get_resource_property(
        body_of(
            "<wsrf-rp:GetResourceProperty>wsnt:TopicExpressionDialect</wsrf-rp:GetResourceProperty>"
        )
    )
    assert name == f"{{{WSNT}}}TopicExpressionDialect"
    with pytest.raises(errors.InvalidResourcePropertyQName):
        codec.parse_get_resource_property(
            body_of("<wsrf-rp:GetResourceProperty>nope:X</wsrf-rp:GetResourceProperty>")
        )


# --- builders validate against the OASIS schemas ----------------------------------------
def _sub() -> Subscription:
    return Subscription(
        "abc",
        EndpointReference("http://c"),
        NOW,
        NOW + timedelta(hours=1),
        filter_xml=b'<wsnt:Filter xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2"/>',
    )


def test_responses_are_schema_valid() -> None:
    sub = _sub()
    resp = codec.subscribe_response(sub, "http://b/wsn/subscriptions/abc", NOW)
    assert_valid(resp)
    assert resp.findtext(f"{{{WSNT}}}TerminationTime") == "2026-01-01T13:00:00Z"
    assert_valid(codec.renew_response(sub, NOW))
    sub.termination_time = None
    nil = codec.renew_response(sub, NOW)
    assert_valid(nil)
    assert (
        nil.find(f"{{{WSNT}}}TerminationTime").get(  # type: ignore[union-attr]
            "{http://www.w3.org/2001/XMLSchema-instance}nil"
        )
        == "true"
    )
    pp = PullPoint("pp1", NOW, None, "q")
    assert_valid(codec.create_pull_point_response(pp, "http://b/wsn/pullpoints/pp1"))
    reg = PublisherRegistration("r1", NOW, None, None)
    assert_valid(codec.register_publisher_response(reg, "http://b/r/r1", "http://b/wsn/broker"))
    for tag in ("UnsubscribeResponse", "PauseSubscriptionResponse", "DestroyPullPointResponse"):
        assert_valid(codec.empty_response(codec.T(tag)))
    assert_valid(codec.empty_response(codec.BR("DestroyRegistrationResponse")))


def _tree(body: Spliced) -> etree._Element:
    return etree.fromstring(body.to_bytes())


def test_notify_rendering_declares_topic_prefix() -> None:
    msg = NotificationMessage(
        "m1",
        b'<foo xmlns="urn:test:org">bar</foo>',
        Topic("urn:test:topics", ("a", "b")),
        producer_reference=EndpointReference("http://producer"),
    )
    ref = codec.resource_epr("http://b/wsn/subscriptions/abc", "abc")
    notify = codec.notify_element([Delivered(msg, "abc", ref), Delivered(msg, "abc", ref)])
    again = etree.fromstring(notify.to_bytes())
    assert_valid(again)
    topic = again.find(f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Topic")
    assert topic is not None
    prefix, _, path = (topic.text or "").partition(":")
    assert topic.nsmap[prefix] == "urn:test:topics" and path == "a/b"
    assert topic.get("Dialect") == CONCRETE
    payload = again.find(f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Message/{{urn:test:org}}foo")
    assert payload is not None and payload.text == "bar"
    root = NotificationMessage("m2", b"<x/>", Topic("urn:t", ("a",)))
    simple = _tree(codec.notify_element([Delivered(root, "s")])).find(f".//{{{WSNT}}}Topic")
    assert simple is not None and simple.get("Dialect") == SIMPLE


def test_get_messages_and_current_message_valid() -> None:
    msg = NotificationMessage("m1", b'<p:x xmlns:p="urn:p"/>', Topic("urn:t", ("a",)))
    assert_valid(_tree(codec.get_messages_response([msg, msg])))
    assert_valid(_tree(codec.get_messages_response([])))
    gcm = _tree(codec.get_current_message_response(msg))
    assert_valid(gcm)
    assert gcm[0].tag == "{urn:p}x"


def test_get_messages_renders_subscription_reference() -> None:
    """A message a subscription fed into a pull point carries that subscription's
    reference; GetMessages returns it as accumulated (GM-07), schema-valid."""
    ref = codec.resource_epr("http://b/wsn/subscriptions/s1", "s1")
    fed = NotificationMessage(
        "m1",
        b'<p:x xmlns:p="urn:p"/>',
        Topic("urn:t", ("a",)),
        producer_reference=EndpointReference("http://producer"),
        subscription_reference=ref,
    )
    direct = NotificationMessage("m2", b"<y/>", Topic("urn:t", ("a",)))
    resp = _tree(codec.get_messages_response([fed, direct]))
    assert_valid(resp)
    first, second = resp.findall(f"{{{WSNT}}}NotificationMessage")
    assert [etree.QName(c).localname for c in first] == [
        "SubscriptionReference",
        "Topic",
        "ProducerReference",
        "Message",
    ]
    address = first.findtext(f"{{{WSNT}}}SubscriptionReference/{{{WSA}}}Address")
    assert address == "http://b/wsn/subscriptions/s1"
    assert first.find(f"{{{WSNT}}}SubscriptionReference/{{{WSA}}}ReferenceParameters") is not None
    assert second.find(f"{{{WSNT}}}SubscriptionReference") is None


def test_resource_property_documents_valid() -> None:
    from tests.soap_frontend.fake_service import FakeService

    svc = FakeService()
    table = codec.broker_properties(svc)
    names = [n for n in table if "wsnmom" not in n]
    resp = codec.get_resource_property_response(table, names, multiple=True)
    assert_valid(resp)
    tags = [etree.QName(c).localname for c in resp]
    assert tags[:2] == ["TopicExpression", "FixedTopicSet"]
    assert "RequiresRegistration" in tags and "TopicSet" in tags
    sub_table = codec.subscription_properties(_sub(), NOW)
    wsn = [n for n in sub_table if n.startswith("{http://docs.oasis-open.org/wsn/")]
    assert len(wsn) == 6
    assert_valid(codec.get_resource_property_response(sub_table, wsn, multiple=True))
    reg = PublisherRegistration(
        "r",
        NOW,
        NOW,
        EndpointReference("http://p"),
        (ExpressionSource(SIMPLE, "t:a", {"t": "urn:t"}),),
    )
    reg_table = codec.registration_properties(reg, NOW)
    # the WS-N ones (the schemas at hand have no rl-2 for the WSRL times, as for subscriptions)
    reg_wsn = [n for n in reg_table if n.startswith("{http://docs.oasis-open.org/wsn/")]
    assert len(reg_wsn) == 6 and len(reg_table) == 8
    assert_valid(codec.get_resource_property_response(reg_table, reg_wsn, multiple=True))
    with pytest.raises(errors.InvalidResourcePropertyQName):
        codec.get_resource_property_response(table, ["{urn:x}Nope"])


def test_policy_element_from_dataclass() -> None:
    from tests.soap_frontend.fake_service import Policy

    el = codec.policy_element(Policy())
    names = [etree.QName(c).localname for c in el]
    assert names == [
        "FilterCombination",
        "DefaultTerminationTime",
        "UseRawSupported",
        "Nested",
        "Nested",
    ]
    assert el[1].text == "PT1H"


# --- faults -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", sorted(errors.ALL_FAULTS.values(), key=lambda c: c.fault_name))
@pytest.mark.parametrize("version", list(SoapVersion))
def test_every_fault_renders_schema_valid(cls: type[errors.WsnError], version: SoapVersion) -> None:
    err = cls("something went wrong")
    fault, action, _rendered = fault_for_error(
        err, version, now=NOW, originator=EndpointReference("http://b/wsn/broker")
    )
    detail = next(iter(fault.iter("{*}Detail", "detail")))[0]
    assert detail.tag == f"{{{cls.namespace}}}{cls.fault_name}"
    assert_valid(detail)
    assert detail.findtext("{http://docs.oasis-open.org/wsrf/bf-2}Timestamp") == (
        "2026-01-01T12:00:00Z"
    )
    if cls.namespace.startswith("http://docs.oasis-open.org/wsn/"):
        assert action == "http://docs.oasis-open.org/wsn/fault"
    code = fault.findtext("faultcode") or fault.findtext("{*}Code/{*}Value")
    assert code is not None and code.endswith(("Client", "Sender", "Server", "Receiver"))


def test_unexpected_exception_does_not_leak() -> None:
    fault, _, rendered = fault_for_error(RuntimeError("secret /etc/passwd"), SoapVersion.SOAP12)
    text = etree.tostring(fault)
    assert b"secret" not in text and b"Traceback" not in text
    assert rendered.code == "Receiver"


def test_topic_mapping_errors_map_to_faults() -> None:
    from wsnmom.topic_mapping import errors as terr

    _, _, rendered = fault_for_error(terr.InvalidTopicExpression("bad"), SoapVersion.SOAP12)
    assert rendered.fault_name == "InvalidTopicExpressionFault"


def test_unacceptable_time_fault_hints() -> None:
    err = errors.UnacceptableTerminationTime("too late")
    err.maximum_time = NOW + timedelta(days=30)  # type: ignore[attr-defined]
    detail = fault_detail(err, now=NOW, originator=None)
    assert_valid(detail)
    assert detail.findtext(f"{{{WSNT}}}MaximumTime") == "2026-01-31T12:00:00Z"


_ONVIF = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"
_XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"
_FULL = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
_OLD_SIMPLE = "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/Simple"


@pytest.mark.parametrize(
    ("path", "hint", "sent"),
    [
        (("a", "b"), _ONVIF, _ONVIF),
        (("a", "b"), _XPATH, _XPATH),
        (("a", "b"), _FULL, _FULL),
        (("a", "b"), CONCRETE, CONCRETE),
        (("a",), SIMPLE, SIMPLE),
        (("a",), _OLD_SIMPLE, _OLD_SIMPLE),
        (("a", "b"), SIMPLE, CONCRETE),  # Simple cannot name a/b
        (("a", "b"), _OLD_SIMPLE, CONCRETE),
        (("a", "b"), "urn:unknown-dialect", CONCRETE),
        (("a",), None, SIMPLE),
        (("a", "b"), None, CONCRETE),
    ],
)
def test_topic_dialect_sent(path: tuple[str, ...], hint: str | None, sent: str) -> None:
    """META-04: the Topic goes out in core's dialect whenever ``prefix:path`` is an
    expression of that dialect naming the topic, else in Simple/Concrete."""
    message = NotificationMessage("m", b"<x/>", Topic("urn:t", path), topic_dialect=hint)
    topic = _tree(codec.notify_element([Delivered(message, "s")])).find(f".//{{{WSNT}}}Topic")
    assert topic is not None and topic.get("Dialect") == sent
    assert topic.text == "tns:" + "/".join(path)
