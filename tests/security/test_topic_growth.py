"""A notifier inventing topics cannot grow the broker's per-topic state without bound
(docs/security.md, "Topics"): past ``quotas.ad_hoc_topics`` new topics, a Notify, a
RegisterPublisher or a SubscriptionEnd topic naming a new one is refused with a
schema-valid TopicNotSupportedFault (HTTP 500) naming the bound, counted in /metrics and
logged at most once per interval; the topics admitted before, and the messages accepted on
them, are kept.  A Notify sent to a pull point admits no topic: the topic set is the
broker's, and the pull point (a NotificationConsumer) only holds what it is sent.  Gateways
driven over HTTP (embedded; the pull point's also on MQTT)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import requests

from tests.fixtures.server import RunningServer, mqtt_gateway_url
from tests.support.soap import body_child, epr_address, notify_body, subscribe_body
from tests.support.waiting import wait_until
from wsnmom.client import WsnClient
from wsnmom.client.errors import TopicNotSupportedFault

from .conftest import post, soap_fault_of

pytestmark = pytest.mark.e2e

NS = "urn:test:topics"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
LIMIT = 3


def _refused(answer: requests.Response, topic: str, operation: str, limit: int = LIMIT) -> None:
    """``answer`` is the bound's (``limit``) refusal of ``topic``: 500, a schema-valid
    TopicNotSupportedFault whose reason names the bound."""
    assert answer.status_code == 500, (operation, answer.status_code, answer.text)
    fault = soap_fault_of(answer.status_code, answer.headers["Content-Type"], answer.content)
    assert fault.detail == "TopicNotSupportedFault", (operation, fault)
    assert f"{{{NS}}}{topic}" in fault.reason, fault.reason
    assert f"maximum of {limit} topics beyond the declared ones" in fault.reason, fault.reason
    assert "(quotas.ad_hoc_topics)" in fault.reason, fault.reason


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found is not None, name
    return float(found.group(1))


def test_new_topics_beyond_the_bound_are_refused_and_the_admitted_ones_kept(
    gateway_factory: Callable[..., RunningServer],
) -> None:
    gateway = gateway_factory({"WSNMOM_QUOTAS__AD_HOC_TOPICS": str(LIMIT)})
    broker = gateway.broker_url
    client = WsnClient(broker)
    pull_point = client.create_pull_point()
    created = post(broker, subscribe_body(pull_point.address, None))
    assert created.status_code == 200, created.text
    assert epr_address(body_child(created.content)[0])

    for i in range(LIMIT):  # the bound's worth of new topics, each accepted
        accepted = post(broker, notify_body((f"tns:t{i}", f"<m>{i}</m>")))
        assert accepted.status_code == 202, accepted.text
    _refused(post(broker, notify_body(("tns:over", "<m>over</m>"))), "over", "Notify")
    # a Notify with a known topic and a new one is refused as a whole: nothing published
    mixed = notify_body(("tns:t0", "<m>lost-with-its-notify</m>"), ("tns:over2", "<m>x</m>"))
    _refused(post(broker, mixed), "over2", "Notify")
    registered = (
        '<wsn-br:RegisterPublisher><wsn-br:Topic xmlns:tns="urn:test:topics" '
        'Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple">tns:registered'
        "</wsn-br:Topic></wsn-br:RegisterPublisher>"
    )
    _refused(post(broker, registered), "registered", "RegisterPublisher")
    with pytest.raises(TopicNotSupportedFault, match=r"quotas\.ad_hoc_topics") as raised:
        client.subscribe(
            pull_point, "tns:t0", namespaces={"tns": NS}, subscription_end_topic="tns:ends"
        )
    assert raised.value.status == 500
    for _ in range(20):  # a flood of refusals: counted each, logged at most once per 10 s
        _refused(post(broker, notify_body(("tns:flood", "<m/>"))), "flood", "Notify")

    # the admitted topics are still served; the sentinel is the last message
    sentinel = post(broker, notify_body(("tns:t1", "<m>sentinel</m>")))
    assert sentinel.status_code == 202, sentinel.text
    got: list[str] = []

    def pulled() -> bool:
        got.extend("".join(n.payload.itertext()) for n in client.get_messages(pull_point))
        return "sentinel" in got

    wait_until(pulled, 30, what="the sentinel, pulled")
    assert got == ["0", "1", "2", "sentinel"], got

    (topic_set,) = client.get_resource_property(f"{{{WSTOP}}}TopicSet")
    listed = {el.tag for el in topic_set if el.get(f"{{{WSTOP}}}topic") == "true"}
    assert listed == {f"{{{NS}}}t{i}" for i in range(LIMIT)}, listed

    scraped = requests.get(f"{gateway.base_url}/metrics", timeout=10).text
    assert _metric(scraped, 'wsnmom_quota_refusals_total{quota="ad_hoc_topics"}') == 24
    assert _metric(scraped, "wsnmom_ad_hoc_topics") == LIMIT
    # (wsnmom.soap.invalid logs the faults at INFO, one line per fault every 10 s)
    warnings = [
        line
        for line in gateway.log_tail(200).splitlines()
        if " WARNING " in line and "quotas.ad_hoc_topics" in line
    ]
    assert 1 <= len(warnings) <= 3, warnings


def _topic_set(client: WsnClient) -> set[str]:
    """The topics GetResourceProperty TopicSet lists, in Clark notation."""
    (topic_set,) = client.get_resource_property(f"{{{WSTOP}}}TopicSet")
    return {el.tag for el in topic_set.iter() if el.get(f"{{{WSTOP}}}topic") == "true"}


@pytest.mark.parametrize("adapter", ["embedded", pytest.param("mqtt", marks=pytest.mark.mqtt)])
def test_a_notify_to_a_pull_point_admits_no_topic(
    gateway_factory: Callable[..., RunningServer],
    request: pytest.FixtureRequest,
    adapter: str,
) -> None:
    """Bound 1.  A Notify sent to a pull point on a new topic is accepted and its message
    handed out by the pull point, but the topic is not admitted to the broker's topic
    set: the TopicSet does not list it and the bound's one new topic is still free for a
    Notify to the broker.  With the bound full, a pull point's Notify on new topics is
    still accepted (the broker's own Notify on a new topic is refused).  Before, the pull
    point's Notify admitted its topics: any identity that could create a pull point could
    fill the broker's topic set and lock every publisher out of new topics."""
    env = {"WSNMOM_QUOTAS__AD_HOC_TOPICS": "1"}
    if adapter == "mqtt":
        env["WSNMOM_ADAPTER_URL"] = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
    gateway = gateway_factory(env)
    broker = gateway.broker_url
    client = WsnClient(broker)
    pull_point = client.create_pull_point()

    into = post(pull_point.address, notify_body(("tns:pp1", "<m>pp1</m>")))
    assert into.status_code == 202, into.text
    assert _topic_set(client) == set()
    accepted = post(broker, notify_body(("tns:t0", "<m>t0</m>")))  # the bound's one
    assert accepted.status_code == 202, accepted.text
    _refused(post(broker, notify_body(("tns:over", "<m>over</m>"))), "over", "Notify", 1)
    full = post(pull_point.address, notify_body(("tns:pp2", "<m>pp2</m>"), ("tns:pp3", "<m/>")))
    assert full.status_code == 202, full.text

    got = client.get_messages(pull_point)
    assert ["".join(n.payload.itertext()) for n in got] == ["pp1", "pp2", ""]
    assert [n.topic.text.rpartition(":")[2] for n in got if n.topic] == ["pp1", "pp2", "pp3"]
    assert _topic_set(client) == {f"{{{NS}}}t0"}
    scraped = requests.get(f"{gateway.base_url}/metrics", timeout=10).text
    assert _metric(scraped, "wsnmom_ad_hoc_topics") == 1
