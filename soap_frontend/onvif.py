"""The ONVIF event service (``http://www.onvif.org/ver10/events/wsdl``) over the broker.

ONVIF clients (video management systems, Home Assistant's ONVIF integration) take events
from a camera through its event service rather than WS-N's CreatePullPoint.  This module
offers that interface on its own endpoints, so that such a client reads what publishers put
into the middleware as it reads a camera's events:

``POST /onvif/event_service``
    GetServiceCapabilities, GetEventProperties, CreatePullPointSubscription, and WS-N's
    Subscribe (push; the subscription is an ordinary one, managed at /wsn/subscriptions/<id>)
``POST /onvif/subscriptions/<id>``
    the pull-point subscription: PullMessages, SetSynchronizationPoint, and WS-N's Renew
    and Unsubscribe

A pull-point subscription is a core pull point fed by a core subscription with the
request's filter (``<id>`` is the subscription's id): CreatePullPointSubscription creates
both with one termination time, Renew renews both, Unsubscribe destroys the pull point (and
so the subscription), and they expire together.  PullMessages answers as soon as messages
wait, else when one arrives or ``Timeout`` passes (an empty answer), without holding a
request thread meanwhile (:mod:`.long_poll`).  Its messages are settled once the answer
was sent, as GetMessages' are (:mod:`.settled_answers`): an answer its client did not get
is given back, and they come again in the next PullMessages.

Where the ONVIF Core specification's text leaves a detail open, the choices are noted in
docs/onvif.md ("guesses").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final, cast
from urllib.parse import urlsplit

import isodate
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    NotificationMessage,
    SubscribeRequest,
)
from wsnmom.core.ports import BrokerPort
from wsnmom.topic_mapping.dialects import CONCRETE, ONVIF_CONCRETE_SET

from . import codec, settled_answers
from .codec import INFINITE, ONVIF_TOPICS, T
from .dispatch import Result
from .envelope import SoapRequest
from .faults import BaseFaultError, xsd_datetime
from .long_poll import WaitFor
from .resource_properties import rendered_once
from .splice import Spliced, add_marker
from .xml import TEV, WSNBW, WSTOP, children, qname, serialize_standalone, text_of

__all__ = [
    "EVENT_SERVICE_PATH",
    "MAX_TIMEOUT",
    "ONVIF_TOPICS",
    "SUBSCRIPTIONS_PATH",
    "TEV",
    "EventService",
    "PullMessagesFault",
]

#: the endpoint of the event service
EVENT_SERVICE_PATH: Final = "/onvif/event_service"
#: pull-point subscriptions are ``SUBSCRIPTIONS_PATH/<id>``
SUBSCRIPTIONS_PATH: Final = "/onvif/subscriptions"
#: the longest PullMessages Timeout served (longer: PullMessagesFaultResponse)
MAX_TIMEOUT: Final = timedelta(minutes=10)
#: XPath 1.0, the MessageContent dialect core evaluates
XPATH_10: Final = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: where ONVIF publishes its topic namespace and its message schema (guesses: the
#: specification names no fixed location a device must report)
TOPIC_NAMESPACE_LOCATION: Final = "http://www.onvif.org/onvif/ver10/topics/topicns.xml"
MESSAGE_SCHEMA_LOCATION: Final = "http://www.onvif.org/onvif/ver10/schema/onvif.xsd"

_EVENT_PORT = f"{TEV}/EventPortType"
_PULL_PORT = f"{TEV}/PullPointSubscription"
_SM = f"{WSNBW}/SubscriptionManager"


def V(local: str) -> str:
    """QName in the ONVIF event service's namespace."""
    return qname(TEV, local)


#: operations of the service endpoint: body element → (metric name, response action)
SERVICE_OPS: Final[dict[str, tuple[str, str]]] = {
    V("GetServiceCapabilities"): (
        "onvif:GetServiceCapabilities",
        f"{_EVENT_PORT}/GetServiceCapabilitiesResponse",
    ),
    V("GetEventProperties"): (
        "onvif:GetEventProperties",
        f"{_EVENT_PORT}/GetEventPropertiesResponse",
    ),
    V("CreatePullPointSubscription"): (
        "onvif:CreatePullPointSubscription",
        f"{_EVENT_PORT}/CreatePullPointSubscriptionResponse",
    ),
    T("Subscribe"): ("onvif:Subscribe", f"{WSNBW}/NotificationProducer/SubscribeResponse"),
}
#: operations of a pull-point subscription
SUBSCRIPTION_OPS: Final[dict[str, tuple[str, str]]] = {
    V("PullMessages"): ("onvif:PullMessages", f"{_PULL_PORT}/PullMessagesResponse"),
    V("SetSynchronizationPoint"): (
        "onvif:SetSynchronizationPoint",
        f"{_PULL_PORT}/SetSynchronizationPointResponse",
    ),
    T("Renew"): ("onvif:Renew", f"{_SM}/RenewResponse"),
    T("Unsubscribe"): ("onvif:Unsubscribe", f"{_SM}/UnsubscribeResponse"),
}
#: the fault action of PullMessagesFaultResponse
PULL_FAULT_ACTION: Final = f"{_PULL_PORT}/PullMessages/Fault/PullMessagesFaultResponse"


class PullMessagesFault(errors.WsnError):
    """PullMessages asked for more than the service gives: ``tev:PullMessagesFaultResponse``
    with the MaxTimeout and MaxMessageLimit it serves."""

    namespace = TEV
    fault_name = "PullMessagesFaultResponse"

    def __init__(self, description: str, max_timeout: timedelta, max_messages: int) -> None:
        super().__init__(description)
        max_t = etree.Element(V("MaxTimeout"), nsmap={"tev": TEV})
        max_t.text = isodate.duration_isoformat(max_timeout)
        max_n = etree.Element(V("MaxMessageLimit"), nsmap={"tev": TEV})
        max_n.text = str(max_messages)
        #: the detail's leading elements (``faults.fault_detail``)
        self.detail_elements = (max_t, max_n)
        #: the fault message's wsa:Action (``faults.fault_action``)
        self.fault_action = PULL_FAULT_ACTION


def subscription_id_of(path: str) -> str | None:
    """The pull-point subscription a path (a request's or a ``wsa:To``'s) names."""
    prefix = SUBSCRIPTIONS_PATH + "/"
    if path.startswith(prefix):
        rest = path[len(prefix) :]
        if rest and "/" not in rest:
            return rest
    return None


class EventService:
    """One request to the ONVIF event service (a ``dispatch.SoapHandler``)."""

    def __init__(
        self,
        service: BrokerPort,
        subscription_id: str | None,
        base_url: str,
        max_messages: int,
    ) -> None:
        self.service = service
        self.subscription_id = subscription_id
        self.base_url = base_url.rstrip("/")
        self.max_messages = max_messages

    def address(self, subscription_id: str) -> str:
        """The address of a pull-point subscription."""
        return f"{self.base_url}{SUBSCRIPTIONS_PATH}/{subscription_id}"

    def _ops(self) -> Mapping[str, tuple[str, str]]:
        return SUBSCRIPTION_OPS if self.subscription_id else SERVICE_OPS

    def operation_name(self, operation: str) -> str:
        """The request metric's label ("unknown" for what the service does not serve;
        known before ``wsa:To`` is read, so it does not depend on the endpoint)."""
        found = SERVICE_OPS.get(operation) or SUBSCRIPTION_OPS.get(operation)
        return found[0] if found else "unknown"

    def handle(self, req: SoapRequest, environ: Mapping[str, Any] | None) -> Result:
        """Answer ``req``; PullMessages may raise ``WaitFor``."""
        sid = self.subscription_id
        if sid is None and req.addressing.to:  # posted to the service, addressed by wsa:To
            try:
                sid = subscription_id_of(urlsplit(req.addressing.to).path)
            except ValueError:
                sid = None
            self.subscription_id = sid
        found = self._ops().get(req.operation)
        if found is None:
            where = "a pull-point subscription" if sid else "the ONVIF event service"
            raise BaseFaultError(f"{req.operation} is not an operation of {where}")
        action = found[1]
        body = req.body
        local = req.operation.split("}", 1)[1]
        if sid is None:
            if local == "GetServiceCapabilities":
                return self._capabilities(), action
            if local == "GetEventProperties":
                return self._event_properties(), action
            if local == "CreatePullPointSubscription":
                return self._create(body, req), action
            sub = self.service.subscribe(codec.parse_subscribe(body, req.version))
            address = self.service.subscription_address(sub.id)
            return codec.subscribe_response(sub, address, self.service.now()), action
        if local == "PullMessages":
            return self._pull(sid, body, action)
        if local == "SetSynchronizationPoint":
            self.service.synchronize(sid)
            return codec.new(V("SetSynchronizationPointResponse")), action
        if local == "Renew":
            value, invalid = codec.parse_renew(body)
            pull_point = self._pull_point_of(sid)
            sub = self.service.renew(sid, value, invalid=invalid)
            granted = sub.termination_time or INFINITE
            self.service.renew_pull_point(pull_point, granted)
            return codec.renew_response(sub, self.service.now()), action
        # Unsubscribe: the pull point goes, and the subscription feeding it with it
        self.service.destroy_pull_point(self._pull_point_of(sid))
        return codec.new(T("UnsubscribeResponse")), action

    # -- the service ---------------------------------------------------------------------
    def _capabilities(self) -> etree._Element:
        resp = codec.new(V("GetServiceCapabilitiesResponse"))
        caps = etree.SubElement(resp, V("Capabilities"), nsmap={"tev": TEV})
        # WS-N's own pull points and pausable subscriptions are served at /wsn/broker,
        # not at this endpoint; nothing is kept for Seek
        caps.set("WSSubscriptionPolicySupport", "false")
        caps.set("WSPullPointSupport", "false")
        caps.set("WSPausableSubscriptionManagerInterfaceSupport", "false")
        caps.set("PersistentNotificationStorage", "false")
        return resp

    def _event_properties(self) -> etree._Element:
        props = self.service.broker_properties()
        resp = codec.new(V("GetEventPropertiesResponse"))
        etree.SubElement(resp, V("TopicNamespaceLocation")).text = TOPIC_NAMESPACE_LOCATION
        codec.add(resp, T("FixedTopicSet"), "true" if props.fixed_topic_set else "false")
        (topic_set,) = rendered_once(
            props, "onvif:TopicSet", lambda: [onvif_topic_set(props.topic_set)]
        )
        resp.append(topic_set)
        dialects = [ONVIF_CONCRETE_SET, CONCRETE]
        dialects += [d for d in props.dialects if d not in dialects]
        for dialect in dialects:
            codec.add(resp, T("TopicExpressionDialect"), dialect)
        etree.SubElement(resp, V("MessageContentFilterDialect")).text = XPATH_10
        etree.SubElement(resp, V("MessageContentSchemaLocation")).text = MESSAGE_SCHEMA_LOCATION
        return resp

    def _create(self, body: etree._Element, req: SoapRequest) -> etree._Element:
        service = self.service
        topic = message_content = producer_properties = None
        filter_xml = None
        itt: Any = None
        invalid = False
        unsupported: list[str] = []
        for child in children(body):
            if child.tag == V("Filter"):
                filter_xml = serialize_standalone(child)
                topic, message_content, producer_properties = codec.parse_filter(child)
            elif child.tag == V("InitialTerminationTime"):
                itt, invalid = codec.parse_time(child)
            elif child.tag == V("SubscriptionPolicy"):
                unsupported += [str(p.tag) for p in children(child)]
        if invalid:
            raise errors.UnacceptableInitialTerminationTime(
                "InitialTerminationTime is empty or not a dateTime/duration"
            )
        pull_point = service.create_pull_point(CreatePullPointRequest(initial_termination_time=itt))
        try:
            sub = service.subscribe(
                SubscribeRequest(
                    consumer=EndpointReference(service.pull_point_address(pull_point.id)),
                    topic=topic,
                    message_content=message_content,
                    producer_properties=producer_properties,
                    filter_xml=filter_xml,
                    initial_termination_time=itt,
                    soap_version=req.version,
                    unsupported_policy=tuple(unsupported),
                )
            )
            # one lifetime for both: the subscription's
            service.renew_pull_point(pull_point.id, sub.termination_time or INFINITE)
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to answer
                service.destroy_pull_point(pull_point.id)
            raise
        resp = codec.new(V("CreatePullPointSubscriptionResponse"))
        codec.add_epr(resp, V("SubscriptionReference"), EndpointReference(self.address(sub.id)))
        codec.add_time(resp, T("CurrentTime"), service.now())
        codec.add_time(resp, T("TerminationTime"), sub.termination_time)
        return resp

    # -- a pull-point subscription -------------------------------------------------------
    def _pull_point_of(self, subscription_id: str) -> str:
        sub = self.service.get_subscription(subscription_id)
        if sub.pull_point_id is None:
            raise errors.ResourceUnknown(
                f"{subscription_id!r} is not a pull-point subscription of the ONVIF event service"
            )
        return sub.pull_point_id

    def _pull(self, subscription_id: str, body: etree._Element, action: str) -> Result:
        timeout, limit = self._pull_arguments(body)
        pull_point = self._pull_point_of(subscription_id)
        service = self.service
        reference = EndpointReference(self.address(subscription_id))

        def attempt(final: bool) -> Result | None:
            messages, settlement = service.hand_out_messages(pull_point, limit)
            # settled once the answer is sent, given back if it is not
            settled_answers.defer(settlement)
            if not messages and not final:
                return None
            sub = service.get_subscription(subscription_id)
            return pull_response(messages, reference, service, sub.termination_time), action

        seconds = timeout.total_seconds()
        answered = attempt(seconds <= 0)
        if answered is not None:
            return answered
        raise WaitFor(attempt, time.monotonic() + seconds)

    def _pull_arguments(self, body: etree._Element) -> tuple[timedelta, int]:
        timeout: timedelta | None = None
        limit: int | None = None
        for child in children(body):
            if child.tag == V("Timeout"):
                try:
                    parsed = isodate.parse_duration(text_of(child))
                except (isodate.ISO8601Error, ValueError):
                    raise BaseFaultError("PullMessages: Timeout is not an xs:duration") from None
                if not isinstance(parsed, timedelta):
                    raise BaseFaultError("PullMessages: Timeout must not use years or months")
                timeout = parsed
            elif child.tag == V("MessageLimit"):
                try:
                    limit = int(text_of(child))
                except ValueError:
                    raise BaseFaultError("PullMessages: MessageLimit is not an xs:int") from None
        if timeout is None or limit is None:
            raise BaseFaultError("PullMessages needs a Timeout and a MessageLimit")
        if timeout < timedelta(0):
            raise BaseFaultError("PullMessages: Timeout must not be negative")
        if timeout > MAX_TIMEOUT or limit > self.max_messages or limit < 1:
            raise PullMessagesFault(
                f"PullMessages serves a Timeout up to {isodate.duration_isoformat(MAX_TIMEOUT)} "
                f"and a MessageLimit from 1 to {self.max_messages}",
                MAX_TIMEOUT,
                self.max_messages,
            )
        return timeout, limit


def pull_response(
    messages: list[NotificationMessage],
    reference: EndpointReference,
    service: BrokerPort,
    termination: Any,
) -> Spliced:
    """PullMessagesResponse: CurrentTime, TerminationTime, then each message as a
    ``wsnt:NotificationMessage`` whose SubscriptionReference is the ONVIF subscription."""
    el = codec.new(V("PullMessagesResponse"))
    etree.SubElement(el, V("CurrentTime")).text = _xsd_time(service.now())
    etree.SubElement(el, V("TerminationTime")).text = _xsd_time(termination or INFINITE)
    add_marker(el)
    content = codec.notification_messages_xml((m, reference) for m in messages)
    return Spliced(el, content)


def _xsd_time(value: Any) -> str:
    return xsd_datetime(value)


def onvif_topic_set(topic_set: etree._Element) -> etree._Element:
    """The broker's ``wstop:TopicSet`` with ONVIF's topics under the ``tns1`` prefix its
    clients look for (the other namespaces keep prefixes of their own)."""
    nsmap: dict[str, str] = {"wstop": WSTOP, "tns1": ONVIF_TOPICS}
    for prefix, uri in topic_set.nsmap.items():
        if prefix and uri not in nsmap.values():
            nsmap[prefix if prefix not in nsmap else f"ns{len(nsmap)}"] = uri
    root = etree.Element(qname(WSTOP, "TopicSet"), nsmap=cast(Any, nsmap))

    def copy(source: etree._Element, target: etree._Element) -> None:
        for child in children(source):
            made = etree.SubElement(target, child.tag)
            for name, value in child.attrib.items():
                made.set(name, value)
            copy(child, made)

    copy(topic_set, root)
    return root
