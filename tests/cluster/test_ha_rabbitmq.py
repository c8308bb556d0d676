"""The HA suite on RabbitMQ (issue 23, "Tests"; the run is described in
``tests/cluster/ha.py``): three instances, 60 streams, a consumer failing 10 %, kill -9,
restart, SIGSTOP past the takeover then SIGCONT, and SIGTERM in one run.  In cluster mode every
push subscription's queue is a quorum queue with single-active-consumer (the broker's own
fence, docs/scale-out.md "What fences what"): checked on the broker after the run.  Each
subscription's order holds throughout: across the kill and the SIGSTOP (the broker gives a
dead consumer's messages back before it activates the next one) and across the graceful
hand-overs, the SIGTERM and the shards handed back to the restarted and to the rejoined
instance (a stopping consumer's channel is closed without cancelling it first, so the
broker does the same)."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest

from tests.cluster import ha
from tests.cluster.conftest import Cluster

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e, pytest.mark.timeout(400)]

#: the gateways' ``delivery.prefetch`` (the default): the most messages a subscription's
#: consumer holds unacknowledged, so the most an ownership change can deliver twice
PREFETCH = 64


@pytest.mark.parametrize("middleware", ["rabbitmq"], indirect=True)
def test_ha_suite(cluster: Callable[..., Cluster], middleware: str, rabbitmq_url: str) -> None:
    outcome = ha.run(cluster, middleware)
    # duplicates: at most what one subscription's consumer may hold unacknowledged, its
    # prefetch (the bound docs/scale-out.md documents on RabbitMQ), per event
    ha.check(
        outcome,
        keeps_order=("none", "kill -9", "restart", "sigstop", "sigterm"),
        window=PREFETCH,
    )
    # every subscription queue is a quorum queue with single-active-consumer: RabbitMQ
    # refuses basic.get on exactly those, saying so
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        for path, sub_id in outcome.ids.items():
            if path == outcome.unsubscribed:
                continue  # its queue is gone
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                conn.channel().basic_get("wsnmom.sub." + sub_id)
            assert refused.value.reply_code == 405
            assert "quorum queues with single active consumer" in refused.value.reply_text
    finally:
        conn.close()
