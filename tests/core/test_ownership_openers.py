"""core.ownership's opener threads: a held shard's subscription left without a delivery
is opened by the next reconcile, and only while this instance delivers it (issue 23 §3;
docs/scale-out.md, "Failover at scale")."""

from __future__ import annotations

from wsnmom.core.ownership import Ownership
from wsnmom.core.service import BrokerService

from .conftest import RecordingOutbound, note, simple, sub_req

LEFT = "http://127.0.0.1:9/left"


def test_a_held_subscription_without_a_delivery_is_opened_by_the_reconcile(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(LEFT, topic=simple("t:a"))).id
    # looked at while the lease looked lapsed: registered, no delivery
    service.engine.close_channel(sub_id)
    service.notify([note("<m>held</m>", simple("t:a"))])
    shards = set(range(service.settings.cluster.shards))
    ownership.reconcile(shards)
    assert ownership.settled()
    assert service.engine.channel(sub_id) is not None
    outbound.wait_messages(LEFT, 1)  # what waited is delivered


def test_nothing_is_opened_for_a_shard_this_instance_does_not_deliver(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(LEFT, topic=simple("t:a"))).id
    service.engine.close_channel(sub_id)
    service._ctx.delivers = lambda _id: False  # its shard went meanwhile
    ownership.reconcile(set(range(service.settings.cluster.shards)))
    ownership.gained(set(range(service.settings.cluster.shards)))
    assert ownership.settled()
    assert service.engine.channel(sub_id) is None
