"""A typed WS-Notification client (WS-BaseNotification 1.3, WS-BrokeredNotification 1.3)
for any WS-N broker over HTTP, and a small consumer endpoint that receives notifications.

::

    from wsnmom.client import NotificationConsumer, WsnClient

    with WsnClient("http://127.0.0.1:8080/wsn/broker") as wsn, NotificationConsumer() as inbox:
        sub = wsn.subscribe(inbox, "{urn:example}alarms//*")
        wsn.notify("<alarm level='high'/>", "{urn:example}alarms/fire")
        print(inbox.get(timeout=5).payload_xml)
        sub.unsubscribe()

Built on lxml and requests (no zeep, no Flask): importing this package starts nothing and
imports none of them; each name is imported from its module on first use, so the command
line's ``--help`` and commands that never send a request do not pay for requests and the
SOAP codec (docs/performance.md, "Process start").

=========================  ==========================================================
:class:`WsnClient`         every broker operation (Subscribe, Notify, GetCurrentMessage,
                           CreatePullPoint, RegisterPublisher, WS-RP reads) and the
                           resource operations (Renew, Unsubscribe, Pause/Resume,
                           GetMessages, DestroyPullPoint, DestroyRegistration)
:class:`Subscription`,     handles of the resources the broker creates (their EPR, times,
:class:`PullPoint`,        and operations); context managers that end the resource
:class:`PublisherRegistration`
:class:`NotificationConsumer`  a threaded HTTP server receiving Notify (wrapped and raw)
:class:`Credentials`       HTTP Basic, bearer token or WS-Security UsernameToken
:class:`TopicExpression`   topic expression text + prefixes + dialect
:class:`Notification`      a received notification (payload, topic, references)
:mod:`.errors`             ``WsnFault`` subclasses, one per WS-N / WS-RF fault
:mod:`.onvif`              an ONVIF event service: CreatePullPointSubscription,
                           PullMessages, Renew, Unsubscribe
=========================  ==========================================================
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from wsnmom.core.model import SoapVersion

    from .broker import Target, WsnClient
    from .consumer import NotificationConsumer
    from .credentials import Credentials
    from .errors import (
        AuthenticationFailed,
        ClientError,
        InvalidFilterFault,
        InvalidMessageContentExpressionFault,
        InvalidTopicExpressionFault,
        MultipleTopicsSpecifiedFault,
        NoCurrentMessageOnTopicFault,
        ResourceUnknownFault,
        SoapFault,
        TopicExpressionDialectUnknownFault,
        TopicNotSupportedFault,
        TransportError,
        UnableToGetMessagesFault,
        UnacceptableInitialTerminationTimeFault,
        UnacceptableTerminationTimeFault,
        WsnFault,
    )
    from .model import (
        CONCRETE,
        FULL,
        NO_TERMINATION,
        ONVIF_CONCRETE_SET,
        SIMPLE,
        XPATH,
        EndpointReference,
        Message,
        Notification,
        TopicExpression,
        text_payload,
    )
    from .resources import PublisherRegistration, PullPoint, Subscription, SubscriptionProperties

#: where ``wsnmom serve`` listens by default
DEFAULT_BROKER: Final = "http://127.0.0.1:8080/wsn/broker"

__all__ = [
    "CONCRETE",
    "DEFAULT_BROKER",
    "FULL",
    "NO_TERMINATION",
    "ONVIF_CONCRETE_SET",
    "SIMPLE",
    "XPATH",
    "AuthenticationFailed",
    "ClientError",
    "Credentials",
    "EndpointReference",
    "InvalidFilterFault",
    "InvalidMessageContentExpressionFault",
    "InvalidTopicExpressionFault",
    "Message",
    "MultipleTopicsSpecifiedFault",
    "NoCurrentMessageOnTopicFault",
    "Notification",
    "NotificationConsumer",
    "PublisherRegistration",
    "PullPoint",
    "ResourceUnknownFault",
    "SoapFault",
    "SoapVersion",
    "Subscription",
    "SubscriptionProperties",
    "Target",
    "TopicExpression",
    "TopicExpressionDialectUnknownFault",
    "TopicNotSupportedFault",
    "TransportError",
    "UnableToGetMessagesFault",
    "UnacceptableInitialTerminationTimeFault",
    "UnacceptableTerminationTimeFault",
    "WsnClient",
    "WsnFault",
    "text_payload",
]

#: the module each lazily imported name comes from
_MODULES: Final = {
    "SoapVersion": "wsnmom.core.model",
    **dict.fromkeys(("Target", "WsnClient"), ".broker"),
    "NotificationConsumer": ".consumer",
    "Credentials": ".credentials",
    **dict.fromkeys(
        (
            "AuthenticationFailed",
            "ClientError",
            "InvalidFilterFault",
            "InvalidMessageContentExpressionFault",
            "InvalidTopicExpressionFault",
            "MultipleTopicsSpecifiedFault",
            "NoCurrentMessageOnTopicFault",
            "ResourceUnknownFault",
            "SoapFault",
            "TopicExpressionDialectUnknownFault",
            "TopicNotSupportedFault",
            "TransportError",
            "UnableToGetMessagesFault",
            "UnacceptableInitialTerminationTimeFault",
            "UnacceptableTerminationTimeFault",
            "WsnFault",
        ),
        ".errors",
    ),
    **dict.fromkeys(
        (
            "CONCRETE",
            "FULL",
            "NO_TERMINATION",
            "ONVIF_CONCRETE_SET",
            "SIMPLE",
            "XPATH",
            "EndpointReference",
            "Message",
            "Notification",
            "TopicExpression",
            "text_payload",
        ),
        ".model",
    ),
    **dict.fromkeys(
        ("PublisherRegistration", "PullPoint", "Subscription", "SubscriptionProperties"),
        ".resources",
    ),
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next access is a plain lookup
    return value
