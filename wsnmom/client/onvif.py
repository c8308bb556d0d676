"""A client of an ONVIF device's event service (``http://www.onvif.org/ver10/events/wsdl``):
CreatePullPointSubscription, PullMessages, and WS-N's Renew and Unsubscribe on the
pull-point subscription.

::

    from datetime import timedelta
    from wsnmom.client import FULL, TopicExpression, WsnClient
    from wsnmom.client.onvif import OnvifEvents

    url = "http://192.0.2.10/onvif/event_service"
    tns1 = {"tns1": "http://www.onvif.org/ver10/topics"}
    with WsnClient(url, user="admin", password="pw", wsse="digest") as c:
        motion = TopicExpression.parse("tns1:RuleEngine//.", tns1, FULL)
        sub = OnvifEvents(c).create_pull_point_subscription(
            motion, initial_termination_time=timedelta(minutes=1)
        )
        for n in sub.pull_messages(timeout=timedelta(seconds=5), limit=10):
            print(n.topic, n.payload_xml)
        sub.unsubscribe()

The :class:`~wsnmom.client.broker.WsnClient` given carries the device's address, the
prefixes of topic texts and the credentials (ONVIF devices require a WS-Security
UsernameToken with PasswordDigest: ``wsse="digest"``).  ONVIF takes WS-N's Renew and
Unsubscribe at the subscription, so :class:`OnvifPullSubscription` is a
:class:`~wsnmom.client.resources.Subscription` that can also pull.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import isodate

from wsnmom.soap_frontend.codec import T, add
from wsnmom.soap_frontend.xml import TEV, qname, text_of
from wsnmom.topic_mapping.dialects import XPATH

from . import wire
from .broker import WsnClient
from .errors import SoapFault, TransportError
from .model import Notification, TerminationTime, TopicExpression
from .resources import Subscription

__all__ = [
    "CREATE_ACTION",
    "PULL_ACTION",
    "OnvifEvents",
    "OnvifPullSubscription",
    "max_message_limit",
]

#: the request actions of ONVIF's event WSDL
CREATE_ACTION: Final = f"{TEV}/EventPortType/CreatePullPointSubscriptionRequest"
PULL_ACTION: Final = f"{TEV}/PullPointSubscription/PullMessagesRequest"


def V(local: str) -> str:
    """QName in the ONVIF event service's namespace."""
    return qname(TEV, local)


@dataclass(eq=False)
class OnvifPullSubscription(Subscription):
    """A pull-point subscription of an ONVIF event service: PullMessages, and the
    subscription's Renew and Unsubscribe."""

    def pull_messages(self, timeout: timedelta, limit: int) -> list[Notification]:
        """PullMessages: up to ``limit`` notifications, waiting up to ``timeout`` for the
        first one (an empty list when none came).  The answer's TerminationTime is kept."""
        body = wire.new(V("PullMessages"))
        add(body, V("Timeout"), isodate.duration_isoformat(timeout))
        add(body, V("MessageLimit"), str(limit))
        answer = self.client.transport.call(self.reference, body, PULL_ACTION)
        if answer is None or answer.tag != V("PullMessagesResponse"):
            raise TransportError("PullMessages was not answered with a PullMessagesResponse")
        termination = wire.child_time(answer, V("TerminationTime"))
        if termination is not None:
            self.termination_time = termination
        self.current_time = wire.child_time(answer, V("CurrentTime")) or self.current_time
        received = wire.notifications(answer)
        wire.apply_message_info(received, wire.soap_headers(answer))
        return received


class OnvifEvents:
    """The event service of one ONVIF device (its address is the client's broker URL)."""

    def __init__(self, client: WsnClient) -> None:
        self.client = client

    def create_pull_point_subscription(
        self,
        topic: TopicExpression | str | None = None,
        *,
        namespaces: Mapping[str, str] | None = None,
        message_content: str | None = None,
        message_content_namespaces: Mapping[str, str] | None = None,
        initial_termination_time: TerminationTime | None = None,
    ) -> OnvifPullSubscription:
        """CreatePullPointSubscription with a ``tev:Filter`` of ``topic`` (text in the
        client's prefixes and ``namespaces``, or a TopicExpression with its dialect, such
        as ONVIF's ConcreteSet) and ``message_content`` (XPath 1.0)."""
        body = wire.new(V("CreatePullPointSubscription"))
        wire.filter_element(
            body,
            V("Filter"),
            topic,
            {**self.client.namespaces, **(namespaces or {})},
            message_content=message_content,
            message_content_dialect=XPATH,
            message_content_namespaces=message_content_namespaces,
        )
        if initial_termination_time is not None:
            wire.requested_time(body, V("InitialTerminationTime"), initial_termination_time)
        answer = self.client.transport.call(self.client.broker_url, body, CREATE_ACTION)
        reference = wire.child_epr(answer, V("SubscriptionReference"))
        if reference is None:
            raise TransportError(
                "CreatePullPointSubscription was not answered with a SubscriptionReference"
            )
        return OnvifPullSubscription(
            self.client,
            reference,
            current_time=wire.child_time(answer, T("CurrentTime")),
            termination_time=wire.child_time(answer, T("TerminationTime")),
        )


def max_message_limit(fault: SoapFault) -> int | None:
    """The ``MaxMessageLimit`` of a ``tev:PullMessagesFaultResponse`` (PullMessages asked
    for more messages than the device gives at once); None for any other fault."""
    detail = fault.detail
    if detail is None:
        return None
    holder = detail.getparent()
    for el in (holder if holder is not None else detail).iter(V("MaxMessageLimit")):
        try:
            return int(text_of(el))
        except ValueError:
            return None
    return None
