"""What operators see and do (``BrokerService.overview``, ``purge_*``): every resource with
its backlog and delivery state, topic counts and rates, health; purges on the real
embedded adapter and on a log-shaped one (filelog)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from wsnmom.core import errors
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    RegisterPublisherRequest,
)
from wsnmom.core.service import BrokerService
from wsnmom.core.topic_stats import WINDOW, TopicStats
from wsnmom.topic_mapping.model import Topic

from tests.core.conftest import (
    NS,
    Broker,
    RecordingOutbound,
    simple,
    sub_req,
    wait_idle,
)
from tests.core.conftest import note as make_note
from tests.support.waiting import wait_until

A = "http://127.0.0.1:9/a"
B = "http://127.0.0.1:9/b"


def failures(service: BrokerService, subscription_id: str) -> int:
    delivery = service.subscription_status(subscription_id).delivery
    return delivery.failures if delivery is not None else 0


def publish(service: BrokerService, n: int, topic: str = "t:a") -> None:
    service.notify([make_note(f"<m>{i}</m>", simple(topic)) for i in range(n)])


def test_overview_lists_everything_with_its_state(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    active = service.subscribe(sub_req(A, topic=simple("t:a")))
    paused = service.subscribe(sub_req(B, topic=simple("t:a")))
    service.pause(paused.id)
    pp = service.create_pull_point(CreatePullPointRequest(name="inbox"))
    fed = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:b")))
    reg = service.register_publisher(
        RegisterPublisherRequest(EndpointReference("http://127.0.0.1:9/pub"), (simple("t:a"),))
    )
    publish(service, 3)
    publish(service, 2, "t:b")
    outbound.wait_messages(A, 3)
    wait_until(lambda: service.subscription_status(paused.id).waiting == 3)

    view = service.overview()
    subs = {s.record.id: s for s in view.subscriptions}
    assert subs[active.id].mode == "push" and subs[active.id].delivery is not None
    assert subs[active.id].delivery.active and subs[active.id].delivery.delivered == 3
    assert subs[active.id].address == service.subscription_address(active.id)
    assert subs[paused.id].waiting == 3 and subs[paused.id].backlog == 3
    assert subs[paused.id].delivery is not None and not subs[paused.id].delivery.active
    assert subs[fed.id].mode in ("routed", "pull point")
    (pull_point,) = view.pull_points
    assert pull_point.record.name == "inbox" and pull_point.feeding == (fed.id,)
    assert pull_point.waiting == 2
    (registration,) = view.registrations
    assert registration.record.id == reg.id
    assert registration.address == service.registration_address(reg.id)
    counts = {t.topic: t for t in view.topics}
    assert counts[Topic(NS, ("a",))].messages == 3 and counts[Topic(NS, ("b",))].messages == 2
    assert counts[Topic(NS, ("a",))].rate > 0
    health = view.health
    assert health.adapter == "embedded" and health.shape == "queue"
    assert health.available and health.answers and health.started and health.ready


def test_delivery_state_of_a_failing_consumer(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    outbound.down.add(A)
    sub = service.subscribe(sub_req(A, topic=simple("t:a")))
    publish(service, 2)

    def failing() -> bool:
        d = service.subscription_status(sub.id).delivery
        return d is not None and d.failures >= 1 and d.retry_at is not None

    wait_until(failing)
    status = service.subscription_status(sub.id)
    assert status.delivery is not None
    assert status.delivery.last_error == f"{A} is down"
    assert status.delivery.retry_at is not None and status.delivery.retry_at > time.time() - 1
    assert status.backlog == 2 and status.delivery.delivered == 0
    outbound.down.discard(A)
    outbound.wait_messages(A, 2)
    wait_until(lambda: failures(service, sub.id) == 0)
    after = service.subscription_status(sub.id).delivery
    assert after is not None and after.delivered == 2 and after.last_error is None
    assert after.retry_at is None and after.last_delivery is not None


@pytest.mark.parametrize("adapter_url", [None, "filelog://{tmp}/log"], ids=["embedded", "log"])
def test_purge_a_subscription(
    make_broker: Callable[..., Broker], outbound: RecordingOutbound, adapter_url: str | None
) -> None:
    # the failing one keeps retrying however long the purges take (a log adapter's purge
    # answers once its position is saved: up to a commit pass later)
    service = make_broker(adapter_url=adapter_url, retry__give_up="keep").service
    assert service is not None
    paused = service.subscribe(sub_req(B, topic=simple("t:a")))
    service.pause(paused.id)
    outbound.down.add(A)
    failing = service.subscribe(sub_req(A, topic=simple("t:a")))
    publish(service, 5)
    wait_until(lambda: service.subscription_status(paused.id).waiting == 5)
    wait_until(lambda: failures(service, failing.id) >= 1)

    assert service.purge_subscription(paused.id) == 5
    assert service.subscription_status(paused.id).backlog == 0
    # a failing subscription loses its backlog and the batch it retries; it goes on
    service.purge_subscription(failing.id)
    wait_until(lambda: service.subscription_status(failing.id).backlog == 0)
    outbound.down.discard(A)
    service.resume(paused.id)
    service.notify([make_note("<after/>", simple("t:a"))])
    outbound.wait_messages(A, 1)
    outbound.wait_messages(B, 1)
    wait_idle(service)
    assert outbound.payloads_to(A) == [b"<after/>"]
    assert outbound.payloads_to(B) == [b"<after/>"]
    with pytest.raises(errors.ResourceUnknown):
        service.purge_subscription("nope")


@pytest.mark.parametrize("adapter_url", [None, "filelog://{tmp}/log"], ids=["embedded", "log"])
def test_purge_a_pull_point(make_broker: Callable[..., Broker], adapter_url: str | None) -> None:
    service = make_broker(adapter_url=adapter_url).service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [make_note(f"<m>{i}</m>", simple("t:a")) for i in range(4)])
    wait_until(lambda: service.overview().pull_points[0].waiting == 4)
    assert service.purge_pull_point(pp.id) == 4
    assert service.get_messages(pp.id, None) == []
    service.notify_pull_point(pp.id, [make_note("<after/>", simple("t:a"))])
    # (waiting counts what the middleware holds before the buffer has it: read until there)
    got: list[bytes] = []

    def after() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, None))
        return bool(got)

    wait_until(after, what="the message sent after the purge")
    assert got == [b"<after/>"]
    with pytest.raises(errors.ResourceUnknown):
        service.purge_pull_point("nope")


# --- topic counts -------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_topic_rates_follow_the_last_window() -> None:
    clock = Clock()
    stats = TopicStats(clock=clock, wall=lambda: 5.0)
    a, b = Topic("urn:x", ("a",)), Topic("urn:x", ("b",))
    stats.count([a] * 20 + [None, b])
    (first, second) = stats.snapshot()
    assert (first.topic, first.messages, first.rate) == (a, 20, 20 / WINDOW)
    assert (second.topic, second.messages, second.last) == (b, 1, 5.0)
    clock.now += WINDOW * 1.5  # half of the first window still overlaps the last WINDOW
    assert stats.snapshot()[0].rate == pytest.approx(10 / WINDOW)
    clock.now += WINDOW  # nothing published in the last WINDOW
    assert stats.snapshot()[0].rate == 0 and stats.snapshot()[0].messages == 20


def test_topic_table_is_bounded() -> None:
    clock = Clock()
    stats = TopicStats(limit=10, clock=clock)
    for i in range(12):
        clock.now += 1
        stats.count([Topic("urn:x", (f"t{i}",))])
    names = {t.topic.path[0] for t in stats.snapshot()}
    assert len(names) <= 10 and "t11" in names and "t0" not in names
    assert stats.forgotten == 12 - len(names)
