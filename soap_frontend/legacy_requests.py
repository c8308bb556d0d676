"""Older WS-N requests rewritten, in place, into the WS-N 1.3 request each stands for (the
table in :mod:`.legacy`'s docstring), so the 1.3 parsers and core handle them unchanged;
their WS-Addressing elements renamed to WS-Addressing 1.0 on the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import WireVersion
from wsnmom.topic_mapping.dialects import XPATH

from . import codec
from .envelope import SoapRequest, parse_addressing
from .legacy import Legacy, local_name
from .xml import WSA, WSNBR, WSNT, WSRF_RL, WSRF_RP, children, qname, resolve_qname, text_of

__all__ = ["Answered", "to_current"]

_FULL: Final = codec.FULL
_CONCRETE: Final = codec.CONCRETE


class Answered(Exception):
    """Raised by :func:`to_current` for a request it answers itself (no 1.3 request
    stands for it): ``element`` is the answer in 1.3 namespaces, translated back as any."""

    def __init__(self, element: etree._Element) -> None:
        super().__init__("answered")
        self.element = element


def to_current(legacy: Legacy, req: SoapRequest, kind: str) -> SoapRequest:
    """``req`` rewritten into the WS-N 1.3 request it stands for (the table in
    :mod:`.legacy`), with ``wire`` set to ``legacy``'s version."""
    _rename_addressing(req.envelope, legacy.wsa_namespaces, WSA, qname(legacy.wsnt, "Message"))
    header = next((c for c in req.envelope if local_name(c) == "Header"), None)
    addressing = parse_addressing(header)
    body = req.body
    if kind == "subscribe":
        _subscribe(legacy, body)
    elif kind == "notify":
        _notify(legacy, body)
    elif kind == "current":
        body.tag = qname(WSNT, "GetCurrentMessage")
        for child in children(body):
            if local_name(child) == "Topic":
                _topic(legacy, child, qname(WSNT, "Topic"), concrete=True)
    elif kind == "pause":
        body.tag = qname(WSNT, "PauseSubscription")
    elif kind == "resume":
        body.tag = qname(WSNT, "ResumeSubscription")
    elif kind == "register":
        _register(legacy, body)
    elif kind == "destroy":
        body.tag = qname(WSRF_RL, "Destroy")
    elif kind == "set_termination_time":
        body.tag = qname(WSNT, "Renew")
        for child in children(body):
            if local_name(child) == "RequestedTerminationTime":
                child.tag = qname(WSNT, "TerminationTime")
    elif kind == "get_property":
        body = _get_property(legacy, body)
    elif kind == "producer_pause":
        raise errors.PauseFailed(
            "pausing the whole producer or a topic is not supported; pause a "
            "subscription (PauseSubscription at its SubscriptionReference)"
        )
    else:  # producer_resume: nothing is paused, so "no change occurs" (N10 §8.5)
        raise Answered(etree.Element(qname(WSNT, "ResumeResponse")))
    return replace(req, body=body, addressing=addressing, wire=legacy.version)


def _dialect(el: etree._Element, default: str) -> str:
    """The Dialect of an older expression element: its ``Dialect`` (1.2) or ``dialect``
    (1.0 spelling) attribute, else ``default``."""
    value = el.get("Dialect") or el.get("dialect")
    return value.strip() if value else default


def _topic(legacy: Legacy, el: etree._Element, tag: str, *, concrete: bool) -> None:
    """Rename a topic expression element to ``tag`` with a 1.3 Dialect: a 1.0
    TopicPathExpression has none (guess: the Full dialect, Concrete for the concrete
    paths of Notify and GetCurrentMessage; a trailing ``//*`` means "this topic and
    every descendant", which Full writes ``//.``: design note B.1.6)."""
    default = _CONCRETE if concrete else _FULL
    dialect = _dialect(el, default)
    if legacy.version is WireVersion.WSN_10 and not concrete:
        text = text_of(el)
        el.text = "|".join(_legacy_path(p.strip()) for p in text.split("|"))
    el.tag = tag
    el.attrib.pop("dialect", "")
    el.set("Dialect", dialect)


def _subscribe(legacy: Legacy, body: etree._Element) -> None:
    body.tag = qname(WSNT, "Subscribe")
    filt: etree._Element | None = None
    raw = False
    for child in children(body):
        local = local_name(child)
        if local == "ConsumerReference":
            child.tag = qname(WSNT, "ConsumerReference")
            continue
        if local in ("TopicPathExpression", "TopicExpression", "Selector", "Precondition"):
            if filt is None:
                filt = etree.Element(qname(WSNT, "Filter"))
                child.addprevious(filt)
            if local in ("TopicPathExpression", "TopicExpression"):
                _topic(legacy, child, qname(WSNT, "TopicExpression"), concrete=False)
            else:
                # guess: Selector is a boolean over the message (1.3 MessageContent),
                # Precondition one over the producer's properties (ProducerProperties)
                tag = "MessageContent" if local == "Selector" else "ProducerProperties"
                dialect = _dialect(child, XPATH)
                child.tag = qname(WSNT, tag)
                child.attrib.pop("dialect", "")
                child.set("Dialect", dialect)
            filt.append(child)
        elif local == "UseNotify":
            raw = text_of(child).lower() in ("false", "0")
            body.remove(child)
        elif local == "SubscriptionPolicy":
            # guess: the 1.0/1.2 policy language is unspecified (wsp:Policy); ignored
            body.remove(child)
        elif local == "InitialTerminationTime":
            child.tag = qname(WSNT, "InitialTerminationTime")
    if raw:
        policy = etree.SubElement(body, qname(WSNT, "SubscriptionPolicy"))
        etree.SubElement(policy, qname(WSNT, "UseRaw"))


def _notify(legacy: Legacy, body: etree._Element) -> None:
    body.tag = qname(WSNT, "Notify")
    for holder in children(body):
        if local_name(holder) != "NotificationMessage":
            continue
        holder.tag = qname(WSNT, "NotificationMessage")
        for part in children(holder):
            local = local_name(part)
            if local == "Topic":
                _topic(legacy, part, qname(WSNT, "Topic"), concrete=True)
            elif local in ("ProducerReference", "SubscriptionReference", "Message"):
                part.tag = qname(WSNT, local)


def _register(legacy: Legacy, body: etree._Element) -> None:
    body.tag = qname(WSNBR, "RegisterPublisher")
    for child in children(body):
        local = local_name(child)
        if local in ("Topic", "TopicPathExpression"):
            _topic(legacy, child, qname(WSNBR, "Topic"), concrete=False)
        elif local in ("PublisherReference", "Demand", "InitialTerminationTime"):
            child.tag = qname(WSNBR, local)


def _get_property(legacy: Legacy, body: etree._Element) -> etree._Element:
    """A new ``wsrf-rp:GetResourceProperty`` naming the 1.3 property an older QName
    stands for (an unknown one stays in the older namespace, so it is answered with
    the InvalidResourceProperty fault)."""
    text = text_of(body)
    resolved = resolve_qname(text, body.nsmap)
    if resolved is None or not resolved.startswith("{"):
        raise errors.InvalidResourcePropertyQName(
            f"{text!r} is not a resolvable resource property QName"
        )
    ns, local = resolved[1:].split("}", 1)
    target = resolved
    if ns in (legacy.wsnt, legacy.wsnbr):
        mapped = _PROPERTIES.get(local)
        if mapped is not None:
            target = mapped
    elif ns == legacy.wsrl and local in ("CurrentTime", "TerminationTime"):
        target = qname(WSRF_RL, local)
    new_ns, new_local = target[1:].split("}", 1)
    el = etree.Element(qname(WSRF_RP, "GetResourceProperty"), nsmap={"p": new_ns})
    el.text = f"p:{new_local}"
    return el


def _legacy_path(path: str) -> str:
    """A 1.0 TopicPathExpression path in Full dialect syntax: a trailing ``//*`` (this
    topic and its descendants, 1.0 §6.5) is Full's ``//.``."""
    return path[:-3] + "//." if path.endswith("//*") else path


def _rename_addressing(
    envelope: etree._Element, namespaces: Sequence[str], to: str, payload: str
) -> None:
    """Rename every element of an older WS-Addressing namespace to ``to``, except inside
    notification payloads (elements named ``payload``, Clark notation), which are
    published as they came."""
    prefixes = tuple("{" + ns + "}" for ns in namespaces)
    stack = [envelope]
    while stack:
        el = stack.pop()
        tag = el.tag
        if not isinstance(tag, str) or tag == payload:
            continue
        if tag.startswith(prefixes):
            local = tag.rsplit("}", 1)[1]
            if local == "ReferenceProperties":
                local = "ReferenceParameters"
            el.tag = qname(to, local)
        stack.extend(el)


#: 1.0 / 1.2-draft resource property names → the 1.3 property (CreationTime: the
#: subscription's; a registration's is asked with the 1.3 name)
_PROPERTIES: Final[dict[str, str]] = {
    "ConsumerReference": qname(WSNT, "ConsumerReference"),
    "CreationTime": qname(WSNT, "CreationTime"),
    "FixedTopicSet": qname(WSNT, "FixedTopicSet"),
    "TopicExpression": qname(WSNT, "TopicExpression"),
    "TopicExpressionDialects": qname(WSNT, "TopicExpressionDialect"),
    "SubscriptionPolicy": qname(WSNT, "SubscriptionPolicy"),
    "RequiresRegistration": qname(WSNBR, "RequiresRegistration"),
    "PublisherReference": qname(WSNBR, "PublisherReference"),
    "Demand": qname(WSNBR, "Demand"),
}
