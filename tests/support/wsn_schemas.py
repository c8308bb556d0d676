"""Validation of WS-N messages against the official OASIS schemas (b-2, br-2, r-2, rp-2,
bf-2, t-1, ws-addr).

The schemas are the copies ``wsnmom.soap_frontend`` ships and serves next to its WSDL;
``tests/soap_frontend/test_served_schemas.py`` checks that they are the published files,
unchanged (by their SHA-256 digests)."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from lxml import etree

_NAMESPACES = {
    "http://docs.oasis-open.org/wsn/b-2": "b-2.xsd",
    "http://docs.oasis-open.org/wsn/br-2": "br-2.xsd",
    "http://docs.oasis-open.org/wsrf/r-2": "r-2.xsd",
    "http://docs.oasis-open.org/wsrf/rp-2": "rp-2.xsd",
}


def served_schema_dir() -> Path:
    """Folder of the XSD copies the gateway serves beside its WSDL."""
    return Path(str(resources.files("wsnmom.soap_frontend") / "wsdl"))


def schema_dir() -> Path:
    """Folder holding the OASIS XSDs used for validation: the shipped copies."""
    return served_schema_dir()


@functools.cache
def wsn_schema() -> etree.XMLSchema:
    """One schema object importing every WS-N / WS-RF namespace."""
    base = schema_dir()
    imports = "".join(
        f'<xsd:import namespace="{ns}" schemaLocation="{(base / name).as_uri()}"/>'
        for ns, name in _NAMESPACES.items()
    )
    doc = (
        '<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" '
        'targetNamespace="urn:wsnmom:test:all">' + imports + "</xsd:schema>"
    )
    return etree.XMLSchema(etree.fromstring(doc.encode(), base_url=base.as_uri() + "/"))


def assert_valid(el: etree._Element | bytes) -> None:
    """Assert that a WS-N element (not an envelope) is valid; shows every error."""
    if isinstance(el, bytes):
        el = etree.fromstring(el)
    doc = etree.fromstring(etree.tostring(el))
    schema = wsn_schema()
    if not schema.validate(doc):
        errors = str(schema.error_log)
        raise AssertionError(f"{doc.tag} is not schema-valid:\n{errors}\n{etree.tostring(doc)!r}")


def assert_body_valid(envelope: bytes | etree._Element) -> etree._Element:
    """Validate every Body child of a SOAP envelope (and a fault's detail element);
    returns the first Body child."""
    env = etree.fromstring(envelope) if isinstance(envelope, bytes) else envelope
    body = next(c for c in env if isinstance(c.tag, str) and c.tag.endswith("}Body"))
    kids = [c for c in body if isinstance(c.tag, str)]
    for child in kids:
        if child.tag.endswith("}Fault"):
            for detail in child.iter("{*}Detail", "detail"):
                for d in detail:
                    if isinstance(d.tag, str):
                        assert_valid(d)
        elif child.tag.startswith("{http://docs.oasis-open.org/"):
            assert_valid(child)
    return kids[0] if kids else body
