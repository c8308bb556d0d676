"""F2 (docs/performance.md): per-subscription objects are small (``__slots__``, a lazily
created delivery queue, no per-subscription closures for pull-point forwarding) and
behave as before."""

from __future__ import annotations

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedHandle
from wsnmom.core.delivery import Channel
from wsnmom.core.model import CreatePullPointRequest, EndpointReference, SubscribeRequest
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.service import BrokerService

from .conftest import note, simple, wait_idle


def _pull_point_subscription(service: BrokerService) -> tuple[str, str]:
    pp = service.create_pull_point(CreatePullPointRequest())
    consumer = EndpointReference(service.pull_point_address(pp.id))
    sub = service.subscribe(SubscribeRequest(consumer, topic=simple("t:f")))
    # a pause gives it a durable subscription and a forwarding channel of its own (the
    # embedded middleware otherwise routes it into the pull point when published)
    service.pause(sub.id)
    service.resume(sub.id)
    return pp.id, sub.id


def test_per_subscription_objects_have_no_dict(service: BrokerService) -> None:
    _, sub_id = _pull_point_subscription(service)
    channel = service.engine.channel(sub_id)
    assert isinstance(channel, Channel)
    assert not hasattr(channel, "__dict__")
    handle = channel.handle
    assert isinstance(handle, EmbeddedHandle)
    assert not hasattr(handle, "__dict__")


def test_channel_queue_created_on_demand_and_released(service: BrokerService) -> None:
    pp_id, sub_id = _pull_point_subscription(service)
    channel = service.engine.channel(sub_id)
    assert channel is not None
    assert channel._queue is None  # an idle subscription holds no queue block
    assert channel.held() == 0
    service.notify([note(f"<x>{i}</x>", simple("t:f")) for i in range(5)])
    wait_idle(service)
    got: list[bytes] = []
    for _ in range(50):
        got += [m.payload for m in service.get_messages(pp_id, 10)]
        if len(got) >= 5:
            break
        wait_idle(service)
    assert got == [f"<x>{i}</x>".encode() for i in range(5)]
    assert channel._queue is None  # drained: released again
    assert channel.held() == 0


def test_forwarding_into_a_gone_pull_point_fails_permanently(service: BrokerService) -> None:
    """The forwarder (a bound method now, not a closure) still notices a destroyed pull
    point and reports a permanent failure."""
    pp_id, sub_id = _pull_point_subscription(service)
    channel = service.engine.channel(sub_id)
    assert channel is not None
    with service.registry.lock:
        service.registry.pull_points.pop(pp_id)
    with pytest.raises(DeliveryFailed) as info:
        channel.send([])
    assert info.value.permanent is True
