"""WS-ResourceProperties of the broker, subscriptions, registrations and pull points:
one renderer per property, GetResourceProperty(ies) responses and the property document,
and the gateway's delivery policy as XML (:func:`policy_element`) (a part of :mod:`.codec`,
which re-exports it).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import isodate
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    PublisherRegistration,
    PullPoint,
    Subscription,
    SubscriptionState,
)
from wsnmom.core.ports import BrokerPort, BrokerProperties
from wsnmom.core.redaction import redact_url
from wsnmom.topic_mapping.model import Topic

from .faults import xsd_datetime
from .responses import (
    add,
    add_epr,
    add_expression,
    add_time,
    add_topic,
    new,
)
from .wsn_operations import (
    BR,
    CONCRETE,
    SIMPLE,
    T,
)
from .xml import (
    WSNMOM,
    WSNMOM_POLICY,
    WSRF_RL,
    WSRF_RP,
    WSTOP,
    parse_fragment,
    qname,
)

# --- resource properties ---------------------------------------------------------------
PropertyRenderer = Callable[[], list[etree._Element]]


def _el(tag: str, text: str | None = None) -> etree._Element:
    return new(tag, text)


def _bool(value: Any) -> str:
    return "true" if value else "false"


def _time_el(tag: str, value: datetime | None) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    return add_time(holder, tag, value)


def _expr_el(tag: str, expr: Any) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    if isinstance(expr, ExpressionSource):
        return add_expression(holder, tag, expr)
    if isinstance(expr, Topic):
        return add_topic(holder, tag, expr, CONCRETE)
    return add_expression(holder, tag, ExpressionSource(SIMPLE, str(expr), {}))


def _epr_el(tag: str, epr: EndpointReference) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    return add_epr(holder, tag, epr)


def _shown_epr_el(tag: str, epr: EndpointReference) -> etree._Element:
    """An EPR shown in a property document: a password in its address is hidden."""
    shown = redact_url(epr.address)
    return _epr_el(tag, epr if shown == epr.address else dataclasses.replace(epr, address=shown))


def _fragment(data: bytes | None) -> list[etree._Element]:
    return [parse_fragment(data)] if data else []


_rendered_lock = threading.RLock()  # (a weakref callback may run while it is held)
#: elements rendered of a ``BrokerProperties``, by ``id``, as long as the object lives (the
#: broker keeps one per topic-set version and visibility; the entry goes with the object)
_rendered: dict[int, tuple[weakref.ref[BrokerProperties], dict[str, etree._Element]]] = {}


def rendered_once(
    props: BrokerProperties, name: str, build: Callable[[], list[etree._Element]]
) -> list[etree._Element]:
    """Copies of the elements ``build`` renders of ``props``, rendered once per ``props``
    object: the broker hands out one object per topic-set version and visibility
    (``core.advertised.AdvertisedProperties``), so a topic set of many topics is rendered
    once per change, not once per request; each answer gets a copy (one C-level copy).
    What is rendered is forgotten with the object."""
    key = id(props)
    with _rendered_lock:
        entry = _rendered.get(key)
        mine = entry is not None and entry[0]() is props
        holder = entry[1].get(name) if entry is not None and mine else None
    if holder is None:
        holder = new(qname(WSNMOM, "_"))
        for el in build():
            holder.append(el)
        with _rendered_lock:
            entry = _rendered.get(key)
            if entry is None or entry[0]() is not props:
                entry = _rendered[key] = (weakref.ref(props, _forget(key)), {})
            entry[1][name] = holder
    return list(copy.deepcopy(holder))


def _forget(key: int) -> Callable[[weakref.ref[BrokerProperties]], None]:
    def forget(ref: weakref.ref[BrokerProperties]) -> None:
        with _rendered_lock:
            entry = _rendered.get(key)
            if entry is not None and entry[0] is ref:
                del _rendered[key]

    return forget


def broker_properties(service: BrokerPort) -> dict[str, PropertyRenderer]:
    """Resource properties of the NotificationBroker (NotificationBrokerRP + policy); the
    ones with an element per topic are rendered once per topic-set change
    (:func:`rendered_once`)."""

    def props() -> BrokerProperties:
        return service.broker_properties()

    def expressions() -> list[etree._Element]:
        p = props()
        name = T("TopicExpression")
        return rendered_once(p, name, lambda: [_expr_el(name, e) for e in p.topic_expressions])

    return {
        T("TopicExpression"): expressions,
        T("FixedTopicSet"): lambda: [_el(T("FixedTopicSet"), _bool(props().fixed_topic_set))],
        T("TopicExpressionDialect"): lambda: [
            _el(T("TopicExpressionDialect"), d) for d in props().dialects
        ],
        # a copy (a serialised round trip in the default ASCII encoding turned a non-ASCII
        # topic name into a character reference, which no element name may contain)
        qname(WSTOP, "TopicSet"): lambda: [copy.deepcopy(props().topic_set)],
        BR("RequiresRegistration"): lambda: [
            _el(BR("RequiresRegistration"), _bool(props().requires_registration))
        ],
        qname(WSNMOM_POLICY, "BrokerPolicy"): lambda: [policy_element(service.policy())],
    }


def subscription_properties(sub: Subscription, now: datetime) -> dict[str, PropertyRenderer]:
    """Resource properties of a subscription (SubscriptionManagerRP + WSRL times)."""
    return {
        T("ConsumerReference"): lambda: [_shown_epr_el(T("ConsumerReference"), sub.consumer)],
        T("Filter"): lambda: _fragment(sub.filter_xml),
        T("SubscriptionPolicy"): lambda: _fragment(sub.policy_xml),
        T("CreationTime"): lambda: [_time_el(T("CreationTime"), sub.creation_time)],
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), sub.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), sub.termination_time)
        ],
        qname(WSNMOM, "Paused"): lambda: [
            _el(qname(WSNMOM, "Paused"), _bool(sub.state is SubscriptionState.PAUSED))
        ],
        qname(WSNMOM, "MessagesLost"): lambda: [
            _el(qname(WSNMOM, "MessagesLost"), str(sub.messages_lost))
        ],
    }


def registration_properties(
    reg: PublisherRegistration, now: datetime
) -> dict[str, PropertyRenderer]:
    """Resource properties of a publisher registration (PublisherRegistrationRP + WSRL
    times, which WS-N 1.0 §11.1 requires of a registration)."""
    return {
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), reg.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), reg.termination_time)
        ],
        BR("PublisherReference"): lambda: (
            [_shown_epr_el(BR("PublisherReference"), reg.publisher_reference)]
            if reg.publisher_reference
            else []
        ),
        BR("Topic"): lambda: [_expr_el(BR("Topic"), t) for t in reg.topics],
        BR("Demand"): lambda: [_el(BR("Demand"), _bool(reg.demand))],
        BR("CreationTime"): lambda: [_time_el(BR("CreationTime"), reg.creation_time)],
    }


def pull_point_properties(pp: PullPoint, now: datetime) -> dict[str, PropertyRenderer]:
    """Resource properties of a pull point (WSRL-style times, creation time, name)."""
    props: dict[str, PropertyRenderer] = {
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), pp.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), pp.termination_time)
        ],
        qname(WSNMOM, "CreationTime"): lambda: [
            _time_el(qname(WSNMOM, "CreationTime"), pp.creation_time)
        ],
    }
    if pp.name:
        name = pp.name
        props[qname(WSNMOM, "Name")] = lambda: [_el(qname(WSNMOM, "Name"), name)]
    return props


def get_resource_property_response(
    table: Mapping[str, PropertyRenderer], names: Sequence[str], *, multiple: bool = False
) -> etree._Element:
    """GetResourcePropertyResponse / GetMultipleResourcePropertiesResponse."""
    tag = "GetMultipleResourcePropertiesResponse" if multiple else "GetResourcePropertyResponse"
    resp = new(qname(WSRF_RP, tag))
    for name in names:
        renderer = table.get(name)
        if renderer is None:
            raise errors.InvalidResourcePropertyQName(
                f"{name} is not a resource property of this resource"
            )
        for el in renderer():
            resp.append(el)
    return resp


#: members of the standard resource property documents, in schema order (b-2.xsd,
#: br-2.xsd: closed sequences).  Other properties of these resources (WSRL times, the
#: broker policy) are read with GetResourceProperty, not listed in the document, so the
#: document stays schema-valid (docs/conformance.md: BRP-01, PRP-01).
_DOCUMENT_MEMBERS: Final[dict[str, tuple[str, ...]]] = {
    T("SubscriptionManagerRP"): (
        T("ConsumerReference"),
        T("Filter"),
        T("SubscriptionPolicy"),
        T("CreationTime"),
    ),
    BR("NotificationBrokerRP"): (
        T("TopicExpression"),
        T("FixedTopicSet"),
        T("TopicExpressionDialect"),
        qname(WSTOP, "TopicSet"),
        BR("RequiresRegistration"),
    ),
    BR("PublisherRegistrationRP"): (
        BR("PublisherReference"),
        BR("Topic"),
        BR("Demand"),
        BR("CreationTime"),
    ),
}


def resource_property_document(table: Mapping[str, PropertyRenderer], tag: str) -> etree._Element:
    """GetResourcePropertyDocumentResponse wrapping the properties of ``tag`` (its schema
    members in schema order for the standard documents, else every property)."""
    resp = new(qname(WSRF_RP, "GetResourcePropertyDocumentResponse"))
    doc = add(resp, tag)
    members = _DOCUMENT_MEMBERS.get(tag)
    renderers = (
        [table[name] for name in members if name in table] if members else list(table.values())
    )
    for renderer in renderers:
        for el in renderer():
            doc.append(el)
    return resp


# --- policy ----------------------------------------------------------------------------
def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _policy_value(parent: etree._Element, name: str, value: Any) -> None:
    tag = qname(WSNMOM_POLICY, _camel(name))
    if value is None:
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        child = add(parent, tag)
        for f in dataclasses.fields(value):
            _policy_value(child, f.name, getattr(value, f.name))
        return
    if isinstance(value, Mapping):
        child = add(parent, tag)
        for k, v in value.items():
            _policy_value(child, str(k), v)
        return
    if isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _policy_value(parent, name, item)
        return
    add(parent, tag, _policy_text(value))


def _policy_text(value: Any) -> str:
    if isinstance(value, bool):
        return _bool(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, timedelta):
        return str(isodate.duration_isoformat(value))
    if isinstance(value, datetime):
        return xsd_datetime(value)
    return str(value)


def policy_element(policy: Any) -> etree._Element:
    """Render the broker's policy (a dataclass, mapping or element) as
    ``<wsnmom-policy:BrokerPolicy>`` with one child per field (CamelCase)."""
    if isinstance(policy, etree._Element):
        return policy
    root = etree.Element(qname(WSNMOM_POLICY, "BrokerPolicy"), nsmap={"wsp-b": WSNMOM_POLICY})
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        for f in dataclasses.fields(policy):
            _policy_value(root, f.name, getattr(policy, f.name))
    elif isinstance(policy, Mapping):
        for k, v in policy.items():
            _policy_value(root, str(k), v)
    return root
