"""The WS-N 1.0 / 1.2-draft request rewriting of ``soap_frontend.legacy``, without a server:
what the 1.3 parsers get from an older request, and that a 1.3 request is left alone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import SoapVersion, WireVersion
from wsnmom.soap_frontend import codec, legacy_faults
from wsnmom.soap_frontend.envelope import SoapRequest, parse_request
from wsnmom.soap_frontend.legacy import WSN_10, WSN_12_DRAFT, recognise
from wsnmom.soap_frontend.legacy_requests import to_current

from tests.support.soap import envelope

S12 = "http://www.w3.org/2003/05/soap-envelope"
IBM = "http://www.ibm.com/xmlns/stdwip/web-services/"
WSA03 = "http://schemas.xmlsoap.org/ws/2003/03/addressing"


def _request(body: str, headers: str = "", wsa: str = WSA03) -> bytes:
    return (
        f'<s12:Envelope xmlns:s12="{S12}" xmlns:wsa="{wsa}" '
        f'xmlns:wsnt="{IBM}WS-Notification" xmlns:wsrl="{IBM}WS-ResourceLifetime" '
        f'xmlns:tns="urn:t"><s12:Header><wsa:To>http://h/wsn/subscriptions/abc</wsa:To>'
        f"{headers}</s12:Header><s12:Body>{body}</s12:Body></s12:Envelope>"
    ).encode()


def _rewrite(data: bytes) -> SoapRequest:
    req = parse_request("POST", "application/soap+xml", data)
    found = recognise(req)
    assert found is not None
    legacy, kind = found
    return to_current(legacy, req, kind)


def test_a_13_request_is_not_recognised() -> None:
    req = parse_request("POST", "application/soap+xml", envelope("<wsnt:Notify/>"))
    assert recognise(req) is None


def test_subscribe_request_becomes_a_13_subscribe() -> None:
    req = _rewrite(
        _request(
            "<wsnt:SubscribeRequest><wsnt:ConsumerReference><wsa:Address>http://c/x"
            "</wsa:Address><wsa:ReferenceProperties><k xmlns='urn:k'>1</k>"
            "</wsa:ReferenceProperties></wsnt:ConsumerReference>"
            "<wsnt:TopicPathExpression>tns:t1//*|tns:t4/*</wsnt:TopicPathExpression>"
            "<wsnt:UseNotify>false</wsnt:UseNotify>"
            "<wsnt:Selector dialect='http://www.w3.org/TR/1999/REC-xpath-19991116'>"
            "boolean(/a)</wsnt:Selector>"
            "<wsrl:InitialTerminationTime>2099-01-01T00:00:00Z</wsrl:InitialTerminationTime>"
            "</wsnt:SubscribeRequest>"
        )
    )
    assert req.wire is WireVersion.WSN_10
    assert req.addressing.to == "http://h/wsn/subscriptions/abc"
    sub = codec.parse_subscribe(req.body, SoapVersion.SOAP12)
    assert sub.consumer.address == "http://c/x"
    assert sub.consumer.reference_parameters and b"urn:k" in sub.consumer.reference_parameters[0]
    assert sub.topic is not None
    assert (sub.topic.dialect, sub.topic.text) == (codec.FULL, "tns:t1//.|tns:t4/*")
    assert sub.topic.namespaces["tns"] == "urn:t"
    assert sub.message_content is not None and sub.message_content.text == "boolean(/a)"
    assert sub.use_raw
    assert sub.initial_termination_time is not None


def test_set_termination_time_becomes_renew_and_reference_properties_are_headers() -> None:
    req = _rewrite(
        _request(
            "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>2099-01-01T00:00:00Z"
            "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime>",
            headers="<wsnmom:ResourceId xmlns:wsnmom='urn:wsnmom:ns:1'>abc</wsnmom:ResourceId>",
            wsa="http://schemas.xmlsoap.org/ws/2003/02/addressing",
        )
    )
    assert req.body.tag == codec.T("Renew")
    value, invalid = codec.parse_renew(req.body)
    assert not invalid and value is not None
    assert [h.tag for h in req.addressing.other_headers] == ["{urn:wsnmom:ns:1}ResourceId"]


def test_producer_pause_is_refused_with_pause_failed() -> None:
    with pytest.raises(errors.PauseFailed):
        _rewrite(_request("<wsnt:PauseRequest/>"))


def test_draft_notify_keeps_its_dialect() -> None:
    ns = WSN_12_DRAFT.wsnt
    data = (
        f'<s12:Envelope xmlns:s12="{S12}" xmlns:wsnt="{ns}" xmlns:tns="urn:t"><s12:Body>'
        "<wsnt:Notify><wsnt:NotificationMessage>"
        '<wsnt:Topic Dialect="http://docs.oasis-open.org/wsn/2004/06/TopicExpression/Simple">'
        "tns:a</wsnt:Topic><wsnt:Message><p xmlns='urn:p'/></wsnt:Message>"
        "</wsnt:NotificationMessage></wsnt:Notify></s12:Body></s12:Envelope>"
    ).encode()
    req = _rewrite(data)
    assert req.wire is WireVersion.WSN_12_DRAFT
    [message] = codec.parse_notify(req.body)
    assert message.topic is not None
    assert message.topic.dialect == "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/Simple"
    assert etree.fromstring(message.payload).tag == "{urn:p}p"


@pytest.mark.parametrize(
    ("error", "kind", "name"),
    [
        (errors.InvalidTopicExpression("x"), "subscribe", "SubscribeCreationFailed"),
        (errors.InvalidTopicExpression("x"), "current", "InvalidTopicPathExpression"),
        (errors.ResourceUnknown("x"), "destroy", "UnknownResource"),
        (
            errors.UnacceptableTerminationTime("x"),
            "set_termination_time",
            "TerminationTimeChangeRejected",
        ),
    ],
)
def test_10_fault_names(error: errors.WsnError, kind: str, name: str) -> None:
    fault, action, _ = legacy_faults.fault(
        WSN_10, error, SoapVersion.SOAP12, kind, now=datetime.now(UTC), originator=None
    )
    detail = fault.find(f"{{{S12}}}Detail")
    assert detail is not None and len(detail) == 1
    assert detail[0].tag.endswith("}ErrorMessage")
    expected_ns = WSN_10.wsrl if kind in ("destroy", "set_termination_time") else WSN_10.wsnt
    assert detail[0].tag == f"{{{expected_ns}}}ErrorMessage"
    assert (detail[0].text or "").startswith(f"{name}: ")
    assert action == f"{IBM}WS-Notification/Fault"


def test_a_payload_keeps_its_older_addressing_elements() -> None:
    req = _rewrite(
        _request(
            "<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic>tns:a</wsnt:Topic>"
            "<wsnt:ProducerReference><wsa:Address>http://p</wsa:Address>"
            "</wsnt:ProducerReference><wsnt:Message><wsa:EndpointReference>"
            "<wsa:Address>http://inside</wsa:Address></wsa:EndpointReference></wsnt:Message>"
            "</wsnt:NotificationMessage></wsnt:Notify>"
        )
    )
    [message] = codec.parse_notify(req.body)
    assert message.producer_reference is not None
    assert message.producer_reference.address == "http://p"
    assert etree.fromstring(message.payload).tag == f"{{{WSA03}}}EndpointReference"
