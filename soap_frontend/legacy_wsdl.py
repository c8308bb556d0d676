"""The WSDL 1.1 description of an older WS-N wire format the broker accepts
(``?wsdl&version=1.0``, ``?wsdl&version=1.2-draft``; :mod:`.legacy`).

It names the operations the broker serves in that version, with that version's element
names, in document/literal SOAP 1.2 and SOAP 1.1 bindings, and a service per port type at
the broker's public base URL:

* NotificationBroker (broker endpoint): Notify, Subscribe, GetCurrentMessage,
  RegisterPublisher, GetResourceProperty;
* SubscriptionManager (subscriptions): PauseSubscription, ResumeSubscription, Destroy,
  SetTerminationTime, GetResourceProperty;
* PublisherRegistrationManager (registrations): Destroy, SetTerminationTime,
  GetResourceProperty.

The types are declared inline with open content (``xsd:any`` lax): the 1.0 specification's
own schema cannot be served as printed (its extraction is garbled and it misspells
``ResgisterPublisherResponse``), and the 1.2 drafts' schemas are not shipped here, so the
element names and their namespaces are what this WSDL pins down.  Faults: each operation
declares exactly the faults the server sends for it in this version,
:func:`.legacy_faults.declared_faults` of its kind of request, named by the rule the runtime
follows (:func:`.legacy_faults.fault_element`): 1.0, ``ErrorMessage`` (xsd:string) in the
interface's namespace under the 1.0 fault name; 1.2-draft, the draft's ``...Fault``
element.
"""

from __future__ import annotations

import functools

from lxml import etree
from wsnmom.core.addresses import BROKER_PATH, ResourceKind, kind_path
from wsnmom.core.model import WireVersion

from .legacy import LEGACY, Legacy
from .legacy_faults import LegacyFault, declared_faults
from .metadata import (
    HTTP_TRANSPORT,
    SOAP11_PORT,
    SOAP12_PORT,
    WSDL,
    WSDL_SOAP11,
    WSDL_SOAP12,
    add_services,
)
from .xml import XSD

#: (operation, interface namespace key, request local, response local or None, kind of
#: request: its faults are :func:`.legacy_faults.declared_faults` of it)
_Op = tuple[str, str, str, str | None, str]
#: port type -> (its operations, its endpoint path): :func:`_operations`
_PortTypes = dict[str, tuple[tuple[_Op, ...], str]]


def _operations(legacy: Legacy) -> dict[str, tuple[tuple[_Op, ...], str]]:
    """Port type → (operations, endpoint path)."""
    ten = legacy.version is WireVersion.WSN_10
    req = "Request" if ten else ""
    notify: _Op = ("Notify", "wsnt", "Notify", None, "notify")
    subscribe: _Op = (
        "Subscribe",
        "wsnt",
        "Subscribe" + req,
        "SubscribeResponse",
        "subscribe",
    )
    current: _Op = (
        "GetCurrentMessage",
        "wsnt",
        "GetCurrentMessage" + req,
        "GetCurrentMessageResponse",
        "current",
    )
    register: _Op = (
        "RegisterPublisher",
        "wsnbr",
        "RegisterPublisher" + req,
        "RegisterPublisherResponse",
        "register",
    )
    get_rp: _Op = (
        "GetResourceProperty",
        "wsrp",
        "GetResourceProperty",
        "GetResourcePropertyResponse",
        "get_property",
    )
    pause: _Op = (
        "PauseSubscription",
        "wsnt",
        "PauseSubscription" + req,
        "PauseSubscriptionResponse",
        "pause",
    )
    resume: _Op = (
        "ResumeSubscription",
        "wsnt",
        "ResumeSubscription" + req,
        "ResumeSubscriptionResponse",
        "resume",
    )
    destroy: _Op = (
        "Destroy",
        "wsrl",
        "Destroy",
        "DestroyResponse",
        "destroy",
    )
    set_tt: _Op = (
        "SetTerminationTime",
        "wsrl",
        "SetTerminationTime",
        "SetTerminationTimeResponse",
        "set_termination_time",
    )
    return {
        "NotificationBroker": ((notify, subscribe, current, register, get_rp), BROKER_PATH),
        "SubscriptionManager": (
            (pause, resume, destroy, set_tt, get_rp),
            kind_path(ResourceKind.SUBSCRIPTION),
        ),
        "PublisherRegistrationManager": (
            (destroy, set_tt, get_rp),
            kind_path(ResourceKind.REGISTRATION),
        ),
    }


def _q(ns: str, local: str) -> str:
    return f"{{{ns}}}{local}"


def _fault_message(fault: LegacyFault, prefix: dict[str, str]) -> str:
    """The wsdl:message name of ``fault``: its name qualified by its namespace's prefix
    (1.0's UnknownResource is an ErrorMessage in three namespaces; 1.2-draft's
    ResourceUnknownFault an element of three)."""
    suffix = "" if fault.name.endswith("Fault") else "Fault"
    return f"{prefix[fault.namespace]}-{fault.name}{suffix}"


def _build(legacy: Legacy, base: str) -> etree._Element:
    """The WSDL document of ``legacy``'s wire format for a broker at ``base``."""
    ns = {"wsnt": legacy.wsnt, "wsnbr": legacy.wsnbr, "wsrl": legacy.wsrl, "wsrp": legacy.wsrp}
    if legacy.wsbf is not None:
        ns["wsbf"] = legacy.wsbf
    tns = legacy.wsnt
    nsmap = {"wsdl": WSDL, "soap": WSDL_SOAP11, "soap12": WSDL_SOAP12, "xsd": XSD, "tns": tns}
    for key, uri in ns.items():
        if uri not in nsmap.values():
            nsmap[key] = uri
    defs = etree.Element(_q(WSDL, "definitions"), nsmap=nsmap)
    defs.set("name", f"WsnmomNotificationBroker-{legacy.version.value}")
    defs.set("targetNamespace", tns)
    etree.SubElement(defs, _q(WSDL, "documentation")).text = (
        f"wsnmom WS-Notification broker, WS-Notification {legacy.version.value} wire format "
        f"(WS-Addressing {legacy.wsa}). Requests are recognised by their Body element's "
        "namespace; the WS-N 1.3 description is ?wsdl."
    )
    port_types = _operations(legacy)
    _types(defs, legacy, ns, port_types)
    prefix = {uri: key for key, uri in ns.items()}
    prefix[tns] = "tns"
    _messages(defs, legacy, ns, prefix, port_types)
    _port_types(defs, legacy, prefix, port_types)
    _bindings(defs, legacy, ns, port_types)
    add_services(defs, port_types, base, (SOAP12_PORT, SOAP11_PORT))
    return defs


def _types(
    defs: etree._Element,
    legacy: Legacy,
    ns: dict[str, str],
    port_types: _PortTypes,
) -> None:
    """wsdl:types: one schema per namespace with every element the operations use."""
    # every element used, per namespace
    elements: dict[str, dict[str, None]] = {uri: {} for uri in ns.values()}
    for ops, _ in port_types.values():
        for _, key, request, response, kind in ops:
            elements[ns[key]][request] = None
            if response:
                elements[ns[key]][response] = None
            for fault in declared_faults(legacy, kind):
                elements[fault.namespace][fault.local] = None
    types = etree.SubElement(defs, _q(WSDL, "types"))
    for uri, names in elements.items():
        if not names:
            continue
        schema = etree.SubElement(types, _q(XSD, "schema"))
        schema.set("targetNamespace", uri)
        schema.set("elementFormDefault", "qualified")
        for local in names:
            el = etree.SubElement(schema, _q(XSD, "element"), name=local)
            if local == "ErrorMessage":
                el.set("type", "xsd:string")
                continue
            seq = etree.SubElement(
                etree.SubElement(el, _q(XSD, "complexType")), _q(XSD, "sequence")
            )
            any_el = etree.SubElement(seq, _q(XSD, "any"), namespace="##any")
            any_el.set("processContents", "lax")
            any_el.set("minOccurs", "0")
            any_el.set("maxOccurs", "unbounded")


def _messages(
    defs: etree._Element,
    legacy: Legacy,
    ns: dict[str, str],
    prefix: dict[str, str],
    port_types: _PortTypes,
) -> None:
    """A wsdl:message per request, response and declared fault."""
    messages: dict[str, tuple[str, str]] = {}
    for ops, _ in port_types.values():
        for _, key, request, response, kind in ops:
            messages[request] = (ns[key], request)
            if response:
                messages[response] = (ns[key], response)
            for fault in declared_faults(legacy, kind):
                messages[_fault_message(fault, prefix)] = (fault.namespace, fault.local)
    for name, (uri, local) in messages.items():
        msg = etree.SubElement(defs, _q(WSDL, "message"), name=name)
        part = etree.SubElement(msg, _q(WSDL, "part"), name="body")
        part.set("element", f"{prefix[uri]}:{local}")


def _port_types(
    defs: etree._Element,
    legacy: Legacy,
    prefix: dict[str, str],
    port_types: _PortTypes,
) -> None:
    """A wsdl:portType per endpoint, with its operations and their faults."""
    for pt_name, (ops, _) in port_types.items():
        pt = etree.SubElement(defs, _q(WSDL, "portType"), name=pt_name)
        for name, _, request, response, kind in ops:
            op_el = etree.SubElement(pt, _q(WSDL, "operation"), name=name)
            etree.SubElement(op_el, _q(WSDL, "input"), message=f"tns:{request}")
            if response:
                etree.SubElement(op_el, _q(WSDL, "output"), message=f"tns:{response}")
            for fault in declared_faults(legacy, kind):
                etree.SubElement(
                    op_el,
                    _q(WSDL, "fault"),
                    name=fault.name,
                    message=f"tns:{_fault_message(fault, prefix)}",
                )


def _bindings(
    defs: etree._Element,
    legacy: Legacy,
    ns: dict[str, str],
    port_types: _PortTypes,
) -> None:
    """A SOAP 1.2 and a SOAP 1.1 binding of each port type (document/literal)."""
    for pt_name, (ops, _) in port_types.items():
        for suffix, soap_ns in (SOAP12_PORT, SOAP11_PORT):
            b = etree.SubElement(
                defs, _q(WSDL, "binding"), name=f"{pt_name}{suffix}Binding", type=f"tns:{pt_name}"
            )
            etree.SubElement(b, _q(soap_ns, "binding"), style="document", transport=HTTP_TRANSPORT)
            for name, key, request, response, kind in ops:
                op_el = etree.SubElement(b, _q(WSDL, "operation"), name=name)
                etree.SubElement(
                    op_el,
                    _q(soap_ns, "operation"),
                    soapAction=legacy.action(_q(ns[key], request)),
                    style="document",
                )
                inp = etree.SubElement(op_el, _q(WSDL, "input"))
                etree.SubElement(inp, _q(soap_ns, "body"), use="literal")
                if response:
                    out = etree.SubElement(op_el, _q(WSDL, "output"))
                    etree.SubElement(out, _q(soap_ns, "body"), use="literal")
                for fault in declared_faults(legacy, kind):
                    fault_el = etree.SubElement(op_el, _q(WSDL, "fault"), name=fault.name)
                    etree.SubElement(fault_el, _q(soap_ns, "fault"), name=fault.name, use="literal")


@functools.lru_cache(maxsize=64)
def render_legacy_wsdl(version: WireVersion, base: str) -> bytes:
    """The WSDL of the older wire format ``version`` for a broker at ``base``."""
    return etree.tostring(
        _build(LEGACY[version], base), encoding="utf-8", xml_declaration=True, pretty_print=True
    )


__all__ = ["render_legacy_wsdl"]
