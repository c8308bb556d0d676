"""Issue 16, finding 2: a subscription to the gateway itself looped for ever (one
subscription whose consumer was the gateway's own ``/wsn/broker`` plus one Notify: 7,786
notifications in 10 s; two subscriptions: 32,982 in 8 s and 263 MB of disk).

Now the gateway's own endpoints are refused as consumers, and between two gateways the
hop marker (``wsnmom:Hops``) stops a loop after one round: two real gateways on loopback
subscribed to each other deliver each notification once to each side.

Cost: three gateways, about 8 s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import requests

from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.soap import notify_body, subscribe_body
from tests.support.waiting import wait_until

from .conftest import post, soap_fault_of, start_server, stop_server

pytestmark = pytest.mark.e2e

WSNMOM = "urn:wsnmom:ns:1"


@pytest.fixture(scope="module")
def single() -> Iterator[RunningServer]:
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    "own",
    [
        "{base}/wsn/broker",
        "http://localhost:{port}/wsn/broker",
        "{base}/wsn/subscriptions/made-up",
        "{base}//wsn/./broker",
    ],
)
def test_subscription_to_the_gateway_itself_is_refused(single: RunningServer, own: str) -> None:
    gateway = single
    address = own.format(base=gateway.base_url, port=gateway.port)
    answer = post(gateway.broker_url, subscribe_body(address, "tns:t"))
    fault = soap_fault_of(answer.status_code, answer.headers["Content-Type"], answer.content)
    assert fault.detail == "SubscribeCreationFailedFault", answer.content
    assert "own endpoint" in fault.reason and "loop" in fault.reason
    # nothing loops: a Notify is accepted and the gateway stays quiet
    assert post(gateway.broker_url, notify_body(("tns:t", "<m/>"))).status_code == 202
    metrics = requests.get(f"{gateway.base_url}/metrics", timeout=5).text
    assert "wsnmom_subscriptions 0.0" in metrics


def watcher_messages(consumer: ConsumerServer) -> list[str]:
    return [m.findtext("{*}Message/m") or "" for m in consumer.messages()]


def test_two_gateways_subscribed_to_each_other_deliver_once(
    gateway_factory: Callable[..., RunningServer],
    consumer_factory: Callable[[], ConsumerServer],
) -> None:
    a = gateway_factory({"WSNMOM_LOOPS__GATEWAY_ID": "gw-a"})
    b = gateway_factory({"WSNMOM_LOOPS__GATEWAY_ID": "gw-b"})
    at_a, at_b = consumer_factory(), consumer_factory()
    for gateway, consumer in ((a, at_a), (b, at_b)):
        assert post(gateway.broker_url, subscribe_body(consumer.address(), "tns:t")).ok
    # the bridge, both ways
    assert post(a.broker_url, subscribe_body(b.broker_url, "tns:t")).ok
    assert post(b.broker_url, subscribe_body(a.broker_url, "tns:t")).ok

    assert post(a.broker_url, notify_body(("tns:t", "<m>from-a</m>"))).status_code == 202
    assert post(b.broker_url, notify_body(("tns:t", "<m>from-b</m>"))).status_code == 202
    wait_until(lambda: len(at_a.messages()) >= 2 and len(at_b.messages()) >= 2, timeout=10)
    # the barrier: a sentinel from each side.  Each bridge delivers in order, and what a
    # gateway received came into its bridge's queue when it reached its own consumer: a
    # copy coming back around the loop (from-a through b to a, from-b through a to b)
    # would reach the consumers before the sentinel sent after it on that bridge
    assert post(a.broker_url, notify_body(("tns:t", "<m>sentinel-a</m>"))).status_code == 202
    assert post(b.broker_url, notify_body(("tns:t", "<m>sentinel-b</m>"))).status_code == 202
    sentinels = {"sentinel-a", "sentinel-b"}
    wait_until(
        lambda: all(sentinels <= set(watcher_messages(c)) for c in (at_a, at_b)),
        timeout=10,
        what="both sentinels at both consumers",
    )
    everything = ["from-a", "from-b", "sentinel-a", "sentinel-b"]
    assert sorted(watcher_messages(at_a)) == everything
    assert sorted(watcher_messages(at_b)) == everything
    # each consumer saw the path of what it got in the hop marker
    # (one wsnmom:Via per NotificationMessage of each Notify, in order)
    paths = {}
    for rec in at_b.notifies():
        (hops,) = rec.header(f"{{{WSNMOM}}}Hops")
        texts = [m.findtext("{*}Message/m") for m in rec.body_child]
        assert len(texts) == len(hops)
        paths.update(zip(texts, [via.text for via in hops], strict=True))
    assert paths == {
        "from-a": "gw-a gw-b",
        "from-b": "gw-b",
        "sentinel-a": "gw-a gw-b",
        "sentinel-b": "gw-b",
    }
    # each gateway dropped the copy of its notification and of its sentinel that came
    # back (the sentinel's may still be on its way back)
    for gateway in (a, b):
        wait_until(
            lambda g=gateway: (
                'wsnmom_notifications_rejected_total{reason="loop"} 2.0'
                in requests.get(f"{g.base_url}/metrics", timeout=5).text
            ),
            timeout=10,
            what=f"two loops dropped by {gateway.base_url}",
        )
        assert "dropped notifications that came back" in gateway.log_path.read_text()
