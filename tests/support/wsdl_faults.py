"""The faults a WSDL 1.1 document declares, per port type and operation (the older WS-N
versions' fault tests)."""

from __future__ import annotations

from lxml import etree

WSDL = "http://schemas.xmlsoap.org/wsdl/"

#: a fault: (wsdl:fault name, detail element as a Clark name)
Fault = tuple[str, str]


def _resolve(el: etree._Element, value: str) -> str:
    prefix, _, local = value.rpartition(":")
    return f"{{{el.nsmap[prefix or None]}}}{local}"


def declared(wsdl: bytes) -> dict[tuple[str, str], set[Fault]]:
    """(port type, operation) → its faults, read from the WSDL document."""
    doc = etree.fromstring(wsdl)
    messages = {}
    for msg in doc.iterfind(f"{{{WSDL}}}message"):
        part = msg.find(f"{{{WSDL}}}part")
        assert part is not None
        messages[msg.get("name")] = _resolve(part, str(part.get("element")))
    found: dict[tuple[str, str], set[Fault]] = {}
    for pt in doc.iterfind(f"{{{WSDL}}}portType"):
        for op in pt.iterfind(f"{{{WSDL}}}operation"):
            faults = found.setdefault((str(pt.get("name")), str(op.get("name"))), set())
            for fault in op.iterfind(f"{{{WSDL}}}fault"):
                message = str(fault.get("message")).rpartition(":")[2]
                faults.add((str(fault.get("name")), messages[message]))
    return found
