"""Ports core needs from the outside world, implemented elsewhere and injected.

``OutboundSoap`` is how core talks SOAP to other parties without knowing SOAP: pushing
notifications to consumers, and, for demand-based publishing, subscribing to and pausing,
resuming or unsubscribing from a registered publisher's NotificationProducer.  The SOAP
frontend implements it (``wsnmom.soap_frontend.client``); tests may inject their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from wsnmom.core.model import Delivered, EndpointReference, ExpressionSource, SoapVersion


class DeliveryFailed(Exception):
    """The peer could not be reached or did not answer 2xx.

    ``permanent`` is True when retrying cannot help (e.g. the consumer answered a SOAP
    fault saying the message is not understood); the retry policy still decides.
    """

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


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
    ) -> None:
        """Send ``messages`` to ``consumer``: one wrapped Notify holding all of them, or,
        with ``use_raw``, one raw payload per message (in order)."""

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
