"""Client-friendly variants of two OASIS schema shapes, applied to the XSDs the gateway serves
beside its WSDL (``/wsn/schemas/<name>``).

The files in ``wsdl/`` are the official OASIS schemas, unchanged, and the gateway's messages
are valid against them.  Two of their shapes break SOAP toolkits that generate code or
objects from a WSDL:

``b-2.xsd``: ``wsnt:TopicExpressionType`` and ``wsnt:QueryExpressionType``
    are ``mixed="true"`` with an optional ``xsd:any`` child, so that a dialect could put an
    element into an expression.  No dialect does: topic expressions, message-content and
    producer-properties filters are text.  Toolkits that do not model mixed content (zeep
    among them) cannot set the text, and read received topics as empty.  Served as
    ``simpleContent`` (an ``xsd:string`` with the same attributes), they are text with a
    ``Dialect``: every such element valid against the variant is valid against the
    official type, and every expression the gateway writes is valid against both.

``bf-2.xsd``: ``wsrf-bf:BaseFaultType/ErrorCode``
    is ``complexContent mixed="true"`` extending ``xsd:anyType`` with a ``dialect``
    attribute.  zeep's signature printer (``python -m zeep``, ``client.wsdl.dump()``) fails
    with a TypeError on every type that contains it (all 37 fault types).  Served as the
    same content model written out (mixed, any elements, the ``dialect`` attribute, any
    attributes), it accepts exactly the same documents.

Messages are never validated against the variants: the gateway parses what it receives
itself, so a client generated from the official schemas (or sending element content in an
expression) is served as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from lxml import etree

from .xml import XSD

__all__ = ["VARIANTS", "apply_variant"]

_XS = f"{{{XSD}}}"


def _xs(local: str) -> str:
    return _XS + local


def _text_expression(schema: etree._Element, type_name: str) -> None:
    """Replace the mixed complexType ``type_name`` by ``simpleContent`` over xsd:string,
    keeping its attributes (``Dialect``, ``anyAttribute``)."""
    old = schema.find(f"{_xs('complexType')}[@name='{type_name}']")
    if old is None:
        raise KeyError(f"no complexType {type_name}")
    # lxml takes a None key (the default namespace) that its stubs do not admit
    nsmap: Any = old.nsmap
    new = etree.Element(_xs("complexType"), name=type_name, nsmap=nsmap)
    new.text, new.tail = old.text, old.tail
    ext = etree.SubElement(etree.SubElement(new, _xs("simpleContent")), _xs("extension"))
    ext.set("base", f"{_prefix(schema, XSD)}:string")
    for child in old:
        if child.tag in (_xs("attribute"), _xs("anyAttribute")):
            ext.append(child)
    old.getparent().replace(old, new)  # type: ignore[union-attr]


def _explicit_any_type(schema: etree._Element) -> None:
    """``ErrorCode``: the anyType extension written out as the same content model."""
    code = schema.find(f".//{_xs('element')}[@name='ErrorCode']")
    if code is None:
        raise KeyError("no ErrorCode element")
    old = code.find(_xs("complexType"))
    assert old is not None
    attribute = old.find(f".//{_xs('attribute')}[@name='dialect']")
    assert attribute is not None
    nsmap: Any = old.nsmap  # a None key (default namespace): see _text_expression
    new = etree.Element(_xs("complexType"), mixed="true", nsmap=nsmap)
    any_el = etree.SubElement(etree.SubElement(new, _xs("sequence")), _xs("any"))
    any_el.set("namespace", "##any")
    any_el.set("processContents", "lax")
    any_el.set("minOccurs", "0")
    any_el.set("maxOccurs", "unbounded")
    new.append(attribute)
    any_attribute = etree.SubElement(new, _xs("anyAttribute"))
    any_attribute.set("namespace", "##any")
    any_attribute.set("processContents", "lax")
    new.tail = old.tail
    code.replace(old, new)


def _prefix(el: etree._Element, uri: str) -> str:
    return next(p for p, u in el.nsmap.items() if u == uri and p)


def _b2(schema: etree._Element) -> None:
    _text_expression(schema, "TopicExpressionType")
    _text_expression(schema, "QueryExpressionType")


#: schema file -> the change made to it
VARIANTS: Final[dict[str, Callable[[etree._Element], None]]] = {
    "b-2.xsd": _b2,
    "bf-2.xsd": _explicit_any_type,
}

_NOTE = (
    " wsnmom serves this schema with a client-friendly variant of one shape; see "
    "docs/clients.md (schema variants). Documents valid against it are valid against the "
    "official OASIS schema. "
)


def apply_variant(name: str, data: bytes) -> bytes:
    """``data`` (the official schema ``name``) with its variant applied, or unchanged."""
    change = VARIANTS.get(name)
    if change is None:
        return data
    root = etree.fromstring(data)
    change(root)
    root.insert(0, etree.Comment(_NOTE))
    return bytes(etree.tostring(root, encoding="utf-8", xml_declaration=True))
