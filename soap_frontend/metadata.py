"""The broker's WSDL 1.1 description and the schemas it imports.

The WSDL is generated from the operation table below rather than kept as a static file, so
port types, SOAP 1.1 and 1.2 bindings and services cannot drift apart.  It describes:

* port types NotificationConsumer, NotificationProducer, PullPoint, CreatePullPoint,
  SubscriptionManager, PausableSubscriptionManager, RegisterPublisher,
  PublisherRegistrationManager, ResourceProperties (WS-RP reads) and NotificationBroker
  (Notify, Subscribe, GetCurrentMessage, RegisterPublisher, plus CreatePullPoint and the
  WS-RP reads, which the broker endpoint also serves);
* every input/output with its ``wsam:Action`` (the WS-N prose URIs);
* a document/literal SOAP 1.1 and a SOAP 1.2 binding per port type, each referencing the
  broker's WS-Policy (``wsam:Addressing`` plus the wsnmom policy assertions);
* one service per port type with a SOAP 1.1 and a SOAP 1.2 port at the broker's public base
  URL (the base of its endpoint references; see :mod:`.public_base`).
  Resource port types (subscriptions, pull points, registrations) point at their collection
  URL; the concrete address of a resource is the one in its EPR.

The types section imports the OASIS schemas served from ``<base>/wsn/schemas/`` (two of them
with a client-friendly variant of one shape, :mod:`.schema_variants`).  The policy
assertions are marked ``wsp:Optional`` (the broker does not require WS-Addressing headers:
it dispatches on the Body) and the broker's own assertions ``wsp:Ignorable`` (they describe
behaviour, nothing on the wire), so toolkits that enforce WS-Policy, such as Apache CXF,
accept the WSDL without knowing them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from lxml import etree
from wsnmom.core.addresses import BROKER_PATH, ResourceKind, kind_path

from .codec import ACTIONS, Op
from .schema_variants import apply_variant
from .xml import SOAP11, SOAP12, WSAM, WSNBR, WSNT, WSP, WSRF_R, WSRF_RP, WSU, XSD

WSDL = "http://schemas.xmlsoap.org/wsdl/"
WSDL_SOAP11 = "http://schemas.xmlsoap.org/wsdl/soap/"
WSDL_SOAP12 = "http://schemas.xmlsoap.org/wsdl/soap12/"
HTTP_TRANSPORT = "http://schemas.xmlsoap.org/soap/http"
TNS = "urn:wsnmom:wsdl:1"
POLICY_ID = "WsnmomBrokerPolicy"

SCHEMA_FILES = frozenset(
    {"b-2.xsd", "br-2.xsd", "bf-2.xsd", "r-2.xsd", "rp-2.xsd", "t-1.xsd", "ws-addr.xsd", "xml.xsd"}
)
_IMPORTS = ((WSNT, "b-2.xsd"), (WSNBR, "br-2.xsd"), (WSRF_RP, "rp-2.xsd"), (WSRF_R, "r-2.xsd"))


@functools.cache
def official_schema_bytes(name: str) -> bytes:
    """An OASIS schema shipped with the package, as published."""
    if name not in SCHEMA_FILES:
        raise KeyError(name)
    return (resources.files(__package__) / "wsdl" / name).read_bytes()


@functools.cache
def schema_bytes(name: str) -> bytes:
    """An OASIS schema as served: with its client-friendly variant, if it has one
    (:mod:`.schema_variants`)."""
    return apply_variant(name, official_schema_bytes(name))


# --- operation table -------------------------------------------------------------------
RU = (WSRF_R, "ResourceUnknownFault")


def _t(name: str) -> tuple[str, str]:
    return (WSNT, name)


def _br(name: str) -> tuple[str, str]:
    return (WSNBR, name)


def _rp(name: str) -> tuple[str, str]:
    return (WSRF_RP, name)


@dataclass(frozen=True)
class Operation:
    """One WSDL operation: input/output elements, faults and actions."""

    name: str
    op: Op
    output: tuple[str, str] | None
    faults: tuple[tuple[str, str], ...] = ()

    @property
    def input(self) -> tuple[str, str]:
        ns, local = self.op.value[1:].split("}", 1)
        return ns, local


_TOPIC_FAULTS = (
    _t("TopicExpressionDialectUnknownFault"),
    _t("InvalidTopicExpressionFault"),
    _t("TopicNotSupportedFault"),
)
NOTIFY = Operation("Notify", Op.NOTIFY, None)
SUBSCRIBE = Operation(
    "Subscribe",
    Op.SUBSCRIBE,
    _t("SubscribeResponse"),
    (
        RU,
        _t("InvalidFilterFault"),
        *_TOPIC_FAULTS,
        _t("InvalidProducerPropertiesExpressionFault"),
        _t("InvalidMessageContentExpressionFault"),
        _t("UnacceptableInitialTerminationTimeFault"),
        _t("UnrecognizedPolicyRequestFault"),
        _t("UnsupportedPolicyRequestFault"),
        _t("NotifyMessageNotSupportedFault"),
        _t("SubscribeCreationFailedFault"),
    ),
)
GET_CURRENT_MESSAGE = Operation(
    "GetCurrentMessage",
    Op.GET_CURRENT_MESSAGE,
    _t("GetCurrentMessageResponse"),
    (RU, *_TOPIC_FAULTS, _t("MultipleTopicsSpecifiedFault"), _t("NoCurrentMessageOnTopicFault")),
)
GET_MESSAGES = Operation(
    "GetMessages",
    Op.GET_MESSAGES,
    _t("GetMessagesResponse"),
    (RU, _t("UnableToGetMessagesFault")),
)
DESTROY_PULL_POINT = Operation(
    "DestroyPullPoint",
    Op.DESTROY_PULL_POINT,
    _t("DestroyPullPointResponse"),
    (RU, _t("UnableToDestroyPullPointFault")),
)
CREATE_PULL_POINT = Operation(
    "CreatePullPoint",
    Op.CREATE_PULL_POINT,
    _t("CreatePullPointResponse"),
    (_t("UnableToCreatePullPointFault"),),
)
RENEW = Operation(
    "Renew", Op.RENEW, _t("RenewResponse"), (RU, _t("UnacceptableTerminationTimeFault"))
)
UNSUBSCRIBE = Operation(
    "Unsubscribe",
    Op.UNSUBSCRIBE,
    _t("UnsubscribeResponse"),
    (RU, _t("UnableToDestroySubscriptionFault")),
)
PAUSE = Operation(
    "PauseSubscription", Op.PAUSE, _t("PauseSubscriptionResponse"), (RU, _t("PauseFailedFault"))
)
RESUME = Operation(
    "ResumeSubscription",
    Op.RESUME,
    _t("ResumeSubscriptionResponse"),
    (RU, _t("ResumeFailedFault")),
)
REGISTER_PUBLISHER = Operation(
    "RegisterPublisher",
    Op.REGISTER_PUBLISHER,
    _br("RegisterPublisherResponse"),
    (
        RU,
        _t("InvalidTopicExpressionFault"),
        _t("TopicNotSupportedFault"),
        _br("PublisherRegistrationRejectedFault"),
        _br("PublisherRegistrationFailedFault"),
        _t("UnacceptableInitialTerminationTimeFault"),
    ),
)
DESTROY_REGISTRATION = Operation(
    "DestroyRegistration",
    Op.DESTROY_REGISTRATION,
    _br("DestroyRegistrationResponse"),
    (RU, _br("ResourceNotDestroyedFault")),
)
_RP_FAULTS = (RU, (WSRF_R, "ResourceUnavailableFault"), _rp("InvalidResourcePropertyQNameFault"))
GET_RP = Operation(
    "GetResourceProperty",
    Op.GET_RESOURCE_PROPERTY,
    _rp("GetResourcePropertyResponse"),
    _RP_FAULTS,
)
GET_MULTIPLE_RP = Operation(
    "GetMultipleResourceProperties",
    Op.GET_MULTIPLE_RESOURCE_PROPERTIES,
    _rp("GetMultipleResourcePropertiesResponse"),
    _RP_FAULTS,
)
GET_RP_DOCUMENT = Operation(
    "GetResourcePropertyDocument",
    Op.GET_RESOURCE_PROPERTY_DOCUMENT,
    _rp("GetResourcePropertyDocumentResponse"),
    _RP_FAULTS[:2],
)
_RP_OPS = (GET_RP, GET_MULTIPLE_RP, GET_RP_DOCUMENT)

#: port type → (operations, URL path of its service)
PORT_TYPES: dict[str, tuple[tuple[Operation, ...], str]] = {
    "NotificationConsumer": ((NOTIFY,), BROKER_PATH),
    "NotificationProducer": ((SUBSCRIBE, GET_CURRENT_MESSAGE), BROKER_PATH),
    "NotificationBroker": (
        (NOTIFY, SUBSCRIBE, GET_CURRENT_MESSAGE, REGISTER_PUBLISHER, CREATE_PULL_POINT, *_RP_OPS),
        BROKER_PATH,
    ),
    "CreatePullPoint": ((CREATE_PULL_POINT,), BROKER_PATH),
    "RegisterPublisher": ((REGISTER_PUBLISHER,), BROKER_PATH),
    "PullPoint": (
        (GET_MESSAGES, DESTROY_PULL_POINT, NOTIFY, *_RP_OPS),
        kind_path(ResourceKind.PULL_POINT),
    ),
    "SubscriptionManager": ((RENEW, UNSUBSCRIBE, *_RP_OPS), kind_path(ResourceKind.SUBSCRIPTION)),
    "PausableSubscriptionManager": (
        (RENEW, UNSUBSCRIBE, PAUSE, RESUME, *_RP_OPS),
        kind_path(ResourceKind.SUBSCRIPTION),
    ),
    "PublisherRegistrationManager": (
        (DESTROY_REGISTRATION, *_RP_OPS),
        kind_path(ResourceKind.REGISTRATION),
    ),
    "ResourceProperties": (_RP_OPS, BROKER_PATH),
}


def _q(ns: str, local: str) -> str:
    return f"{{{ns}}}{local}"


def _build(base: str, policy: etree._Element | None) -> etree._Element:
    nsmap = {
        "wsdl": WSDL,
        "soap": WSDL_SOAP11,
        "soap12": WSDL_SOAP12,
        "xsd": XSD,
        "wsam": WSAM,
        "wsp": WSP,
        "wsu": WSU,
        "wsnt": WSNT,
        "wsn-br": WSNBR,
        "wsrf-r": WSRF_R,
        "wsrf-rp": WSRF_RP,
        "tns": TNS,
    }
    defs = etree.Element(_q(WSDL, "definitions"), nsmap=nsmap)
    defs.set("name", "WsnmomNotificationBroker")
    defs.set("targetNamespace", TNS)
    doc = etree.SubElement(defs, _q(WSDL, "documentation"))
    doc.text = (
        "wsnmom WS-Notification broker (WS-BaseNotification 1.3, WS-BrokeredNotification 1.3, "
        "WS-Topics 1.3). Dispatch is on the SOAP Body element; WS-Addressing 1.0 is used."
    )
    _policy(defs, policy)
    _types(defs, base)
    _messages(defs)
    _port_types(defs)
    _bindings(defs)
    add_services(defs, PORT_TYPES, base)
    return defs


def _policy(defs: etree._Element, policy: etree._Element | None) -> None:
    """WS-Policy: addressing plus the broker's advertised behaviour."""
    pol = etree.SubElement(defs, _q(WSP, "Policy"))
    pol.set(_q(WSU, "Id"), POLICY_ID)
    everything = etree.SubElement(etree.SubElement(pol, _q(WSP, "ExactlyOne")), _q(WSP, "All"))
    addressing = etree.SubElement(everything, _q(WSAM, "Addressing"))
    addressing.set(_q(WSP, "Optional"), "true")
    etree.SubElement(addressing, _q(WSP, "Policy"))
    if policy is not None:
        assertion = etree.fromstring(etree.tostring(policy))
        assertion.set(_q(WSP, "Optional"), "true")
        assertion.set(_q(WSP, "Ignorable"), "true")
        everything.append(assertion)


def _types(defs: etree._Element, base: str) -> None:
    """The schemas of the messages, imported from where the gateway serves them."""
    types = etree.SubElement(defs, _q(WSDL, "types"))
    schema = etree.SubElement(types, _q(XSD, "schema"))
    schema.set("targetNamespace", TNS + ":types")
    schema.set("elementFormDefault", "qualified")
    for ns, name in _IMPORTS:
        imp = etree.SubElement(schema, _q(XSD, "import"))
        imp.set("namespace", ns)
        imp.set("schemaLocation", f"{base}/wsn/schemas/{name}")


def _messages(defs: etree._Element) -> None:
    """One message per element used anywhere."""
    elements: dict[tuple[str, str], None] = {}
    for ops, _ in PORT_TYPES.values():
        for o in ops:
            elements[o.input] = None
            if o.output:
                elements[o.output] = None
            for f in o.faults:
                elements[f] = None
    prefix = {WSNT: "wsnt", WSNBR: "wsn-br", WSRF_R: "wsrf-r", WSRF_RP: "wsrf-rp"}
    for ns, local in elements:
        msg = etree.SubElement(defs, _q(WSDL, "message"), name=local)
        part = etree.SubElement(msg, _q(WSDL, "part"), name=_part_name(local))
        part.set("element", f"{prefix[ns]}:{local}")


def _port_types(defs: etree._Element) -> None:
    for pt_name, (ops, _) in PORT_TYPES.items():
        pt = etree.SubElement(defs, _q(WSDL, "portType"), name=pt_name)
        for o in ops:
            op_el = etree.SubElement(pt, _q(WSDL, "operation"), name=o.name)
            req_action, resp_action = ACTIONS[o.op]
            inp = etree.SubElement(op_el, _q(WSDL, "input"), message=f"tns:{o.input[1]}")
            inp.set("name", o.input[1] if o.output else o.name)
            inp.set(_q(WSAM, "Action"), req_action)
            if o.output:
                out = etree.SubElement(op_el, _q(WSDL, "output"), message=f"tns:{o.output[1]}")
                out.set("name", o.output[1])
                if resp_action:
                    out.set(_q(WSAM, "Action"), resp_action)
            for _, fault_local in o.faults:
                fault_el = etree.SubElement(op_el, _q(WSDL, "fault"), name=fault_local)
                fault_el.set("message", f"tns:{fault_local}")
                fault_el.set(_q(WSAM, "Action"), "http://docs.oasis-open.org/wsn/fault")


def _bindings(defs: etree._Element) -> None:
    """A SOAP 1.1 and a SOAP 1.2 binding of every port type."""
    for pt_name, (ops, _) in PORT_TYPES.items():
        for suffix, soap_ns in (("Soap11", WSDL_SOAP11), ("Soap12", WSDL_SOAP12)):
            b = etree.SubElement(
                defs, _q(WSDL, "binding"), name=f"{pt_name}{suffix}Binding", type=f"tns:{pt_name}"
            )
            etree.SubElement(b, _q(WSP, "PolicyReference"), URI=f"#{POLICY_ID}")
            etree.SubElement(b, _q(soap_ns, "binding"), style="document", transport=HTTP_TRANSPORT)
            for o in ops:
                op_el = etree.SubElement(b, _q(WSDL, "operation"), name=o.name)
                etree.SubElement(
                    op_el, _q(soap_ns, "operation"), soapAction=ACTIONS[o.op][0], style="document"
                )
                inp = etree.SubElement(op_el, _q(WSDL, "input"))
                inp.set("name", o.input[1] if o.output else o.name)
                etree.SubElement(inp, _q(soap_ns, "body"), use="literal")
                if o.output:
                    out = etree.SubElement(op_el, _q(WSDL, "output"), name=o.output[1])
                    etree.SubElement(out, _q(soap_ns, "body"), use="literal")
                for _, fault_local in o.faults:
                    fault_el = etree.SubElement(op_el, _q(WSDL, "fault"), name=fault_local)
                    etree.SubElement(
                        fault_el, _q(soap_ns, "fault"), name=fault_local, use="literal"
                    )


#: a WSDL port per SOAP version: (name suffix, namespace of its ``address``), in the
#: order :func:`add_services` writes them by default
SOAP11_PORT = ("Soap11", WSDL_SOAP11)
SOAP12_PORT = ("Soap12", WSDL_SOAP12)


def add_services(
    defs: etree._Element,
    port_types: Mapping[str, tuple[object, str]],
    base: str,
    ports: tuple[tuple[str, str], ...] = (SOAP11_PORT, SOAP12_PORT),
) -> None:
    """A wsdl:service per port type (name -> (its operations, its endpoint path)), with a
    port per SOAP version of ``ports`` at ``base`` and the path; also for the WSDL of an
    older wire format (:mod:`.legacy_wsdl`)."""
    for pt_name, (_, path) in port_types.items():
        svc = etree.SubElement(defs, _q(WSDL, "service"), name=f"{pt_name}Service")
        for suffix, soap_ns in ports:
            port = etree.SubElement(
                svc,
                _q(WSDL, "port"),
                name=f"{pt_name}{suffix}Port",
                binding=f"tns:{pt_name}{suffix}Binding",
            )
            etree.SubElement(port, _q(soap_ns, "address"), location=f"{base}{path}")


def _part_name(local: str) -> str:
    if local.endswith("Fault"):
        return "fault"
    if local.endswith("Response"):
        return "response"
    return "request"


_cache: dict[tuple[str, bytes], bytes] = {}
_lock = threading.Lock()


def render_wsdl(base: str, policy: etree._Element | None = None) -> bytes:
    """The WSDL for a broker reachable at ``base`` (scheme://host[:port]), cached."""
    key = (base, etree.tostring(policy) if policy is not None else b"")
    with _lock:
        cached = _cache.get(key)
        if cached is None:
            if len(_cache) > 64:
                _cache.clear()
            cached = etree.tostring(
                _build(base, policy), encoding="utf-8", xml_declaration=True, pretty_print=True
            )
            _cache[key] = cached
    return cached


__all__ = [
    "HTTP_TRANSPORT",
    "PORT_TYPES",
    "SCHEMA_FILES",
    "SOAP11",
    "SOAP11_PORT",
    "SOAP12",
    "SOAP12_PORT",
    "WSDL",
    "WSDL_SOAP11",
    "WSDL_SOAP12",
    "add_services",
    "official_schema_bytes",
    "render_wsdl",
    "schema_bytes",
]
