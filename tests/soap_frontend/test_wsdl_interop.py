"""The WSDL and schemas as SOAP toolkits see them: zeep can print and drive them, the schema
variants accept only conformant documents, and the WSDL keeps the WS-I Basic Profile rules
and WS-Policy markings code generators such as Apache CXF's wsdl2java depend on."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import EndpointReference
from wsnmom.soap_frontend.app import create_app
from wsnmom.soap_frontend.faults import fault_detail
from wsnmom.soap_frontend.metadata import (
    SCHEMA_FILES,
    WSDL,
    WSDL_SOAP11,
    WSDL_SOAP12,
    official_schema_bytes,
    render_wsdl,
    schema_bytes,
)
from wsnmom.soap_frontend.schema_variants import VARIANTS
from wsnmom.soap_frontend.xml import WSAM, WSNT, WSP, XSD

from tests.soap_frontend.fake_service import FakeService
from tests.support.threads import serve
from tests.support.wsn_schemas import assert_valid

BASE = "http://127.0.0.1:8080"
W = {"wsdl": WSDL, "soap": WSDL_SOAP11, "soap12": WSDL_SOAP12, "xsd": XSD, "wsp": WSP}
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
NS = f'xmlns:wsnt="{WSNT}"'
BF = 'xmlns:bf="http://docs.oasis-open.org/wsrf/bf-2"'


def _wsdl() -> etree._Element:
    policy = etree.fromstring(
        b'<p:BrokerPolicy xmlns:p="urn:wsnmom:policy:1"><p:X>1</p:X></p:BrokerPolicy>'
    )
    return etree.fromstring(render_wsdl(BASE, policy))


# --- the schema variants ------------------------------------------------------------------
def test_only_the_documented_schemas_change() -> None:
    assert set(VARIANTS) == {"b-2.xsd", "bf-2.xsd"}
    for name in sorted(SCHEMA_FILES):
        if name in VARIANTS:
            served = schema_bytes(name)
            assert served != official_schema_bytes(name)
            assert b"client-friendly variant" in served
        else:
            assert schema_bytes(name) == official_schema_bytes(name)


def test_served_expression_types_are_text() -> None:
    b2 = etree.fromstring(schema_bytes("b-2.xsd"))
    for name in ("TopicExpressionType", "QueryExpressionType"):
        (ctype,) = b2.xpath(f"xsd:complexType[@name='{name}']", namespaces=W)
        assert ctype.get("mixed") is None
        (ext,) = ctype.xpath("xsd:simpleContent/xsd:extension", namespaces=W)
        assert ext.get("base").endswith(":string")
        assert ext.xpath("xsd:attribute[@name='Dialect']", namespaces=W)
    (topic_ext,) = b2.xpath(
        "xsd:complexType[@name='TopicExpressionType']/xsd:simpleContent/xsd:extension",
        namespaces=W,
    )
    assert topic_ext.xpath("xsd:anyAttribute", namespaces=W)


class _Served(etree.Resolver):
    """Resolves schemaLocations to the schemas as the gateway serves them."""

    def resolve(self, url: str | None, pubid: str | None, context: object) -> object:
        name = (url or "").rsplit("/", 1)[-1]
        if name in SCHEMA_FILES:
            return self.resolve_string(schema_bytes(name), context, base_url=f"served/{name}")
        return None


def _served_schema() -> etree.XMLSchema:
    parser = etree.XMLParser()
    parser.resolvers.add(_Served())
    doc = etree.fromstring(
        f'<xsd:schema xmlns:xsd="{XSD}" targetNamespace="urn:t">'
        f'<xsd:import namespace="{WSNT}" schemaLocation="served/b-2.xsd"/>'
        '<xsd:import namespace="http://docs.oasis-open.org/wsn/br-2" '
        'schemaLocation="served/br-2.xsd"/>'
        '<xsd:import namespace="http://docs.oasis-open.org/wsrf/r-2" '
        'schemaLocation="served/r-2.xsd"/>'
        '<xsd:import namespace="http://docs.oasis-open.org/wsrf/rp-2" '
        'schemaLocation="served/rp-2.xsd"/>'
        "</xsd:schema>".encode(),
        parser,
        base_url="served/all.xsd",
    )
    return etree.XMLSchema(doc)


@pytest.fixture(scope="module")
def served() -> etree.XMLSchema:
    return _served_schema()


def _both(served: etree.XMLSchema, xml: str) -> tuple[bool, bool]:
    doc = etree.fromstring(xml)
    official = True
    try:
        assert_valid(doc)
    except AssertionError:
        official = False
    return bool(served.validate(doc)), official


@pytest.mark.parametrize(
    "xml",
    [
        f'<wsnt:TopicExpression {NS} xmlns:t="urn:t" Dialect="{SIMPLE}">t:a</wsnt:TopicExpression>',
        f'<wsnt:Topic {NS} Dialect="{SIMPLE}" xml:lang="en">t:a/b</wsnt:Topic>',
        f'<wsnt:MessageContent {NS} Dialect="urn:d">/a[@b = 1]</wsnt:MessageContent>',
        f'<wsnt:TopicExpression {NS} Dialect="{SIMPLE}"/>',
    ],
)
def test_text_expressions_are_valid_under_both(served: etree.XMLSchema, xml: str) -> None:
    assert _both(served, xml) == (True, True)


@pytest.mark.parametrize(
    ("xml", "expected"),
    [
        # element content: allowed by the official mixed type only (no dialect uses it)
        (
            f'<wsnt:TopicExpression {NS} Dialect="urn:d"><x/></wsnt:TopicExpression>',
            (False, True),
        ),
        # no Dialect: invalid under both
        (f'<wsnt:TopicExpression xmlns:wsnt="{WSNT}">t:a</wsnt:TopicExpression>', (False, False)),
    ],
)
def test_the_variant_only_narrows(
    served: etree.XMLSchema, xml: str, expected: tuple[bool, bool]
) -> None:
    assert _both(served, xml) == expected


def _with_error_code(fault: etree._Element, code: str) -> etree._Element:
    bf = "http://docs.oasis-open.org/wsrf/bf-2"
    originator = fault.find(f"{{{bf}}}Originator")
    assert originator is not None
    originator.addnext(etree.fromstring(code))
    return fault


@pytest.mark.parametrize(
    "code",
    [
        f'<bf:ErrorCode {BF} dialect="urn:c">42</bf:ErrorCode>',
        f'<bf:ErrorCode {BF} xmlns:v="urn:v" dialect="urn:c" v:any="x">text <v:detail>1'
        "</v:detail> more</bf:ErrorCode>",
    ],
)
@pytest.mark.parametrize("name", sorted(errors.ALL_FAULTS))
def test_fault_details_are_valid_under_both(served: etree.XMLSchema, name: str, code: str) -> None:
    detail = fault_detail(
        errors.ALL_FAULTS[name]("why"),
        now=datetime(2030, 1, 1, tzinfo=UTC),
        originator=EndpointReference("http://broker/wsn/broker"),
    )
    xml = etree.tostring(_with_error_code(detail, code)).decode()
    assert _both(served, xml) == (True, True)


def test_error_code_without_dialect_is_invalid_under_both(served: etree.XMLSchema) -> None:
    detail = fault_detail(
        errors.ResourceUnknown("why"),
        now=datetime(2030, 1, 1, tzinfo=UTC),
        originator=EndpointReference("http://b"),
    )
    code = f"<bf:ErrorCode {BF}>42</bf:ErrorCode>"
    xml = etree.tostring(_with_error_code(detail, code)).decode()
    assert _both(served, xml) == (False, False)


# --- zeep ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live() -> Iterator[str]:

    from werkzeug.serving import make_server

    service = FakeService()
    server = make_server("127.0.0.1", 0, create_app(service), threaded=True)
    service.base = f"http://127.0.0.1:{server.server_port}"
    serve(server)
    yield service.base
    server.shutdown()


def test_zeep_dump_prints_every_type(live: str) -> None:
    import zeep

    client = zeep.Client(f"{live}/wsn/broker?wsdl")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        client.wsdl.dump()
    text = out.getvalue()
    assert "ResourceUnknownFaultType(" in text and "ErrorCode: {" in text
    assert re.search(r"ns\d+:Topic\(ns\d+:TopicExpressionType\)", text)
    topic_type = client.get_type(f"{{{WSNT}}}TopicExpressionType")
    assert "(xsd:string, Dialect: xsd:anyURI" in topic_type.signature(client.wsdl.types)


# --- WS-I Basic Profile and WS-Policy, as code generators need them ------------------------
def test_messages_are_document_literal_with_one_element_part() -> None:
    wsdl = _wsdl()
    for message in wsdl.findall(f"{{{WSDL}}}message"):
        parts = message.findall(f"{{{WSDL}}}part")
        assert len(parts) == 1, message.get("name")  # R2201 (document-literal)
        assert parts[0].get("element") and parts[0].get("type") is None  # R2204
    for binding in wsdl.findall(f"{{{WSDL}}}binding"):
        (soap_binding,) = [c for c in binding if etree.QName(c).localname == "binding"]
        assert soap_binding.get("style") == "document"
        assert soap_binding.get("transport") == "http://schemas.xmlsoap.org/soap/http"  # R2702
        for body in binding.iter(f"{{{WSDL_SOAP11}}}body", f"{{{WSDL_SOAP12}}}body"):
            assert body.get("use") == "literal" and body.get("namespace") is None  # R2716


def test_operations_are_unique_and_faults_match() -> None:
    wsdl = _wsdl()
    parts = {
        m.get("name"): m.find(f"{{{WSDL}}}part").get("element")  # type: ignore[union-attr]
        for m in wsdl.findall(f"{{{WSDL}}}message")
    }
    port_types = {pt.get("name"): pt for pt in wsdl.findall(f"{{{WSDL}}}portType")}
    for name, pt in port_types.items():
        ops = [op.get("name") for op in pt.findall(f"{{{WSDL}}}operation")]
        assert len(ops) == len(set(ops)), name  # R2304: no overloading
        inputs = [
            parts[(op.find(f"{{{WSDL}}}input").get("message") or "").split(":")[1]]  # type: ignore[union-attr]
            for op in pt.findall(f"{{{WSDL}}}operation")
        ]
        assert len(inputs) == len(set(inputs)), name  # R2710: distinct wire signatures
    for binding in wsdl.findall(f"{{{WSDL}}}binding"):
        pt = port_types[(binding.get("type") or "").split(":")[1]]
        declared = {
            op.get("name"): {f.get("name") for f in op.findall(f"{{{WSDL}}}fault")}
            for op in pt.findall(f"{{{WSDL}}}operation")
        }
        for op in binding.findall(f"{{{WSDL}}}operation"):
            faults = op.findall(f"{{{WSDL}}}fault")
            assert {f.get("name") for f in faults} == declared[op.get("name")]
            for fault in faults:  # R2754: soap:fault name = wsdl:fault name
                (soap_fault,) = list(fault)
                assert soap_fault.get("name") == fault.get("name")
                assert soap_fault.get("use") == "literal"


def test_types_and_qnames_resolve() -> None:
    wsdl = _wsdl()
    for schema in wsdl.iter(f"{{{XSD}}}schema"):
        assert schema.get("targetNamespace")  # R2105
        for imp in schema.findall(f"{{{XSD}}}import"):
            assert imp.get("schemaLocation", "").startswith(f"{BASE}/wsn/schemas/")
    for el in wsdl.iter():
        for attr in ("element", "message", "type", "binding"):
            value = el.get(attr)
            if value and ":" in value:
                assert value.split(":")[0] in el.nsmap, (el.tag, attr, value)  # R2101


def test_policy_assertions_are_optional_for_toolkits() -> None:
    wsdl = _wsdl()
    (policy,) = wsdl.findall(f"{{{WSP}}}Policy")
    assertions = policy.findall(f"{{{WSP}}}ExactlyOne/{{{WSP}}}All/*")
    assert {etree.QName(a).localname for a in assertions} == {"Addressing", "BrokerPolicy"}
    for assertion in assertions:
        assert assertion.get(f"{{{WSP}}}Optional") == "true", assertion.tag
    (broker_policy,) = [a for a in assertions if etree.QName(a).namespace != WSAM]
    assert broker_policy.get(f"{{{WSP}}}Ignorable") == "true"


def test_no_generated_class_names_collide() -> None:
    """JAX-WS names: a service class per wsdl:service, an interface per port type, an
    exception per fault message; none may share a name in the service package."""
    wsdl = _wsdl()
    services = [s.get("name") for s in wsdl.findall(f"{{{WSDL}}}service")]
    port_types = [p.get("name") for p in wsdl.findall(f"{{{WSDL}}}portType")]
    faults = {
        f.get("message", "").split(":")[1]
        for f in wsdl.iter(f"{{{WSDL}}}fault")
        if f.get("message")
    }
    names = [*services, *port_types, *faults]
    assert len(names) == len(set(names))
    bindings = {b.get("name") for b in wsdl.findall(f"{{{WSDL}}}binding")}
    assert bindings == {f"{p}Soap{v}Binding" for p in port_types for v in ("11", "12")}


def test_python_m_zeep_lists_the_operations(live: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "zeep", f"{live}/wsn/broker?wsdl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Subscribe(ConsumerReference:" in result.stdout
    assert "Traceback" not in result.stderr
