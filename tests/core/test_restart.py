"""Persistence across restarts (NCIA §2.3.1/§2.3.3): subscriptions, pull points,
registrations and undelivered notifications survive; what expired while down is removed."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    RegisterPublisherRequest,
    SubscriptionState,
)

from .conftest import Broker, FakeClock, RecordingOutbound, note, simple, sub_req, wait_idle

C = "http://127.0.0.1:9/consumer"


def texts(payloads: list[bytes]) -> list[str]:
    return [etree.fromstring(p).text or "" for p in payloads]


def test_everything_survives_a_restart(make_broker: Any, outbound: RecordingOutbound) -> None:
    b: Broker = make_broker(retry__give_up="keep")
    s = b.service
    assert s is not None
    outbound.down.add(C)
    push = s.subscribe(sub_req(C, topic=simple("t:a")))
    paused = s.subscribe(sub_req("http://127.0.0.1:9/paused", topic=simple("t:a")))
    s.pause(paused.id)
    pp = s.create_pull_point(CreatePullPointRequest())
    feeding = s.subscribe(sub_req(s.pull_point_address(pp.id), topic=simple("t:a")))
    reg = s.register_publisher(
        RegisterPublisherRequest(EndpointReference("http://127.0.0.1:9/pub"), (simple("t:a"),))
    )
    s.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(3)])
    s.notify_pull_point(pp.id, [note("<m>direct</m>")])
    assert outbound.wait(lambda: len(outbound.attempts) >= 1)
    # the embedded middleware has no other publisher: the feeding subscription is routed
    # into the pull point when published, with no durable subscription of its own
    state = s.registry.subscriptions[feeding.id]
    assert state.direct and state.handle is None

    s = b.restart()
    assert s.get_subscription(push.id).consumer.address == C
    assert s.get_subscription(paused.id).state is SubscriptionState.PAUSED
    assert s.get_subscription(feeding.id).pull_point_id == pp.id
    assert s.get_registration(reg.id).topics[0].text == "t:a"
    # undelivered push notifications are delivered once the consumer is back
    outbound.down.discard(C)
    outbound.wait_messages(C, 3)
    assert texts(outbound.payloads_to(C)) == ["0", "1", "2"]
    # pull point content survived, in order (direct Notify first, then the forwarded ones)
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < 4 and time.monotonic() < deadline:
        got += [m.payload for m in s.get_messages(pp.id, None)]
        time.sleep(0.02)
    assert sorted(texts(got)) == ["0", "1", "2", "direct"]
    assert [t for t in texts(got) if t != "direct"] == ["0", "1", "2"]
    # the paused subscription accumulated meanwhile and delivers on resume
    s.resume(paused.id)
    outbound.wait_messages("http://127.0.0.1:9/paused", 3)
    assert texts(outbound.payloads_to("http://127.0.0.1:9/paused")) == ["0", "1", "2"]


def test_expired_while_down(make_broker: Any, clock: FakeClock) -> None:
    b: Broker = make_broker()
    s = b.service
    assert s is not None
    short = s.subscribe(sub_req(C, initial_termination_time=timedelta(seconds=5)))
    long = s.subscribe(sub_req(C, initial_termination_time=timedelta(hours=5)))
    pp = s.create_pull_point(CreatePullPointRequest(initial_termination_time=timedelta(seconds=5)))
    reg = s.register_publisher(
        RegisterPublisherRequest(None, initial_termination_time=clock() + timedelta(seconds=5))
    )
    b.stop()
    clock.advance(minutes=1)
    s = b.start()
    assert b.adapter is not None
    with pytest.raises(errors.ResourceUnknown):
        s.get_subscription(short.id)
    with pytest.raises(errors.ResourceUnknown):
        s.get_pull_point(pp.id)
    with pytest.raises(errors.ResourceUnknown):
        s.get_registration(reg.id)
    assert s.store.get_subscription(short.id) is None
    assert s.store.get_pull_point(pp.id) is None
    assert s.store.get_registration(reg.id) is None
    names = b.adapter.subscription_names()
    assert short.id not in names and pp.id not in names and long.id in names
    assert s.get_subscription(long.id).id == long.id


def test_idle_after_restart_without_resources(make_broker: Any) -> None:
    b: Broker = make_broker()
    s = b.restart()
    wait_idle(s)
    assert s.ready()
