"""F2 (docs/performance.md): per-subscription objects are small (``__slots__``, a lazily
created delivery queue, no delivery channel for a subscription that feeds a pull point)
and behave as before."""

from __future__ import annotations

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedHandle
from wsnmom.core.delivery import Channel
from wsnmom.core.model import CreatePullPointRequest, EndpointReference, SubscribeRequest
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.pull_buffer import Fed
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.service import BrokerService

from .conftest import RecordingOutbound, note, simple, sub_req, wait_idle

A = "http://127.0.0.1:9/a"


def _pull_point_subscription(service: BrokerService) -> tuple[str, str]:
    pp = service.create_pull_point(CreatePullPointRequest())
    consumer = EndpointReference(service.pull_point_address(pp.id))
    sub = service.subscribe(SubscribeRequest(consumer, topic=simple("t:f")))
    # a pause gives it a durable subscription of its own, read by the pull point (the
    # embedded middleware otherwise routes it into the pull point when published)
    service.pause(sub.id)
    service.resume(sub.id)
    return pp.id, sub.id


def test_per_subscription_objects_have_no_dict(service: BrokerService) -> None:
    sub = service.subscribe(sub_req(A, topic=simple("t:f")))
    channel = service.engine.channel(sub.id)
    assert isinstance(channel, Channel)
    assert not hasattr(channel, "__dict__")
    handle = channel.handle
    assert isinstance(handle, EmbeddedHandle)
    assert not hasattr(handle, "__dict__")


def test_a_feeding_subscription_has_no_channel_and_a_small_feed(service: BrokerService) -> None:
    pp_id, sub_id = _pull_point_subscription(service)
    assert service.engine.channel(sub_id) is None
    state = service.registry.subscriptions[sub_id]
    reader = service.registry.pull_points[pp_id].reader
    assert isinstance(reader, PullReader) and state.feed is reader
    assert not hasattr(reader, "__dict__")
    service.notify([note(f"<x>{i}</x>", simple("t:f")) for i in range(3)])
    got = []
    for _ in range(50):
        got += reader.take(10)
        if len(got) >= 3:
            break
        wait_idle(service)
    assert [r.body for r in got] == [f"<x>{i}</x>".encode() for i in range(3)]
    assert all(isinstance(r, Fed) for r in got)  # rendered for the subscription
    assert not hasattr(got[0].feed, "__dict__")


def test_channel_queue_created_on_demand_and_released(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub = service.subscribe(sub_req(A, topic=simple("t:f")))
    channel = service.engine.channel(sub.id)
    assert channel is not None
    assert channel._queue is None  # an idle subscription holds no queue block
    assert channel.held() == 0
    service.notify([note(f"<x>{i}</x>", simple("t:f")) for i in range(5)])
    got = outbound.wait_messages(A, 5)
    assert [d.message.payload for d in got] == [f"<x>{i}</x>".encode() for i in range(5)]
    wait_idle(service)
    assert channel._queue is None  # drained: released again
    assert channel.held() == 0


def test_keeping_messages_in_a_gone_pull_point_fails_permanently(service: BrokerService) -> None:
    """What a pausing feed keeps is published into its pull point's inbox; a destroyed
    pull point is noticed and reported as a permanent failure."""
    pp_id, sub_id = _pull_point_subscription(service)
    state = service.registry.subscriptions[sub_id]
    with service.registry.lock:
        service.registry.pull_points.pop(pp_id)
    with pytest.raises(DeliveryFailed) as info:
        service.delivery.forward(state, pp_id, [])
    assert info.value.permanent is True
