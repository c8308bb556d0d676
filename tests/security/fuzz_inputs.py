"""The inputs of the fuzz runs (tests/security/test_fuzz.py, test_fuzz_credentials.py):
hypothesis strategies that mutate an envelope's tree (elements removed, repeated, renamed,
moved to other namespaces, deepened, bloated; text and attributes replaced by hostile
values: :func:`mutate`), its bytes (flipped, truncated, re-encoded: :func:`bytes_mutation`)
and its Content-Type (:func:`content_type_of`).
"""

from __future__ import annotations

import copy

from hypothesis import strategies as st
from lxml import etree

from . import corpus
from .fuzz_target import MAX_REQUEST_BYTES

# ------------------------------------------------------------------------------ strategies
NAMESPACES = [
    corpus.SOAP11,
    corpus.SOAP12,
    "http://docs.oasis-open.org/wsn/b-2",
    "http://docs.oasis-open.org/wsn/br-2",
    "http://docs.oasis-open.org/wsrf/rp-2",
    "http://www.w3.org/2005/08/addressing",
    "urn:wsnmom:ns:1",
    "urn:other",
    "",
]
OP_NAMES = [*corpus.BODIES, "Envelope", "Body", "Header", "Fault", "Address", "Filter"]
SPECIAL_TEXT = [
    "",
    " ",
    "npex:SomeTopic",
    "npex:gr\u00fc\u00dfe",
    "npex:\u65e5\u672c/\u8a9e",
    "npex:*",
    "npex:a//.",
    "npex:a | npex:b//*",
    "*",
    "//.",
    "tns:undeclared",
    "npex:" + "a/" * 300 + "b",
    "P99999999999Y",
    "-PT1S",
    "2000-13-45T99:00:00Z",
    "0001-01-01T00:00:00Z",
    "NaN",
    "-1",
    "0",
    "99999999999999999999999",
    "true",
    "http://127.0.0.1:9/x",
    "http://[::1]:9/x",
    "http://localhost:9/x",
    "http://10.0.0.1/x",
    "http://169.254.169.254/latest",
    "file:///etc/passwd",
    "ftp://u:p@127.0.0.1/x",
    "not a url",
    "urn:uuid:00000000-0000-0000-0000-000000000000",
    *corpus.HOSTILE_XPATH,
]
xml_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff"),
    max_size=60,
)
TEXT = st.one_of(st.sampled_from(SPECIAL_TEXT), xml_text)
MUTATIONS = [
    "delete",
    "duplicate",
    "retag",
    "renamespace",
    "text",
    "attribute",
    "insert",
    "deepen",
    "bloat",
]


def mutate(tree: etree._Element, data: st.DataObject) -> None:
    nodes = [n for n in tree.iter() if isinstance(n.tag, str)]
    node = data.draw(st.sampled_from(nodes))
    op = data.draw(st.sampled_from(MUTATIONS))
    parent = node.getparent()
    try:
        if op == "delete" and parent is not None:
            parent.remove(node)
        elif op == "duplicate" and parent is not None:
            for _ in range(data.draw(st.integers(1, 50))):
                node.addnext(copy.deepcopy(node))
        elif op == "retag":
            ns = etree.QName(node).namespace
            local = data.draw(st.sampled_from(OP_NAMES))
            node.tag = f"{{{ns}}}{local}" if ns else local
        elif op == "renamespace":
            ns = data.draw(st.sampled_from(NAMESPACES))
            local = etree.QName(node).localname
            node.tag = f"{{{ns}}}{local}" if ns else local
        elif op == "text":
            node.text = data.draw(TEXT)
        elif op == "attribute":
            name = data.draw(
                st.sampled_from(
                    [
                        "Dialect",
                        "{http://www.w3.org/2001/XMLSchema-instance}nil",
                        f"{{{corpus.SOAP12}}}mustUnderstand",
                        "{http://www.w3.org/2005/08/addressing}IsReferenceParameter",
                        "x",
                    ]
                )
            )
            node.set(name, data.draw(TEXT))
        elif op == "insert":
            ns = data.draw(st.sampled_from(NAMESPACES))
            local = data.draw(st.sampled_from(OP_NAMES))
            child = etree.SubElement(node, f"{{{ns}}}{local}" if ns else local)
            child.text = data.draw(TEXT)
        elif op == "deepen":
            inner = node
            for _ in range(data.draw(st.integers(1, 300))):
                inner = etree.SubElement(inner, "{urn:other}d")
        elif op == "bloat":
            node.text = "x" * data.draw(st.integers(1000, MAX_REQUEST_BYTES + 1000))
    except ValueError:  # lxml refuses a name or text it cannot serialise
        pass


def bytes_mutation(raw: bytes, data: st.DataObject) -> bytes:
    how = data.draw(st.sampled_from(["none", "none", "flip", "truncate", "insert", "encode"]))
    if how == "flip" and raw:
        pos = data.draw(st.integers(0, len(raw) - 1))
        return raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1 :]
    if how == "truncate" and raw:
        return raw[: data.draw(st.integers(0, len(raw) - 1))]
    if how == "insert":
        pos = data.draw(st.integers(0, len(raw)))
        junk = data.draw(
            st.sampled_from([b"\xff\xfe", b"\x00", b"\xc3\x28", b"]]>", b"<!DOCTYPE x>", b"&x;"])
        )
        return raw[:pos] + junk + raw[pos:]
    if how == "encode":
        return raw.decode("utf-8", "replace").encode(
            data.draw(st.sampled_from(["utf-16", "utf-32", "latin-1"])), "replace"
        )
    return raw


def content_type_of(version: str, data: st.DataObject) -> str | None:
    right = "application/soap+xml; charset=utf-8" if version == "1.2" else "text/xml"
    return data.draw(
        st.sampled_from(
            [right, right, right, "text/xml", "application/soap+xml", "text/plain", None]
        )
    )
