"""Outbound SOAP: ``SoapClient`` implements ``wsnmom.core.ports.OutboundSoap``.

Deliveries
    A wrapped delivery is one ``wsnt:Notify`` holding every message of the batch; a raw
    delivery (UseRaw) is one POST per message whose Body is the payload element.  Both use
    the consumer's SOAP version, the Notify action, ``wsa:To`` = the consumer address,
    a fresh ``wsa:MessageID`` and the consumer EPR's reference parameters echoed as header
    blocks marked ``wsa:IsReferenceParameter="true"``.

Demand-based publishing
    ``subscribe`` / ``unsubscribe`` / ``pause`` / ``resume`` talk to a registered publisher's
    NotificationProducer and its subscription manager (SOAP 1.1, the most widely
    understood binding).  Several topics are combined into one Full-dialect expression
    (``a | b``) because several TopicExpression filters would be ANDed (FLT-02).

Failures
    Connection errors, timeouts and non-2xx answers raise ``DeliveryFailed``.  A SOAP fault
    with a Sender/Client code is ``permanent`` (the peer will not accept it again).

Addresses
    Every call first checks its address with core's outbound policy
    (``wsnmom.core.outbound_policy.OutboundPolicy``, the same object the broker checks
    Subscribe and RegisterPublisher with).  A refused address raises
    ``DeliveryFailed(permanent=True)`` (``permanent=False`` when the name could not be
    resolved just now) without any traffic to it; an allowed one is reached at exactly the
    addresses the policy checked (no second DNS lookup).

HTTP
    Connections are pooled per host and kept alive (``outbound_http.OutboundConnections``,
    urllib3).  Proxies (``http_proxy``, ``no_proxy``, ...) and the CA bundle
    (``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``) are read from the environment once, when the
    client is made; ``~/.netrc`` credentials are never sent to consumers or publishers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from lxml import etree
from wsnmom.core.app_headers import TRACE_HEADERS
from wsnmom.core.config import Settings
from wsnmom.core.coordination import INSTANCE_HEADER, instance_id
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    ExpressionSource,
    SoapVersion,
    WireVersion,
)
from wsnmom.core.outbound_policy import AddressRefused, Destination, OutboundPolicy
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.redaction import redact_text, redact_url

from . import codec, legacy_answers
from .codec import ACTIONS, FULL, SIMPLE, Op
from .envelope import SOAP_NS, content_type_for, envelope_bytes
from .legacy import LEGACY, Legacy
from .message_info import messages_header
from .outbound_http import (
    TRANSPORT_ERRORS,
    OutboundConnections,
    OutboundEnvironment,
    is_timeout,
)
from .splice import Spliced
from .xml import WSA, WSNT, XmlRejected, children, parse_fragment, parse_xml, qname, text_of

log = logging.getLogger("wsnmom.soap.client")

USER_AGENT = "wsnmom-soap-client"
_PATH_DIALECTS = (None, SIMPLE, codec.CONCRETE, FULL)
_PREFIX_RE = re.compile(r"([A-Za-z_][\w.-]*):")


class SoapClient:
    """Outbound SOAP calls over pooled keep-alive connections."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        policy: OutboundPolicy | None = None,
        pool_size: int = 32,
        publisher_soap_version: SoapVersion = SoapVersion.SOAP11,
        environment: OutboundEnvironment | None = None,
    ) -> None:
        """``policy``: the broker's outbound policy (built from ``settings.outbound``, or
        the defaults, when not given)."""
        if policy is None:
            policy = OutboundPolicy(settings.outbound if settings is not None else None)
        self.policy = policy
        self.publisher_soap_version = publisher_soap_version
        self.environment = environment or OutboundEnvironment.from_environ()
        self.connections = OutboundConnections(self.environment, pool_size=pool_size)
        #: sent as ``WSNMOM-Instance`` with every call: which instance of a cluster called
        self.instance = instance_id(settings.cluster.instance_id if settings else "")

    def close(self) -> None:
        """Close pooled connections."""
        self.connections.close()

    # --- deliveries ------------------------------------------------------------------------
    def notify(
        self,
        consumer: EndpointReference,
        soap_version: SoapVersion,
        messages: Sequence[Delivered],
        *,
        use_raw: bool,
        timeout: float,
        wire_version: WireVersion = WireVersion.WSN_13,
    ) -> None:
        """Deliver ``messages`` wrapped in one Notify, or raw one by one, in the WS-N wire
        format ``wire_version`` (an older one: ``legacy``)."""
        if not messages:
            return
        where = self._check(consumer.address)
        legacy = LEGACY.get(wire_version)
        action = codec.NOTIFY_ACTION if legacy is None else legacy.notify_action
        if use_raw:
            for d in messages:
                body = codec.raw_payload(d.message)
                hops = codec.hops_header([d.message.via])
                info = messages_header([d.message])
                trace = _trace(d.message.headers)
                self._post(
                    consumer, where, soap_version, body, action, timeout, hops, info, trace, legacy
                )
        else:
            wrapped: etree._Element | Spliced = (
                codec.notify_element(messages)
                if legacy is None
                else legacy_answers.notify_element(legacy, messages)
            )
            hops = codec.hops_header([d.message.via for d in messages])
            info = messages_header([d.message for d in messages])
            trace = _trace(messages[0].message.headers)
            self._post(
                consumer, where, soap_version, wrapped, action, timeout, hops, info, trace, legacy
            )

    # --- demand-based publishing ---------------------------------------------------------
    def subscribe(
        self,
        producer: EndpointReference,
        consumer: EndpointReference,
        topics: Sequence[ExpressionSource],
        *,
        timeout: float,
    ) -> EndpointReference:
        """Subscribe ``consumer`` at ``producer`` for ``topics``; returns the
        SubscriptionReference."""
        where = self._check(producer.address)
        body = codec.new(qname(WSNT, "Subscribe"))
        codec.add_epr(body, qname(WSNT, "ConsumerReference"), consumer)
        if topics:
            filt = codec.add(body, qname(WSNT, "Filter"))
            for expr in combine_topics(topics):
                codec.add_expression(filt, qname(WSNT, "TopicExpression"), expr)
        reply = self._post(
            producer, where, self.publisher_soap_version, body, ACTIONS[Op.SUBSCRIBE][0], timeout
        )
        ref = reply.find(qname(WSNT, "SubscriptionReference")) if reply is not None else None
        if ref is None:
            raise DeliveryFailed("the publisher's SubscribeResponse has no SubscriptionReference")
        from .envelope import parse_epr

        try:
            return parse_epr(ref)
        except ValueError as exc:
            raise DeliveryFailed(str(exc), permanent=True) from None

    def unsubscribe(self, subscription: EndpointReference, *, timeout: float) -> None:
        """Unsubscribe a subscription made with ``subscribe``."""
        self._manage(subscription, Op.UNSUBSCRIBE, timeout)

    def pause(self, subscription: EndpointReference, *, timeout: float) -> None:
        """PauseSubscription on a subscription made with ``subscribe``."""
        self._manage(subscription, Op.PAUSE, timeout)

    def resume(self, subscription: EndpointReference, *, timeout: float) -> None:
        """ResumeSubscription on a subscription made with ``subscribe``."""
        self._manage(subscription, Op.RESUME, timeout)

    def _manage(self, subscription: EndpointReference, op: Op, timeout: float) -> None:
        where = self._check(subscription.address)
        body = codec.new(op.value)
        self._post(subscription, where, self.publisher_soap_version, body, ACTIONS[op][0], timeout)

    # --- HTTP ----------------------------------------------------------------------------
    def _check(self, address: str) -> Destination:
        try:
            return self.policy.check(address)
        except AddressRefused as exc:
            raise DeliveryFailed(str(exc), permanent=not exc.temporary) from None

    def _post(
        self,
        target: EndpointReference,
        where: Destination,
        version: SoapVersion,
        body: etree._Element | Spliced,
        action: str,
        timeout: float,
        hops: etree._Element | None = None,
        info: etree._Element | None = None,
        trace: Sequence[tuple[str, str]] = (),
        legacy: Legacy | None = None,
    ) -> etree._Element | None:
        if legacy is None:
            headers = [_reference_header(p) for p in target.reference_parameters]
        else:
            headers = legacy_answers.reference_headers(target.reference_parameters)
        headers += [h for h in (hops, info) if h is not None]
        if legacy is None:
            data = envelope_bytes(
                version, body, action=action, to=target.address, extra_headers=headers
            )
        else:
            data = legacy_answers.envelope_bytes(
                legacy, version, body, action=action, to=target.address, extra_headers=headers
            )
        http_headers = {
            "Content-Type": content_type_for(version, action),
            "User-Agent": USER_AGENT,
            INSTANCE_HEADER: self.instance,
        }
        if version is SoapVersion.SOAP11:
            http_headers["SOAPAction"] = f'"{action}"'
        http_headers.update(trace)
        try:
            status, content, retry_after = self.connections.post(
                where,
                data,
                http_headers,
                connect_timeout=min(timeout, 5.0),
                read_timeout=timeout,
            )
        except TRANSPORT_ERRORS as exc:
            shown = redact_url(target.address)
            raise DeliveryFailed(
                redact_text(f"{shown}: {type(exc).__name__}: {exc}"), timed_out=is_timeout(exc)
            ) from None
        if 200 <= status < 300:
            return _reply_body(content)
        permanent, reason = _fault_reason(content)
        raise DeliveryFailed(
            f"{redact_url(target.address)} answered HTTP {status}"
            + (f": {redact_text(reason)}" if reason else ""),
            permanent=permanent,
            answered=True,
            status=status,
            retry_after=retry_after_seconds(retry_after) if status in (429, 503) else None,
        )


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header (delay-seconds or an HTTP-date) as seconds from ``now``;
    None when absent or unreadable (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _trace(headers: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The W3C trace context among a message's application headers, sent as HTTP headers
    (a batched Notify carries its first message's)."""
    return tuple((n, v) for n, v in headers if n.lower() in TRACE_HEADERS)


def _reference_header(param: bytes) -> etree._Element:
    el = parse_fragment(param)
    el.set(qname(WSA, "IsReferenceParameter"), "true")
    return el


def _reply_body(content: bytes) -> etree._Element | None:
    if not content.strip():
        return None
    try:
        env = parse_xml(content)
    except XmlRejected:
        return None
    for ns in SOAP_NS.values():
        body = env.find(qname(ns, "Body"))
        if body is not None:
            kids = children(body)
            return kids[0] if kids else None
    return None


def _fault_reason(content: bytes) -> tuple[bool, str]:
    """(permanent, reason) from a fault response; transient when it is not a SOAP fault."""
    body = _reply_body(content)
    if body is None or not str(body.tag).endswith("}Fault"):
        return False, ""
    code = body.findtext("faultcode") or body.findtext("{*}Code/{*}Value") or ""
    reason = body.findtext("faultstring") or ""
    if not reason:
        text = body.find("{*}Reason/{*}Text")
        reason = text_of(text) if text is not None else ""
    local = code.strip().rsplit(":", 1)[-1]
    return local in ("Client", "Sender"), reason.strip()


def combine_topics(topics: Sequence[ExpressionSource]) -> list[ExpressionSource]:
    """One expression selecting any of ``topics``: a Full-dialect union when the dialects
    are path dialects and their prefixes agree, else the expressions unchanged."""
    if len(topics) <= 1:
        return list(topics)
    if not all(t.dialect in _PATH_DIALECTS for t in topics):
        return list(topics)
    merged: dict[str | None, str] = {}
    for t in topics:
        used: set[str | None] = set(_PREFIX_RE.findall(t.text))
        used.add(None)
        for prefix in used:
            uri = t.namespaces.get(prefix)
            if uri is None:
                continue
            if merged.setdefault(prefix, uri) != uri:
                return list(topics)
    text = " | ".join(t.text.strip() for t in topics)
    return [ExpressionSource(FULL, text, merged)]


__all__ = ["OutboundEnvironment", "SoapClient", "combine_topics"]
