"""Two gateway processes on one PostgreSQL store and one middleware have one topic set: a
topic published (or registered) through one instance is in the TopicSet
resource property, ONVIF's GetEventProperties and SetSynchronizationPoint of the other
within the delay of following the store (docs/scale-out.md, "One topic set"), also when the
other already answered (and holds) its properties before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import requests
from lxml import etree

from tests.cluster.conftest import BOTH, Cluster
from tests.support.waiting import wait_until
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: the topic set is the same on every middleware: one of them is enough
RABBITMQ = BOTH[:1]
ONE_SHARD = {"WSNMOM_CLUSTER__SHARDS": "1"}
NS = "urn:cluster-topics"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
TEV = "http://www.onvif.org/ver10/events/wsdl"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSA = "http://www.w3.org/2005/08/addressing"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
#: how long a topic admitted through one instance may take to reach the other's topic
#: set: the follow delay (well under 1 s) and headroom for a loaded 2-core machine
REACH = 5.0


def topic(*path: str) -> str:
    return "{" + NS + "}" + "/".join(path)


def has(topic_set: etree._Element, *path: str) -> bool:
    """Whether a ``wstop:TopicSet`` element holds the topic ``path`` in :data:`NS`."""
    node: etree._Element | None = topic_set
    for name in path:
        node = None if node is None else node.find(f"{{{NS}}}{name}")
    return node is not None and node.get(f"{{{WSTOP}}}topic") == "true"


def topic_set_of(c: Cluster, gateway: Gateway) -> etree._Element:
    (found,) = c.client(gateway).get_resource_property(f"{{{WSTOP}}}TopicSet")
    return found


def onvif(gateway: Gateway, body: str, to: str = "") -> etree._Element:
    """A SOAP 1.2 request to ``gateway``'s ONVIF event service (or ``to``); the answer's
    body element."""
    envelope = (
        f'<s:Envelope xmlns:s="{SOAP12}" xmlns:tev="{TEV}" xmlns:wsnt="{WSNT}">'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )
    answer = requests.post(
        to or f"{gateway.base_url}/onvif/event_service",
        data=envelope.encode(),
        headers={"Content-Type": "application/soap+xml; charset=utf-8"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    found = etree.fromstring(answer.content).find(f"{{{SOAP12}}}Body")
    assert found is not None and len(found), answer.text
    return found[0]


@pytest.mark.parametrize("middleware", RABBITMQ, indirect=True)
def test_a_topic_notified_through_one_instance_is_in_the_other_s_topic_set(
    shared_cluster: Callable[..., Cluster],
) -> None:
    c = shared_cluster(2, **ONE_SHARD)
    a, b = c.gateways
    # A's answers are asked first, so A holds them (built once per topic-set version): the
    # topic B admits reaches A by take_in, which must make the next answers new ones
    assert not has(topic_set_of(c, a), "notified", "through-b")
    (onvif_set,) = onvif(a, "<tev:GetEventProperties/>").iterfind(f"{{{WSTOP}}}TopicSet")
    assert not has(onvif_set, "notified", "through-b")
    c.client(b).notify('<n xmlns="urn:n">only-b</n>', topic("notified", "through-b"))
    wait_until(
        lambda: has(topic_set_of(c, a), "notified", "through-b"),
        REACH,
        what="the topic notified through B in A's TopicSet",
    )
    # GetMultipleResourceProperties and ONVIF's GetEventProperties show the same set
    (through_many,) = c.client(a).get_multiple_resource_properties([f"{{{WSTOP}}}TopicSet"])
    assert has(through_many, "notified", "through-b")
    properties = onvif(a, "<tev:GetEventProperties/>")
    (onvif_set,) = properties.iterfind(f"{{{WSTOP}}}TopicSet")
    assert has(onvif_set, "notified", "through-b")
    # a topic a RegisterPublisher names through A reaches B's set the same way
    c.client(a).register_publisher(topics=[topic("registered", "through-a")])
    wait_until(
        lambda: has(topic_set_of(c, b), "registered", "through-a"),
        REACH,
        what="the topic registered through A in B's TopicSet",
    )


@pytest.mark.parametrize("middleware", RABBITMQ, indirect=True)
def test_set_synchronization_point_puts_in_a_topic_published_only_through_the_other(
    shared_cluster: Callable[..., Cluster],
) -> None:
    c = shared_cluster(2, **ONE_SHARD)
    a, b = c.gateways
    created = onvif(
        a,
        "<tev:CreatePullPointSubscription><tev:InitialTerminationTime>PT10M"
        "</tev:InitialTerminationTime></tev:CreatePullPointSubscription>",
    )
    reference = created.findtext(f"{{{TEV}}}SubscriptionReference/{{{WSA}}}Address")
    assert reference is not None
    via_a = c.via(a, reference)
    c.client(b).notify('<n xmlns="urn:n">current</n>', topic("synchronized", "only-b"))

    def pulled() -> list[str]:
        answer = onvif(
            a,
            "<tev:PullMessages><tev:Timeout>PT1S</tev:Timeout>"
            "<tev:MessageLimit>10</tev:MessageLimit></tev:PullMessages>",
            to=via_a,
        )
        return [
            "".join(m.itertext()).strip()
            for m in answer.iterfind(f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Message")
        ]

    wait_until(lambda: "current" in pulled(), 30, what="the notified message, pulled")
    wait_until(
        lambda: has(topic_set_of(c, a), "synchronized", "only-b"),
        REACH,
        what="the topic notified through B in A's TopicSet",
    )
    onvif(a, "<tev:SetSynchronizationPoint/>", to=via_a)
    # (with the current messages of the other topics this module's tests published)
    again: list[str] = []
    wait_until(
        lambda: again.extend(pulled()) or "current" in again,
        30,
        what="the current message of the topic published only through B, again",
    )
    assert again.count("current") == 1, again
