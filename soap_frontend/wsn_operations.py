"""The WS-N operations the frontend knows: the body element of each (:class:`Op`, with the
QName helpers :func:`T` and :func:`BR`), their WS-Addressing request and response actions
(:data:`ACTIONS`), and the constants of their contents (the topic dialect URIs, ONVIF's
topic namespace, :data:`INFINITE`).  A part of :mod:`.codec`, which re-exports it.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Final

from .xml import (
    WSNBR,
    WSNBRW,
    WSNBW,
    WSNT,
    WSRF_RL,
    WSRF_RP,
    WSRF_RPW,
    qname,
)

#: ONVIF's topic namespace (its clients know it as ``tns1``)
ONVIF_TOPICS: Final = "http://www.onvif.org/ver10/topics"
#: requested "no scheduled termination" (xsi:nil="true")
INFINITE: Final = datetime.max.replace(tzinfo=UTC)

SIMPLE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
FULL: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"


def T(local: str) -> str:
    """QName in the b-2 namespace."""
    return qname(WSNT, local)


def BR(local: str) -> str:
    """QName in the br-2 namespace."""
    return qname(WSNBR, local)


# --- operations and actions ------------------------------------------------------------
class Op(enum.Enum):
    """Operations the frontend dispatches, keyed by the body element QName."""

    NOTIFY = T("Notify")
    SUBSCRIBE = T("Subscribe")
    GET_CURRENT_MESSAGE = T("GetCurrentMessage")
    CREATE_PULL_POINT = T("CreatePullPoint")
    GET_MESSAGES = T("GetMessages")
    DESTROY_PULL_POINT = T("DestroyPullPoint")
    RENEW = T("Renew")
    UNSUBSCRIBE = T("Unsubscribe")
    PAUSE = T("PauseSubscription")
    RESUME = T("ResumeSubscription")
    REGISTER_PUBLISHER = BR("RegisterPublisher")
    DESTROY_REGISTRATION = BR("DestroyRegistration")
    GET_RESOURCE_PROPERTY = qname(WSRF_RP, "GetResourceProperty")
    GET_MULTIPLE_RESOURCE_PROPERTIES = qname(WSRF_RP, "GetMultipleResourceProperties")
    GET_RESOURCE_PROPERTY_DOCUMENT = qname(WSRF_RP, "GetResourcePropertyDocument")
    #: WS-ResourceLifetime immediate termination of a subscription, pull point or
    #: registration (docs/conformance.md: RP-02, PP-03, PRM-02)
    DESTROY = qname(WSRF_RL, "Destroy")

    @property
    def local(self) -> str:
        """Local name of the body element."""
        return self.value.split("}", 1)[1]


OPERATIONS: Final[dict[str, Op]] = {op.value: op for op in Op}

_BW = WSNBW
_BRW = WSNBRW
_RPW = WSRF_RPW

#: (request action, response action); Notify is one-way
ACTIONS: Final[dict[Op, tuple[str, str | None]]] = {
    Op.NOTIFY: (f"{_BW}/NotificationConsumer/Notify", None),
    Op.SUBSCRIBE: (
        f"{_BW}/NotificationProducer/SubscribeRequest",
        f"{_BW}/NotificationProducer/SubscribeResponse",
    ),
    Op.GET_CURRENT_MESSAGE: (
        f"{_BW}/NotificationProducer/GetCurrentMessageRequest",
        f"{_BW}/NotificationProducer/GetCurrentMessageResponse",
    ),
    Op.CREATE_PULL_POINT: (
        f"{_BW}/CreatePullPoint/CreatePullPointRequest",
        f"{_BW}/CreatePullPoint/CreatePullPointResponse",
    ),
    Op.GET_MESSAGES: (
        f"{_BW}/PullPoint/GetMessagesRequest",
        f"{_BW}/PullPoint/GetMessagesResponse",
    ),
    Op.DESTROY_PULL_POINT: (
        f"{_BW}/PullPoint/DestroyPullPointRequest",
        f"{_BW}/PullPoint/DestroyPullPointResponse",
    ),
    Op.RENEW: (
        f"{_BW}/SubscriptionManager/RenewRequest",
        f"{_BW}/SubscriptionManager/RenewResponse",
    ),
    Op.UNSUBSCRIBE: (
        f"{_BW}/SubscriptionManager/UnsubscribeRequest",
        f"{_BW}/SubscriptionManager/UnsubscribeResponse",
    ),
    Op.PAUSE: (
        f"{_BW}/SubscriptionManager/PauseSubscriptionRequest",
        f"{_BW}/SubscriptionManager/PauseSubscriptionResponse",
    ),
    Op.RESUME: (
        f"{_BW}/SubscriptionManager/ResumeSubscriptionRequest",
        f"{_BW}/SubscriptionManager/ResumeSubscriptionResponse",
    ),
    Op.REGISTER_PUBLISHER: (
        f"{_BRW}/RegisterPublisher/RegisterPublisherRequest",
        f"{_BRW}/RegisterPublisher/RegisterPublisherResponse",
    ),
    Op.DESTROY_REGISTRATION: (
        f"{_BRW}/PublisherRegistrationManager/DestroyRegistrationRequest",
        f"{_BRW}/PublisherRegistrationManager/DestroyRegistrationResponse",
    ),
    Op.GET_RESOURCE_PROPERTY: (
        f"{_RPW}/GetResourceProperty/GetResourcePropertyRequest",
        f"{_RPW}/GetResourceProperty/GetResourcePropertyResponse",
    ),
    Op.GET_MULTIPLE_RESOURCE_PROPERTIES: (
        f"{_RPW}/GetMultipleResourceProperties/GetMultipleResourcePropertiesRequest",
        f"{_RPW}/GetMultipleResourceProperties/GetMultipleResourcePropertiesResponse",
    ),
    Op.GET_RESOURCE_PROPERTY_DOCUMENT: (
        f"{_RPW}/GetResourcePropertyDocument/GetResourcePropertyDocumentRequest",
        f"{_RPW}/GetResourcePropertyDocument/GetResourcePropertyDocumentResponse",
    ),
    Op.DESTROY: (
        "http://docs.oasis-open.org/wsrf/rlw-2/ImmediateResourceTermination/DestroyRequest",
        "http://docs.oasis-open.org/wsrf/rlw-2/ImmediateResourceTermination/DestroyResponse",
    ),
}

NOTIFY_ACTION: Final = ACTIONS[Op.NOTIFY][0]


def response_action(op: Op) -> str | None:
    """The wsa:Action of the response to ``op``."""
    return ACTIONS[op][1]
