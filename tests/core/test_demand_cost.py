"""F1 (docs/performance.md): the demand reconciler costs nothing per Subscribe while no
registration is demand-based, and its wake-ups are coalesced."""

from __future__ import annotations

import threading
import time
from typing import Any

from wsnmom.core.model import EndpointReference, RegisterPublisherRequest
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import TopicExpression

from .conftest import RecordingOutbound, simple, sub_req

P = "http://127.0.0.1:9/publisher"
C = "http://127.0.0.1:9/consumer"


class _CountingFilters:
    """Wraps the service's active-filter provider and counts the scans."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self) -> list[TopicExpression | None]:
        self.calls += 1
        result: list[TopicExpression | None] = self.inner()
        return result


def _count_scans(service: BrokerService) -> _CountingFilters:
    counter = _CountingFilters(service.demand._active_filters)
    service.demand._active_filters = counter
    return counter


def test_no_scan_without_demand_registration(service: BrokerService) -> None:
    counter = _count_scans(service)
    subs = [service.subscribe(sub_req(C, topic=simple(f"t:s{i}"))) for i in range(20)]
    service.pause(subs[0].id)
    service.resume(subs[0].id)
    service.unsubscribe(subs[1].id)
    # a plain (not demand-based) registration needs no demand either
    service.register_publisher(
        RegisterPublisherRequest(EndpointReference(P), topics=(simple("t:s0"),))
    )
    service.demand.reconcile()
    time.sleep(0.3)  # the background reconciler ran on the wake-ups meanwhile
    assert counter.calls == 0


def test_scan_once_demand_registration_exists(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    counter = _count_scans(service)
    service.subscribe(sub_req(C, topic=simple("t:d")))
    service.demand.reconcile()
    assert counter.calls == 0
    service.register_publisher(
        RegisterPublisherRequest(EndpointReference(P), topics=(simple("t:d"),), demand=True)
    )
    service.demand.reconcile()
    assert counter.calls >= 1
    assert outbound.wait(lambda: any(k == "subscribe" for k, _ in outbound.events))


def test_periodic_task_coalesces_wakeups() -> None:
    runs: list[float] = []
    done = threading.Event()

    def work() -> None:
        runs.append(time.monotonic())
        done.set()

    task = PeriodicTask(work, name="test-coalesce", interval=60.0, min_spacing=0.2)
    task.start()
    try:
        task.wake()
        assert done.wait(2.0)
        for _ in range(50):  # a burst of wake-ups right after a round ...
            task.wake()
            time.sleep(0.002)
        time.sleep(0.5)
        # ... is served by one more round, not fifty, and not sooner than min_spacing
        assert len(runs) == 2
        assert runs[1] - runs[0] >= 0.19
    finally:
        started = time.monotonic()
        task.stop()
        assert time.monotonic() - started < 1.0


def test_periodic_task_stop_not_delayed_by_spacing() -> None:
    task = PeriodicTask(lambda: None, name="test-stop", interval=60.0, min_spacing=30.0)
    task.start()
    task.wake()
    time.sleep(0.05)
    task.wake()  # now waiting out the spacing
    time.sleep(0.05)
    started = time.monotonic()
    task.stop()
    assert time.monotonic() - started < 1.0
