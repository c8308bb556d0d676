"""Broker errors, one class per WS-N / WS-RF fault.

Core raises these; the SOAP frontend renders each as a SOAP fault whose detail is the fault
element ``{namespace}fault_name`` (a WS-BaseFaults BaseFaultType with Timestamp and
Description).  Core knows the fault names because they are part of WS-N semantics, not of
SOAP.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

BN = "http://docs.oasis-open.org/wsn/b-2"
BR = "http://docs.oasis-open.org/wsn/br-2"
RF = "http://docs.oasis-open.org/wsrf/r-2"
RP = "http://docs.oasis-open.org/wsrf/rp-2"
BF = "http://docs.oasis-open.org/wsrf/bf-2"


class WsnError(Exception):
    """Base class: a request the broker refuses with a WS-N fault."""

    namespace: ClassVar[str] = BN
    fault_name: ClassVar[str] = "BaseFault"
    #: "Sender" (client's fault) or "Receiver" (broker's fault)
    code: ClassVar[str] = "Sender"

    #: the HTTP status to answer instead of 500 (set on the instance: 403 for an access
    #: refusal, 413 / 429 for a quota)
    http_status: int | None = None
    #: seconds after which a retry may succeed (answered as ``Retry-After``)
    retry_after: float | None = None

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class NotificationRefused(WsnError):
    """A Notify refused for who sent it or what it would cost (topic ACL, fan-out quota):
    a ``wsrf-bf:BaseFault``, since WS-N defines no Notify fault."""

    namespace = BF


class TerminationTimeFault(WsnError):
    """A refused termination time; the fault detail states the acceptable range."""

    def __init__(
        self,
        description: str,
        *,
        minimum_time: datetime | None = None,
        maximum_time: datetime | None = None,
    ) -> None:
        super().__init__(description)
        self.minimum_time = minimum_time
        self.maximum_time = maximum_time


class PolicyFault(WsnError):
    """A refused SubscriptionPolicy; the fault detail names the offending policies."""

    def __init__(self, description: str, *, policies: tuple[str, ...] = ()) -> None:
        super().__init__(description)
        self.policies = policies


class ResourceUnknown(WsnError):
    """ResourceUnknownFault."""

    namespace = RF
    fault_name = "ResourceUnknownFault"


class ResourceUnavailable(WsnError):
    """ResourceUnavailableFault.  ``retry_after`` (seconds), when set, says the condition
    is temporary (the middleware is unreachable): the frontend then answers HTTP 503 with
    a ``Retry-After`` header."""

    namespace = RF
    fault_name = "ResourceUnavailableFault"
    code = "Receiver"

    def __init__(self, description: str, *, retry_after: float | None = None) -> None:
        super().__init__(description)
        self.retry_after = retry_after


class MiddlewareOverloaded(ResourceUnavailable):
    """ResourceUnavailableFault for a middleware that is connected but answers too slowly
    (``core.adapter.MiddlewareBusy``): a Receiver fault, HTTP 503, ``Retry-After`` from the
    adapter's backlog.  Its own class and text, so that clients and operators tell an
    overloaded broker from an unreachable one."""


class InvalidResourcePropertyQName(WsnError):
    """InvalidResourcePropertyQNameFault."""

    namespace = RP
    fault_name = "InvalidResourcePropertyQNameFault"


class InvalidFilter(WsnError):
    """InvalidFilterFault."""

    fault_name = "InvalidFilterFault"


class TopicExpressionDialectUnknown(WsnError):
    """TopicExpressionDialectUnknownFault."""

    fault_name = "TopicExpressionDialectUnknownFault"


class InvalidTopicExpression(WsnError):
    """InvalidTopicExpressionFault."""

    fault_name = "InvalidTopicExpressionFault"


class TopicNotSupported(WsnError):
    """TopicNotSupportedFault."""

    fault_name = "TopicNotSupportedFault"


class MultipleTopicsSpecified(WsnError):
    """MultipleTopicsSpecifiedFault."""

    fault_name = "MultipleTopicsSpecifiedFault"


class InvalidProducerPropertiesExpression(WsnError):
    """InvalidProducerPropertiesExpressionFault."""

    fault_name = "InvalidProducerPropertiesExpressionFault"


class InvalidMessageContentExpression(WsnError):
    """InvalidMessageContentExpressionFault."""

    fault_name = "InvalidMessageContentExpressionFault"


class UnrecognizedPolicyRequest(PolicyFault):
    """UnrecognizedPolicyRequestFault."""

    fault_name = "UnrecognizedPolicyRequestFault"


class UnsupportedPolicyRequest(PolicyFault):
    """UnsupportedPolicyRequestFault."""

    fault_name = "UnsupportedPolicyRequestFault"


class NotifyMessageNotSupported(WsnError):
    """NotifyMessageNotSupportedFault."""

    fault_name = "NotifyMessageNotSupportedFault"


class UnacceptableInitialTerminationTime(TerminationTimeFault):
    """UnacceptableInitialTerminationTimeFault."""

    fault_name = "UnacceptableInitialTerminationTimeFault"


class UnacceptableTerminationTime(TerminationTimeFault):
    """UnacceptableTerminationTimeFault."""

    fault_name = "UnacceptableTerminationTimeFault"


class SubscribeCreationFailed(WsnError):
    """SubscribeCreationFailedFault."""

    fault_name = "SubscribeCreationFailedFault"
    code = "Receiver"


class ConsumerAddressRefused(SubscribeCreationFailed):
    """SubscribeCreationFailedFault for a consumer address the outbound policy refuses:
    the sender's fault, retrying the same address cannot help."""

    code = "Sender"


class NoCurrentMessageOnTopic(WsnError):
    """NoCurrentMessageOnTopicFault."""

    fault_name = "NoCurrentMessageOnTopicFault"


class UnableToGetMessages(WsnError):
    """UnableToGetMessagesFault."""

    fault_name = "UnableToGetMessagesFault"
    code = "Receiver"


class UnableToDestroyPullPoint(WsnError):
    """UnableToDestroyPullPointFault."""

    fault_name = "UnableToDestroyPullPointFault"
    code = "Receiver"


class UnableToCreatePullPoint(WsnError):
    """UnableToCreatePullPointFault."""

    fault_name = "UnableToCreatePullPointFault"
    code = "Receiver"


class UnableToDestroySubscription(WsnError):
    """UnableToDestroySubscriptionFault."""

    fault_name = "UnableToDestroySubscriptionFault"
    code = "Receiver"


class PauseFailed(WsnError):
    """PauseFailedFault."""

    fault_name = "PauseFailedFault"
    code = "Receiver"


class ResumeFailed(WsnError):
    """ResumeFailedFault."""

    fault_name = "ResumeFailedFault"
    code = "Receiver"


class PublisherRegistrationRejected(WsnError):
    """PublisherRegistrationRejectedFault."""

    namespace = BR
    fault_name = "PublisherRegistrationRejectedFault"


class PublisherRegistrationFailed(WsnError):
    """PublisherRegistrationFailedFault."""

    namespace = BR
    fault_name = "PublisherRegistrationFailedFault"
    code = "Receiver"


class ResourceNotDestroyed(WsnError):
    """ResourceNotDestroyedFault."""

    namespace = BR
    fault_name = "ResourceNotDestroyedFault"
    code = "Receiver"


def _all_faults(base: type[WsnError]) -> dict[str, type[WsnError]]:
    found: dict[str, type[WsnError]] = {}
    for cls in base.__subclasses__():
        if "fault_name" in vars(cls):  # intermediate bases declare no fault element
            found[cls.fault_name] = cls
        found.update(_all_faults(cls))
    return found


#: every fault class, by fault element local name
ALL_FAULTS: dict[str, type[WsnError]] = _all_faults(WsnError)
