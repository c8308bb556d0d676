"""Upstream subscriptions on a cluster (docs/federation.md): one upstream, added through any
instance, is held by exactly one instance (the leader; the other reports ``standby``);
a Notify the producer sends to the public address reaches whichever instance the load
balancer picks, and is accepted there; when the leader stops, the other instance takes
the upstream over."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster.conftest import Cluster
from tests.fixtures.server import ConsumerServer, PatientGateway, serving
from tests.support.waiting import wait_until
from wsnmom.client import ResourceUnknownFault, WsnClient
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e, pytest.mark.slow]

API = "/wsn/admin/api"
PLANT = "urn:example:plant"


def _state(gateway: Gateway) -> dict[str, Any]:
    resp = requests.get(gateway.base_url + API + "/upstreams", timeout=10)
    resp.raise_for_status()
    upstreams = {u["name"]: u for u in resp.json()["upstreams"]}
    return upstreams.get("plant", {})


def _remote_consumers(remote: Gateway) -> list[str]:
    listing = requests.get(remote.base_url + API + "/subscriptions", timeout=10).json()
    return [s["consumer"] for s in listing["subscriptions"]]


@pytest.fixture
def remote() -> Iterator[Gateway]:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-cluster-upstream-"))
    gateway = PatientGateway("embedded", f"embedded://{data_dir / 'middleware'}", data_dir)
    with serving(gateway):
        yield gateway


def test_one_instance_holds_the_upstream_and_any_instance_takes_its_notify(
    cluster: Callable[..., Cluster], remote: Gateway, consumer: ConsumerServer
) -> None:
    c = cluster(2)
    a, b = c.gateways
    upstream = {
        "name": "plant",
        "url": remote.broker_url,
        "topic": "tns:t",
        "namespaces": {"tns": PLANT},
        "check_interval": 1,
    }
    added = requests.post(b.base_url + API + "/upstreams", json=upstream, timeout=10)
    assert added.status_code == 200, added.text
    wait_until(
        lambda: sorted(_state(g).get("state", "") for g in (a, b)) == ["standby", "subscribed"],
        timeout=30,
        what="one instance subscribed, the other on standby",
    )
    (consumer_address,) = _remote_consumers(remote)  # exactly one subscription at the producer
    assert consumer_address.startswith(c.public_url + "/wsn/upstream/plant.")
    holder, other = (a, b) if _state(a)["state"] == "subscribed" else (b, a)

    # the producer's Notify, as the load balancer hands it to the instance that does not
    # hold the subscription, is published all the same
    with WsnClient(holder.broker_url, namespaces={"tns": PLANT}) as wsn:
        wsn.subscribe(consumer.address(), "tns:t")
    with WsnClient(other.broker_url, namespaces={"tns": PLANT}) as wsn:
        wsn.notify('<m xmlns="urn:m">via-other</m>', "tns:t", to=c.via(other, consumer_address))
    wait_until(lambda: len(consumer.messages()) == 1, timeout=30, what="the relayed Notify")
    assert _state(other)["relayed"] == 1
    # a key that is not the current one is refused there too
    with WsnClient(other.broker_url, namespaces={"tns": PLANT}) as wsn:
        stale = c.via(other, consumer_address.rsplit(".", 1)[0] + ".stale")
        with pytest.raises(ResourceUnknownFault):
            wsn.notify('<m xmlns="urn:m">stale</m>', "tns:t", to=stale)

    # the holder stops (and unsubscribes): the other instance takes the upstream over
    holder.stop()
    wait_until(lambda: _state(other).get("state") == "subscribed", timeout=60, what="takeover")
    (taken,) = _remote_consumers(remote)
    assert taken != consumer_address
