"""Two gateway instances behind a plain load balancer (HAProxy from Debian, round-robin,
health-checked with ``/readyz``), the way issue 23 runs them: the cluster's ``public_url`` is
the balancer's address, clients know nothing else, and the operations work through it,
whichever instance each request lands on (Pause and Resume back to back included).
When one instance is killed, the balancer stops sending to it and everything goes on
through the other, with nothing lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
import requests

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_failover import numbers
from tests.fixtures.haproxy import HaproxyNode, require_haproxy
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client import WsnClient
from wsnmom.client.resources import PullPoint

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e, pytest.mark.slow]

TOPIC = "{urn:cluster}balanced"


@pytest.fixture
def balanced(cluster: Callable[..., Cluster]) -> Iterator[tuple[Cluster, HaproxyNode]]:
    """Two instances, and HAProxy listening on their public URL."""
    require_haproxy()
    c = cluster(2)
    port = urlsplit(c.public_url).port
    assert port is not None
    node = HaproxyNode([g.port for g in c.gateways], port=port)
    node.start()
    try:
        yield c, node
    finally:
        node.cleanup()


def answered_by(url: str, count: int) -> list[str]:
    """Which instance answered each of ``count`` requests to ``url``."""
    return [requests.get(url, timeout=5).headers[INSTANCE] for _ in range(count)]


def test_every_operation_through_the_balancer_and_an_instance_lost_behind_it(
    balanced: tuple[Cluster, HaproxyNode], consumer: ConsumerServer
) -> None:
    c, lb = balanced
    broker = c.public_url + "/wsn/broker"
    # round-robin: both instances answer; the 64 shards spread over both first (the second
    # instance's start moves half of them)
    wait_until(
        lambda: set(answered_by(c.public_url + "/readyz", 4)) == {"g0", "g1"},
        15,
        what="the balancer to send to both instances",
    )
    wait_until(
        lambda: (
            sorted(
                len(i["shards"])
                for i in requests.get(c.public_url + "/wsn/admin/api/cluster", timeout=5).json()[
                    "instances"
                ]
            )
            == [32, 32]
        ),
        20,
        what="the shards spread over both instances",
    )
    with WsnClient(broker) as client:
        sub = client.subscribe(consumer.address(), TOPIC)
        assert sub.address.startswith(c.public_url)  # references name the balancer only
        pp = client.create_pull_point()
        feeder = client.subscribe(pp.address, TOPIC)
        for i in range(6):  # Notifies land on both instances
            client.notify(f"<n>{i}</n>", TOPIC)
        wait_until(lambda: numbers(consumer) >= set(range(6)), 20, what="6 deliveries")
        got: list[int] = []
        wait_until(drained(pp, got, 6), 20, what="the pull point's 6 messages, via the balancer")
        sub.renew(timedelta(minutes=30))
        # Pause and Resume, back to back: round-robin sends them to both instances a few
        # milliseconds apart, and the Resume wins (tests/cluster/test_pause_resume_race.py
        # repeats it)
        for i in range(6, 12):
            sub.pause()
            sub.resume()
            client.notify(f"<n>{i}</n>", TOPIC)
        wait_until(lambda: numbers(consumer) >= set(range(12)), 20, what="6 more deliveries")
        wait_until(drained(pp, got, 12), 20, what="the pull point's 12 messages")
        # a Pause through the balancer holds the messages on whichever instance delivers
        sub.pause()
        wait_until(
            lambda: paused_everywhere(c, sub.id), 5, what="both instances pausing the subscription"
        )
        client.notify("<n>12</n>", TOPIC)
        wait_until(drained(pp, got, 13), 20, what="the pull point's copy of 12 (the sentinel)")
        assert 12 not in numbers(consumer)
        sub.resume()
        wait_until(lambda: 12 in numbers(consumer), 20, what="message 12 after the resume")
        # one instance dies; the balancer's health check takes it out
        victim = c.gateways[0]
        assert victim.process is not None
        victim.process.kill()
        victim.process.wait(10)
        wait_until(
            lambda: set(answered_by(c.public_url + "/healthz", 6)) == {"g1"},
            15,
            what="the balancer to send only to the surviving instance",
        )
        # everything made through the balancer still works through it
        for i in range(13, 19):
            client.notify(f"<n>{i}</n>", TOPIC)
        wait_until(
            lambda: numbers(consumer) >= set(range(19)),
            30,
            what="the deliveries after the loss of an instance",
        )
        wait_until(drained(pp, got, 19), 30, what="the pull point's messages after the loss")
        feeder.unsubscribe()
        pp.destroy()
        sub.unsubscribe()
        assert lb.running


def paused_everywhere(c: Cluster, sub_id: str) -> bool:
    """Every instance holds the subscription paused, at one store revision."""
    seen = [
        requests.get(f"{g.base_url}/wsn/admin/api/subscriptions/{sub_id}", timeout=5).json()
        for g in c.gateways
    ]
    return {d["state"] for d in seen} == {"paused"} and len({d["revision"] for d in seen}) == 1


def drained(pull_point: PullPoint, got: list[int], total: int) -> Callable[[], bool]:
    """A condition: one GetMessages from ``pull_point`` added to ``got``, which then holds
    every number ``0 .. total - 1`` (at least once: a forward in flight while a shard moves
    may come twice, docs/scale-out.md)."""

    def step() -> bool:
        got.extend(int(m.payload_xml[3:-4]) for m in pull_point.get_messages(10))
        return set(got) == set(range(total))

    return step
