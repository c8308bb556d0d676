"""F3 (docs/performance.md): ``serialize_standalone``'s fast path gives exactly the bytes of
the general path (re-parse, namespace walk, ``cleanup_namespaces``) for every shape of
payload, and is taken for the usual Notify payload."""

from __future__ import annotations

import pytest
from lxml import etree
from wsnmom.soap_frontend import xml
from wsnmom.soap_frontend.xml import SOAP11, SOAP12, WSA, WSNT, serialize_standalone

ENV = f'xmlns:s="{SOAP12}" xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}"'

#: (document, path to the element to serialise) pairs
CASES: list[tuple[str, str]] = [
    # the bench/Notify shape: envelope namespaces in scope, payload declares its own
    (f'<s:E {ENV}><wsnt:M><b:e xmlns:b="urn:b" seq="1">x</b:e></wsnt:M></s:E>', "*/*"),
    # application namespace declared on the envelope, QName in text
    (f'<s:E {ENV} xmlns:app="urn:app"><wsnt:M><p>app:v</p></wsnt:M></s:E>', "*/*"),
    # unused default namespace of the envelope
    (f'<s:E {ENV} xmlns="urn:d"><wsnt:M xmlns=""><p/></wsnt:M></s:E>', "*/*"),
    # payload in the default namespace
    (f'<s:E {ENV}><wsnt:M><p xmlns="urn:d"><q/></p></wsnt:M></s:E>', "*/*"),
    # default namespace declared above, payload prefixed
    (f'<s:E {ENV} xmlns="urn:d"><wsnt:M><x:p xmlns:x="urn:x"><q/></x:p></wsnt:M></s:E>', "*/*"),
    # payload uses an infrastructure namespace in a name
    (f"<s:E {ENV}><wsnt:M><p><wsa:Address>a</wsa:Address></p></wsnt:M></s:E>", "*/*"),
    (f'<s:E {ENV}><wsnt:M><p wsa:IsReferenceParameter="true"/></wsnt:M></s:E>', "*/*"),
    # infrastructure prefix only inside text (dropped by both paths)
    (f"<s:E {ENV}><wsnt:M><p>wsnt:Topic s:x</p></wsnt:M></s:E>", "*/*"),
    # a descendant declares namespaces (general path)
    (
        f'<s:E {ENV}><wsnt:M><p><q xmlns:k="urn:k" xmlns:s2="{SOAP11}">k:v</q></p></wsnt:M></s:E>',
        "*/*",
    ),
    # "xmlns" in text and attribute values
    (f'<s:E {ENV}><wsnt:M><p a="xmlns">xmlns:s</p></wsnt:M></s:E>', "*/*"),
    # non-ASCII text, entities, comments, PIs, CDATA, tail text
    (
        f'<s:E {ENV}><wsnt:M><p a="&lt;&amp;&quot;">é €<!--c--><![CDATA[<x>]]></p>\n'
        "  </wsnt:M></s:E>",
        "*/*",
    ),
    # a prefix that is a prefix of another
    (f'<s:E {ENV} xmlns:ss="urn:ss"><wsnt:M><ss:p/></wsnt:M></s:E>', "*/*"),
    # the element is the document root
    ('<p xmlns:a="urn:a"><a:q/></p>', "."),
    # the same prefix rebound below
    (f'<s:E {ENV}><wsnt:M xmlns:b="urn:1"><b:p xmlns:b="urn:2"/></wsnt:M></s:E>', "*/*"),
    # the default namespace undeclared inside the payload (xmlns="" must stay)
    (f'<s:E {ENV}><wsnt:M><x xmlns="urn:n"><a xmlns=""/></x></wsnt:M></s:E>', "*/*"),
    (f'<s:E {ENV}><wsnt:M><n:x xmlns:n="urn:n"><a xmlns=""/></n:x></wsnt:M></s:E>', "*/*"),
    (
        f'<s:E {ENV} xmlns="urn:d"><wsnt:M><x xmlns="urn:n" a="1">t<!--c--><y xmlns="urn:m">'
        '<a xmlns="">v<b xmlns="urn:n"/></a>u</y>w<?p i?></x></wsnt:M></s:E>',
        "*/*",
    ),
    # the payload root undeclares the envelope's default namespace (a leaf, and not)
    (f'<s:E {ENV} xmlns="urn:d"><wsnt:M><a xmlns=""/></wsnt:M></s:E>', "*/*"),
    (f'<s:E {ENV} xmlns="urn:d"><wsnt:M><a xmlns=""><b/></a></wsnt:M></s:E>', "*/*"),
    # the envelope's default namespace undeclared above the payload
    (f'<s:E {ENV} xmlns="urn:d"><wsnt:M xmlns=""><p><q/></p></wsnt:M></s:E>', "*/*"),
]


@pytest.mark.parametrize(("doc", "path"), CASES)
def test_fast_path_equals_general_path(doc: str, path: str) -> None:
    root = etree.fromstring(doc.encode())
    el = root if path == "." else root.find(path)
    assert el is not None
    expected = xml._serialize_general(el)
    assert serialize_standalone(el) == expected
    fast = xml._serialize_fast(el)
    assert fast is None or fast == expected


def test_fast_path_taken_for_notify_payload() -> None:
    root = etree.fromstring(CASES[0][0].encode())
    el = root.find("*/*")
    assert el is not None
    fast = xml._serialize_fast(el)
    assert fast == b'<b:e xmlns:b="urn:b" seq="1">x</b:e>'


def test_application_namespaces_kept_for_qname_text() -> None:
    root = etree.fromstring(CASES[1][0].encode())
    el = root.find("*/*")
    assert el is not None
    out = etree.fromstring(serialize_standalone(el))
    assert out.nsmap == {"app": "urn:app"}


@pytest.mark.parametrize(("doc", "path"), CASES)
def test_the_payload_keeps_its_infoset(doc: str, path: str) -> None:
    """What is serialised reads back as the same elements in the same namespaces: an
    element undeclaring the default namespace (``xmlns=""``) stays in no namespace
    (``cleanup_namespaces`` alone dropped the undeclaration, and ``//a`` stopped matching
    ``<a xmlns=""/>`` under ``<x xmlns="urn:n">`` once the Notify was parsed)."""
    root = etree.fromstring(doc.encode())
    el = root if path == "." else root.find(path)
    assert el is not None
    out = etree.fromstring(serialize_standalone(el))
    assert [e.tag for e in out.iter()] == [e.tag for e in el.iter()]
    assert etree.tostring(out, method="c14n", exclusive=True) == etree.tostring(
        el, method="c14n", exclusive=True
    )
