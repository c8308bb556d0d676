"""Outbound bodies with payloads copied in as bytes (soap_frontend/splice.py and the
Notify / GetMessages / GetCurrentMessage builders of the codec)."""

from __future__ import annotations

import pytest
from lxml import etree
from wsnmom.core.model import Delivered, EndpointReference, NotificationMessage, SoapVersion
from wsnmom.soap_frontend import codec, responses
from wsnmom.soap_frontend.envelope import build_envelope, to_bytes
from wsnmom.soap_frontend.splice import MARKER, Spliced
from wsnmom.topic_mapping.model import Topic

from tests.support.soap import CONCRETE, SIMPLE, WSA, WSNT
from tests.support.wsn_schemas import assert_valid

FULL = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
NM = f"{{{WSNT}}}NotificationMessage"


def _message(payload: bytes, **kw: object) -> NotificationMessage:
    return NotificationMessage("m", payload, **kw)  # type: ignore[arg-type]


def _payload_of(body: Spliced) -> etree._Element:
    tree = etree.fromstring(body.to_bytes())
    message = tree.find(f"{NM}/{{{WSNT}}}Message")
    assert message is not None and len(message) == 1
    return message[0]


def test_bare_element_payload_is_copied_byte_for_byte() -> None:
    payload = b"<p:e xmlns:p=\"urn:p\" a='1'><p:x>1 &amp; 2</p:x><![CDATA[<raw>]]></p:e>"
    body = codec.notify_element([Delivered(_message(payload, topic=Topic("urn:t", ("a",))), "s")])
    assert payload in body.to_bytes()
    element = _payload_of(body)
    assert element.tag == "{urn:p}e" and element.get("a") == "1"
    assert element.findtext("{urn:p}x") == "1 & 2" and element[0].tail == "<raw>"


def test_unqualified_payload_stays_unqualified() -> None:
    """No element around the payload declares a default namespace, so an unqualified
    payload is not pulled into one."""
    body = codec.get_messages_response([_message(b"<plain><child/></plain>")])
    tree = etree.fromstring(body.to_bytes())
    assert_valid(tree)
    element = _payload_of(body)
    assert element.tag == "plain" and element[0].tag == "child"


@pytest.mark.parametrize(
    "payload",
    [
        # a declaration with another encoding: the bytes are not UTF-8
        '<?xml version="1.0" encoding="ISO-8859-1"?><e xmlns="urn:e">caf\u00e9</e>'.encode(
            "latin-1"
        ),
        b"<!-- leading comment --><e xmlns='urn:e'>caf\xc3\xa9</e>",
        b"  <e xmlns='urn:e'>caf\xc3\xa9</e>",
    ],
    ids=["declaration-latin1", "leading-comment", "leading-space"],
)
def test_payload_with_a_prolog_is_serialised_again(payload: bytes) -> None:
    data = codec.notify_element([Delivered(_message(payload), "s")]).to_bytes()
    assert payload not in data
    element = _payload_of(codec.notify_element([Delivered(_message(payload), "s")]))
    assert element.tag == "{urn:e}e" and element.text == "caf\u00e9"


def test_non_xml_payload_is_wrapped() -> None:
    body = codec.get_messages_response([_message(b'{"a": 1}', content_type="application/json")])
    element = _payload_of(body)
    assert element.tag == "{urn:wsnmom:ns:1}NativeMessage"
    assert element.get("contentType") == "application/json" and element.text == '{"a": 1}'


def test_frames_render_every_part_and_validate() -> None:
    """SubscriptionReference (with reference parameters and metadata), Topic in each
    dialect, ProducerReference: the cached frames hold them in schema order."""
    metadata = b'<wsa:Metadata xmlns:wsa="http://www.w3.org/2005/08/addressing"><m/></wsa:Metadata>'
    ref = EndpointReference(
        "http://b/wsn/subscriptions/s1?x=1&y=<2>",
        (b'<r:id xmlns:r="urn:r">s1</r:id>', b'<r:k xmlns:r="urn:r">v</r:k>'),
        metadata,
    )
    producer = EndpointReference("http://producer")
    messages = [
        _message(b"<a/>", topic=Topic("urn:t", ("root",)), producer_reference=producer),
        _message(b"<b/>", topic=Topic("urn:t", ("root", "leaf")), topic_dialect=SIMPLE),
        _message(b"<c/>", topic=Topic("urn:t&u", ("root",)), topic_dialect=FULL),
        _message(b"<d/>"),
    ]
    body = codec.notify_element([Delivered(m, "s1", ref) for m in messages])
    tree = etree.fromstring(body.to_bytes())
    assert_valid(tree)
    holders = tree.findall(NM)
    assert [h[-1][0].tag for h in holders] == ["a", "b", "c", "d"]
    first = holders[0]
    assert [etree.QName(c).localname for c in first] == [
        "SubscriptionReference",
        "Topic",
        "ProducerReference",
        "Message",
    ]
    sref = first[0]
    assert sref.findtext(f"{{{WSA}}}Address") == ref.address
    assert [p.tag for p in sref.find(f"{{{WSA}}}ReferenceParameters")] == ["{urn:r}id", "{urn:r}k"]
    assert sref.find(f"{{{WSA}}}Metadata/m") is not None
    dialects = [h.find(f"{{{WSNT}}}Topic") for h in holders[:3]]
    assert [t.get("Dialect") for t in dialects] == [SIMPLE, CONCRETE, FULL]  # type: ignore[union-attr]
    for topic, path, ns in zip(
        dialects, ["root", "root/leaf", "root"], ["urn:t", "urn:t", "urn:t&u"], strict=True
    ):
        assert topic is not None
        prefix, _, text = (topic.text or "").partition(":")
        assert topic.nsmap[prefix] == ns and text == path
    assert holders[3].find(f"{{{WSNT}}}Topic") is None


def test_frame_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # the frame table is the responses part's (the codec re-exports its builders)
    monkeypatch.setattr(responses, "_FRAMES_MAX", 8)
    responses._frames.clear()
    for i in range(30):
        codec.get_messages_response([_message(b"<a/>", topic=Topic("urn:t", (f"t{i}",)))])
        assert len(responses._frames) <= 8
    data = codec.get_messages_response([_message(b"<a/>", topic=Topic("urn:t", ("t29",)))])
    assert b">tns:t29<" in data.to_bytes()


def test_get_current_message_response_holds_the_payload() -> None:
    body = codec.get_current_message_response(_message(b'<p:x xmlns:p="urn:p"/>'))
    tree = etree.fromstring(body.to_bytes())
    assert_valid(tree)
    assert [c.tag for c in tree] == ["{urn:p}x"]


def test_raw_payload_is_the_soap_body() -> None:
    body = codec.raw_payload(_message(b'<p:x xmlns:p="urn:p">1</p:x>'))
    env = build_envelope(SoapVersion.SOAP12, body.element, action="urn:a", to="http://c")
    data = body.fill(to_bytes(env))
    tree = etree.fromstring(data)
    (payload,) = tree.find("{http://www.w3.org/2003/05/soap-envelope}Body")  # type: ignore[misc]
    assert payload.tag == "{urn:p}x" and payload.text == "1"


def test_fill_uses_the_marker_in_the_body_not_one_in_a_header() -> None:
    """An echoed reference parameter may look like the marker; the body comes last."""
    body = codec.notify_element([Delivered(_message(b"<a/>"), "s")])
    header = etree.fromstring(MARKER)
    env = build_envelope(
        SoapVersion.SOAP11, body.element, action="urn:a", to="http://c", extra_headers=[header]
    )
    tree = etree.fromstring(body.fill(to_bytes(env)))
    soap = "http://schemas.xmlsoap.org/soap/envelope/"
    assert tree.find(f"{{{soap}}}Header/wsnmom-splice") is not None
    assert tree.find(f"{{{soap}}}Body/{{{WSNT}}}Notify/{NM}/{{{WSNT}}}Message/a") is not None


def test_fill_refuses_a_serialisation_without_marker() -> None:
    body = codec.notify_element([])
    with pytest.raises(ValueError, match="no splice marker"):
        body.fill(b"<x/>")
    assert etree.fromstring(body.to_bytes()).tag == f"{{{WSNT}}}Notify"
