"""Core's ports: what it offers a frontend, and what it needs from the outside world.

``BrokerPort`` is the broker as a frontend sees it: the WS-N operations on request records
of ``core.model``, the addresses of the resources, readiness, the policy and the broker's
resource properties.  ``core.service.BrokerService`` implements it; the SOAP frontend
(``wsnmom.soap_frontend``) is written against it, and its unit tests drive it with a fake.
Failures are ``core.errors`` exceptions.

``OutboundSoap`` is how core talks SOAP to other parties without knowing SOAP: pushing
notifications to consumers, and, for demand-based publishing, subscribing to and pausing,
resuming or unsubscribing from a registered publisher's NotificationProducer.  The SOAP
frontend implements it (``wsnmom.soap_frontend.client``); tests may inject their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from wsnmom.core.model import (
    CreatePullPointRequest,
    Delivered,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    RegisterPublisherRequest,
    RequestedTime,
    SoapVersion,
    SubscribeRequest,
    Subscription,
    WireVersion,
)

if TYPE_CHECKING:
    from lxml import etree
    from wsnmom.core.cluster import ClusterStatus
    from wsnmom.core.dead_letter_records import DeadLetter
    from wsnmom.core.operations import Overview, SubscriptionRow, SubscriptionStatus
    from wsnmom.core.peek import PeekResult
    from wsnmom.core.policy import BrokerPolicy
    from wsnmom.core.pull_handout import Settlement
    from wsnmom.core.rate_history import RatePoint

__all__ = ["BrokerPort", "BrokerProperties", "DeliveryFailed", "OutboundSoap"]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class BrokerProperties:
    """NotificationBroker resource properties (BRP-01).  The broker keeps one per
    topic-set version and visibility (``core.advertised``): read-only, and a frontend may
    keep what it renders of one as long as the object lives (weak references)."""

    #: one Full-dialect expression per member topic (with the namespaces it uses)
    topic_expressions: list[ExpressionSource]
    fixed_topic_set: bool
    dialects: tuple[str, ...]
    #: the ``wstop:TopicSet`` element
    topic_set: etree._Element
    requires_registration: bool


class BrokerPort(Protocol):
    """The broker as a frontend drives it (see the module docstring).  Every method may
    raise a ``core.errors.WsnError``; ``ResourceUnavailable`` with ``retry_after`` means
    "temporarily, come back later"."""

    # -- addresses, state, metadata --------------------------------------------------------
    @property
    def broker_address(self) -> str:
        """Address of the NotificationBroker endpoint."""
        ...

    def subscription_address(self, subscription_id: str) -> str:
        """Address of a subscription's SubscriptionManager."""
        ...

    def pull_point_address(self, pull_point_id: str) -> str:
        """Address of a pull point."""
        ...

    def registration_address(self, registration_id: str) -> str:
        """Address of a PublisherRegistrationManager resource."""
        ...

    def now(self) -> datetime:
        """The broker's clock (UTC, timezone-aware)."""
        ...

    def ready(self) -> bool:
        """Whether the broker serves requests (for ``/readyz``)."""
        ...

    def disk_low(self) -> str:
        """Why the data directory's disk refuses new work ("" when it does not)."""
        ...

    def unready_reason(self) -> str:
        """Why the broker is not ready ("" when it is), for ``/readyz``."""
        ...

    def policy(self) -> BrokerPolicy:
        """The advertised broker policy."""
        ...

    def broker_properties(self) -> BrokerProperties:
        """NotificationBroker resource properties."""
        ...

    # -- NotificationProducer / SubscriptionManager ---------------------------------------
    def subscribe(self, req: SubscribeRequest) -> Subscription:
        """Create a subscription."""
        ...

    def get_subscription(self, subscription_id: str) -> Subscription:
        """The subscription; ResourceUnknown when unknown or expired."""
        ...

    def renew(
        self, subscription_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> Subscription:
        """Set a new termination time (``invalid``: the request's value was unusable)."""
        ...

    def unsubscribe(self, subscription_id: str) -> None:
        """Destroy the subscription."""
        ...

    def pause(self, subscription_id: str) -> None:
        """PauseSubscription."""
        ...

    def resume(self, subscription_id: str) -> None:
        """ResumeSubscription."""
        ...

    # -- operators (the admin page and API) -----------------------------------------------
    def overview(self, limit: int | None = None) -> Overview:
        """Every live resource with its state, the topics and the health; with a
        ``limit``, the full state of only that many subscriptions, those that need
        attention most (the totals count all)."""
        ...

    def subscription_statuses(
        self, ids: Sequence[str] | None = None, *, depths: bool = True
    ) -> list[SubscriptionStatus]:
        """Every live subscription with its backlog and delivery state, oldest first, or
        the live ones of ``ids`` in that order; ``depths=False`` does not ask the
        middleware (``waiting`` None: unknown)."""
        ...

    def subscription_rows(
        self, *, depths: bool = False, delivery: bool = True
    ) -> list[SubscriptionRow]:
        """Every live subscription as the few fields searching and sorting look at, in
        no order, cheap for tens of thousands; backlogs only with ``depths``, delivery
        states only with ``delivery``."""
        ...

    def rate_history(self) -> list[RatePoint]:
        """The last hour of traffic, oldest first (the admin page's charts)."""
        ...

    def cluster_status(self) -> ClusterStatus:
        """This instance and every instance sharing its store (``wsnmom cluster status``)."""
        ...

    def subscription_status(self, subscription_id: str) -> SubscriptionStatus:
        """One subscription with its backlog and delivery state."""
        ...

    def purge_subscription(self, subscription_id: str) -> int | None:
        """Drop every message waiting for the subscription; how many (None: unknown)."""
        ...

    def peek_subscription(self, subscription_id: str, count: int) -> PeekResult:
        """The first ``count`` messages of the subscription's backlog, not consumed
        (``core.peek``)."""
        ...

    def peek_pull_point(self, pull_point_id: str, count: int) -> PeekResult:
        """The first ``count`` messages waiting in the pull point, not consumed."""
        ...

    def dead_letters(self, destination: str | None = None) -> list[DeadLetter]:
        """The dead letters held (``core.dead_letters``), oldest first per destination."""
        ...

    def dead_letter(self, letter_id: str) -> DeadLetter:
        """One dead letter; ``ResourceUnknown`` when not held."""
        ...

    def replay_dead_letter(self, letter_id: str, consumer: str | None = None) -> str:
        """Re-deliver a dead letter to its subscription or to ``consumer``; where it went."""
        ...

    def purge_dead_letters(
        self, letter_ids: Sequence[str] | None = None, destination: str | None = None
    ) -> int:
        """Remove dead letters (every one held, or those named); how many."""
        ...

    def purge_pull_point(self, pull_point_id: str) -> int | None:
        """Drop every message waiting in the pull point; how many (None: unknown)."""
        ...

    # -- NotificationConsumer / current message -------------------------------------------
    def notify(self, messages: Sequence[InboundNotification]) -> None:
        """Publish; returns once the middleware has every message."""
        ...

    def get_current_message(self, topic: ExpressionSource) -> NotificationMessage:
        """The last notification on exactly one topic."""
        ...

    # -- pull points -----------------------------------------------------------------------
    def create_pull_point(self, req: CreatePullPointRequest) -> PullPoint:
        """CreatePullPoint."""
        ...

    def get_pull_point(self, pull_point_id: str) -> PullPoint:
        """The pull point; ResourceUnknown when unknown or expired."""
        ...

    def get_messages(self, pull_point_id: str, maximum: int | None) -> list[NotificationMessage]:
        """Destructive FIFO read; None/0 = all available up to the cap."""
        ...

    def hand_out_messages(
        self, pull_point_id: str, maximum: int | None
    ) -> tuple[list[NotificationMessage], Settlement]:
        """``get_messages`` unsettled: the caller settles the messages once its answer was
        written, or gives them back (``core.pull_handout``)."""
        ...

    def notify_pull_point(
        self, pull_point_id: str, messages: Sequence[InboundNotification]
    ) -> None:
        """Notify sent to a pull point."""
        ...

    def renew_pull_point(self, pull_point_id: str, termination: RequestedTime) -> PullPoint:
        """A new termination time for the pull point (ONVIF's Renew)."""
        ...

    def synchronize(self, subscription_id: str) -> int:
        """ONVIF's SetSynchronizationPoint: the current message of each topic the
        subscription selects into the pull point it feeds again; how many."""
        ...

    def destroy_pull_point(self, pull_point_id: str) -> None:
        """DestroyPullPoint."""
        ...

    # -- publisher registrations -----------------------------------------------------------
    def register_publisher(self, req: RegisterPublisherRequest) -> PublisherRegistration:
        """RegisterPublisher."""
        ...

    def get_registration(self, registration_id: str) -> PublisherRegistration:
        """The registration; ResourceUnknown when unknown or expired."""
        ...

    def renew_registration(
        self, registration_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> PublisherRegistration:
        """A new termination time for the registration (WS-N 1.0's SetTerminationTime)."""
        ...

    def destroy_registration(self, registration_id: str) -> None:
        """DestroyRegistration."""
        ...


class DeliveryFailed(Exception):
    """The peer could not be reached or did not answer 2xx.

    ``permanent`` is True when retrying cannot help (e.g. the consumer answered a SOAP
    fault saying the message is not understood); the retry policy still decides.
    ``answered`` is True when the peer did answer (an error status or fault);
    ``timed_out`` when it gave no answer within the timeout (the attempt held its thread
    all that time).  The destination's circuit breaker counts timeouts (``core.lanes``).
    ``status`` is the HTTP status of the answer (None: no HTTP answer), ``retry_after`` the
    seconds its ``Retry-After`` asked to wait (429 and 503 only; None: none or unreadable);
    a subscription's delivery policy decides what they mean (``core.delivery_policy``).
    """

    def __init__(
        self,
        reason: str,
        *,
        permanent: bool = False,
        answered: bool = False,
        timed_out: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent
        self.answered = answered
        self.timed_out = timed_out
        self.status = status
        self.retry_after = retry_after


class OutboundSoap(Protocol):
    """Outbound SOAP calls core makes; each raises DeliveryFailed on failure."""

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
        """Send ``messages`` to ``consumer``: one wrapped Notify holding all of them, or,
        with ``use_raw``, one raw payload per message (in order); in the WS-N wire format
        ``wire_version`` (the subscriber's)."""

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

    def unsubscribe(self, subscription: EndpointReference, *, timeout: float) -> None:
        """Unsubscribe a subscription made with ``subscribe``."""

    def pause(self, subscription: EndpointReference, *, timeout: float) -> None:
        """PauseSubscription on a subscription made with ``subscribe``."""

    def resume(self, subscription: EndpointReference, *, timeout: float) -> None:
        """ResumeSubscription on a subscription made with ``subscribe``."""
