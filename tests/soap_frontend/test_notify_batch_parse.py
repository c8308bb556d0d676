"""Per-Notify work in the frontend (docs/performance.md, the 100-message ingress): the
depth check runs as one XPath, ``text_of`` reads a leaf's text directly, ``parse_notify``
shares one ``ExpressionSource`` between consecutive messages on the same topic, and
``serialize_standalone``'s fast path plans its cuts once per set of in-scope namespaces.
Every shortcut must give what the general code gives."""

from __future__ import annotations

import pytest
from lxml import etree
from wsnmom.core.model import ExpressionSource
from wsnmom.soap_frontend import codec, xml
from wsnmom.soap_frontend.envelope import parse_request
from wsnmom.soap_frontend.faults import BaseFaultError
from wsnmom.soap_frontend.xml import SOAP12, WSA, WSNT, XmlRejected, parse_xml, text_of

from bench import soap

SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
ENV = f'xmlns:s="{SOAP12}" xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}"'


def _walk_depth(root: etree._Element) -> int:
    """The depth as the former check counted it: elements only, the root is 1."""
    deepest = depth = 0
    for event, _ in etree.iterwalk(root, events=("start", "end")):
        depth += 1 if event == "start" else -1
        deepest = max(deepest, depth)
    return deepest


@pytest.mark.parametrize(
    "doc",
    [
        b"<a>" * 128 + b"</a>" * 128,
        b"<a>" * 129 + b"</a>" * 129,
        b"<r>" + b"<a>" * 127 + b"<!--c--><?pi x?>" + b"</a>" * 127 + b"</r>",
        b"<r>" + b"<a>" * 127 + b"<b/>" + b"</a>" * 127 + b"</r>",
        b"<r>" + (b"<a>" * 60 + b"</a>" * 60) * 50 + b"<x><y/></x></r>",
        b"<r/>",
    ],
)
def test_depth_check_matches_an_element_walk(doc: bytes) -> None:
    root = etree.fromstring(doc)
    too_deep = _walk_depth(root) > xml.MAX_DEPTH
    if too_deep:
        with pytest.raises(XmlRejected, match="deeper than 128"):
            parse_xml(doc)
    else:
        assert parse_xml(doc) is not None


def test_depth_limit_of_stored_fragments() -> None:
    assert xml.parse_fragment(b"<a>" * 256 + b"</a>" * 256) is not None
    with pytest.raises(XmlRejected):
        xml.parse_fragment(b"<a>" * 257 + b"</a>" * 257)


@pytest.mark.parametrize(
    "doc",
    [
        b"<a>  t:x  </a>",
        b"<a/>",
        b"<a><![CDATA[ c ]]></a>",
        b"<a>x<!--c-->y</a>",
        b"<a>x<b>y</b>z</a>",
        b"<a>&#233;&amp;</a>",
    ],
)
def test_text_of_equals_itertext(doc: bytes) -> None:
    el = etree.fromstring(doc)
    assert text_of(el) == "".join(el.itertext()).strip()


def _notify(parts: str) -> etree._Element:
    data = (
        f"<s:Envelope {ENV}><s:Header/><s:Body><wsnt:Notify>{parts}</wsnt:Notify>"
        f"</s:Body></s:Envelope>"
    ).encode()
    return parse_request("POST", soap.CONTENT_TYPE, data).body


def _message(topic: str | None, payload: str = "<p:e xmlns:p='urn:p'/>", ns: str = "") -> str:
    head = (
        f'<wsnt:Topic Dialect=" {SIMPLE} " xmlns:t="urn:t"{ns}>{topic}</wsnt:Topic>'
        if topic is not None
        else ""
    )
    return (
        f"<wsnt:NotificationMessage>{head}<wsnt:Message>{payload}</wsnt:Message>"
        f"</wsnt:NotificationMessage>"
    )


def test_consecutive_equal_topics_share_one_record() -> None:
    body = _notify(_message("t:a") * 3 + _message("t:b") + _message("t:a") + _message(None))
    items = codec.parse_notify(body)
    topics = [i.topic for i in items]
    assert topics[0] is topics[1] is topics[2]
    assert topics[3] is not topics[0]
    assert topics[4] == topics[0]
    assert topics[5] is None
    assert topics[0] == ExpressionSource(
        SIMPLE, "t:a", {"s": SOAP12, "wsa": WSA, "wsnt": WSNT, "t": "urn:t"}
    )


def test_equal_text_with_other_bindings_is_another_record() -> None:
    body = _notify(_message("t:a") + _message("t:a", ns=' xmlns:x="urn:x"'))
    first, second = (i.topic for i in codec.parse_notify(body))
    assert first is not None and second is not None
    assert first is not second
    assert first != second
    assert second.namespaces["x"] == "urn:x"


def test_each_topic_equals_the_generic_expression_parser() -> None:
    body = _notify(_message("t:a") + _message("t:a", ns=' xmlns:x="urn:x"') + _message("t:c"))
    holders = [h for h in body if h.tag == codec.T("NotificationMessage")]
    parsed = codec.parse_notify(body)
    for holder, item in zip(holders, parsed, strict=True):
        topic_el = holder.find(codec.T("Topic"))
        assert topic_el is not None
        assert item.topic == codec.expression(topic_el)


def test_extension_content_and_comments_between_messages_are_skipped() -> None:
    body = _notify("<!--c--><x:other xmlns:x='urn:x'/>" + _message("t:a") + "<?pi x?>")
    items = codec.parse_notify(body)
    assert len(items) == 1
    assert items[0].payload == b'<p:e xmlns:p="urn:p"/>'


@pytest.mark.parametrize(
    ("parts", "fault"),
    [
        ("", "no wsnt:NotificationMessage"),
        ("<wsnt:NotificationMessage/>", "no wsnt:Message"),
        (_message("t:a", payload="<a/><b/>"), "exactly one element"),
        (_message("t:a", payload="text only"), "exactly one element"),
    ],
)
def test_malformed_notify_faults(parts: str, fault: str) -> None:
    with pytest.raises(BaseFaultError, match=fault):
        codec.parse_notify(_notify(parts))


def test_bench_notify_payloads() -> None:
    data = soap.notify("http://127.0.0.1/wsn/broker", "ingress", messages=5)
    items = codec.parse_notify(parse_request("POST", soap.CONTENT_TYPE, data).body)
    filler = "x" * 64
    assert [i.payload for i in items] == [
        f'<b:event xmlns:b="urn:wsnmom:bench" seq="{n}" ts="0">{filler}</b:event>'.encode()
        for n in range(5)
    ]
    assert len({id(i.topic) for i in items}) == 1


# --- serialize_standalone's planned fast path -----------------------------------------------
LEAVES = [
    # envelope prefixes used by the leaf's own name or attributes: general path
    f"<s:E {ENV}><wsnt:M><wsa:To>x</wsa:To></wsnt:M></s:E>",
    f'<s:E {ENV}><wsnt:M><p wsa:IsReferenceParameter="true"/></wsnt:M></s:E>',
    f'<s:E {ENV}><wsnt:M><p xmlns:w2="{WSA}" w2:a="1"/></wsnt:M></s:E>',
    # an envelope prefix only inside a leaf's text or attribute value: cut
    f'<s:E {ENV}><wsnt:M><p a="wsa:x s:y">wsnt:Topic s:x &lt;wsa:y</p></wsnt:M></s:E>',
    # declarations that are not adjacent in the in-scope namespaces
    f'<s:E xmlns:s="{SOAP12}"><wsnt:M xmlns:a="urn:a" xmlns:wsnt="{WSNT}"><p/></wsnt:M></s:E>',
    f'<s:E xmlns:s="{SOAP12}" xmlns:a="urn:a" xmlns:wsnt="{WSNT}"><wsnt:M><a:p/></wsnt:M></s:E>',
    # the same envelope namespace under two prefixes
    f'<s:E {ENV} xmlns:soap="{SOAP12}"><wsnt:M><p/></wsnt:M></s:E>',
    # an envelope namespace as the default namespace
    f'<E xmlns="{SOAP12}" xmlns:wsnt="{WSNT}"><wsnt:M><p xmlns=""/></wsnt:M></E>',
    # application default namespace, used by the leaf or not
    f'<s:E {ENV}><wsnt:M><p xmlns="urn:d"/></wsnt:M></s:E>',
    f'<s:E {ENV} xmlns="urn:d"><wsnt:M><x:p xmlns:x="urn:x"/></wsnt:M></s:E>',
    # a larger fragment: searched in the bytes
    f"<s:E {ENV}><wsnt:M><p><q>wsa:x</q></p></wsnt:M></s:E>",
    f"<s:E {ENV}><wsnt:M><p><q/><!--s:x--></p></wsnt:M></s:E>",
]


@pytest.mark.parametrize("doc", LEAVES)
def test_planned_fast_path_equals_general_path(doc: str) -> None:
    el = etree.fromstring(doc.encode()).find("*/*")
    assert el is not None
    expected = xml._serialize_general(el)
    for _ in range(2):  # with a fresh plan, then with the cached one
        fast = xml._serialize_fast(el)
        assert fast is None or fast == expected
        assert xml.serialize_standalone(el) == expected


def test_fast_path_taken_for_text_that_looks_like_a_prefix() -> None:
    el = etree.fromstring(LEAVES[3].encode()).find("*/*")
    assert el is not None
    assert xml._serialize_fast(el) == b'<p a="wsa:x s:y">wsnt:Topic s:x &lt;wsa:y</p>'


def test_plan_cache_is_bounded() -> None:
    xml._PLANS.clear()
    for n in range(xml._MAX_PLANS + 10):
        el = etree.fromstring(f'<r {ENV}><p xmlns:n{n}="urn:n"/></r>'.encode())[0]
        assert xml.serialize_standalone(el) == f'<p xmlns:n{n}="urn:n"/>'.encode()
    assert len(xml._PLANS) <= xml._MAX_PLANS
