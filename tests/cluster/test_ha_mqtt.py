"""The HA suite on Mosquitto (issue 23, "Tests"; the run is described in
``tests/cluster/ha.py``): three instances, 60 streams, a consumer failing 10 %, kill -9,
restart, SIGSTOP past the takeover then SIGCONT, and SIGTERM in one run.  In cluster mode every
push subscription is its own persistent MQTT session on the broker, fenced by the
client-id take-over (a new owner's CONNECT cuts the old one off; docs/scale-out.md "MQTT
in cluster mode"): the broker resends the old owner's unacknowledged messages first, in
order, so each subscription's order holds across the kill, the restart (shards handed
back), the SIGSTOP and the SIGTERM, and a failover duplicates at most a subscription's
in-flight window (its Receive Maximum, ``delivery.prefetch``).  Checked on the broker
after the run: every live subscription's session is there, the one unsubscribed through
another instance during the failover is not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from wsnmom.adapters.mqtt.cluster_handle import session_client_id

from tests.cluster import ha
from tests.cluster.conftest import Cluster
from tests.fixtures.mosquitto import session_present

pytestmark = [pytest.mark.mqtt, pytest.mark.e2e, pytest.mark.timeout(400)]

#: the gateways' ``delivery.prefetch`` (the default): a subscription session's Receive
#: Maximum, what the broker resends to a new owner while the consumer keeps up
#: (Mosquitto 2.0.11 exceeds the Receive Maximum once PUBACKs flow, so a backlog larger
#: than this would come again whole: docs/scale-out.md, "MQTT in cluster mode")
WINDOW = 64


@pytest.mark.parametrize("middleware", ["mqtt"], indirect=True)
def test_ha_suite(cluster: Callable[..., Cluster], middleware: str) -> None:
    made: list[Cluster] = []

    def factory(n: int, **env: Any) -> Cluster:
        made.append(cluster(n, **env))
        return made[-1]

    outcome = ha.run(factory, middleware)
    ha.check(
        outcome,
        keeps_order=("none", "kill -9", "restart", "sigstop", "sigterm"),
        window=WINDOW,
    )
    # on the broker, once no instance holds a session any more (a probe of a session in
    # use would cut its deliverer off)
    (c,) = made
    c.stop()
    url = c.gateways[0].adapter_url
    (prefix,) = parse_qs(urlsplit(url).query)["topic_prefix"]
    present = {
        path: session_present(url, session_client_id(prefix, sub_id))
        for path, sub_id in outcome.ids.items()
    }
    assert present.pop(outcome.unsubscribed) is False
    assert all(present.values()), sorted(p for p, there in present.items() if not there)
