"""F1 (docs/performance.md): the demand reconciler costs nothing per Subscribe while no
registration is demand-based, and its wake-ups are coalesced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


def _round_after(service: BrokerService) -> Callable[[], None]:
    """The barrier for the background reconciler: the returned function wakes it and
    waits until a round that started after the call has ended."""
    task = service.demand._task
    inner = task._work
    armed, done = threading.Event(), threading.Event()

    def counted() -> None:
        after = armed.is_set()
        inner()
        if after:
            done.set()

    task._work = counted

    def wait() -> None:
        armed.set()
        task.wake()
        assert done.wait(10), "no reconciler round within 10 s"

    return wait


def test_no_scan_without_demand_registration(service: BrokerService) -> None:
    counter = _count_scans(service)
    round_after = _round_after(service)
    subs = [service.subscribe(sub_req(C, topic=simple(f"t:s{i}"))) for i in range(20)]
    service.pause(subs[0].id)
    service.resume(subs[0].id)
    service.unsubscribe(subs[1].id)
    # a plain (not demand-based) registration needs no demand either
    service.register_publisher(
        RegisterPublisherRequest(EndpointReference(P), topics=(simple("t:s0"),))
    )
    service.demand.reconcile()
    round_after()  # the background reconciler ran on every wake-up before
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
    first, second = threading.Event(), threading.Event()

    def work() -> None:
        runs.append(time.monotonic())
        (second if first.is_set() else first).set()

    task = PeriodicTask(work, name="test-coalesce", interval=3600.0, min_spacing=0.5)
    task.start()
    thread = task._thread
    assert thread is not None
    task.wake()
    assert first.wait(30.0)
    for _ in range(50):  # a burst of wake-ups right after a round ...
        task.wake()
    assert second.wait(30.0)
    task.stop()  # the barrier: no round starts after stop, so the count below is final
    assert not thread.is_alive()
    # ... is served by one more round, not fifty, and not sooner than min_spacing
    assert len(runs) == 2
    assert runs[1] - runs[0] >= 0.5 - 0.01


def test_periodic_task_stop_not_delayed_by_spacing() -> None:
    """A stop while the loop waits out an hour of spacing ends the thread: the join (up
    to ``join_timeout``) would otherwise return with the thread still waiting."""
    rounds = threading.Semaphore(0)
    task = PeriodicTask(
        rounds.release, name="test-stop", interval=3600.0, min_spacing=3600.0, join_timeout=30.0
    )
    task.start()
    thread = task._thread
    assert thread is not None
    task.wake()
    assert rounds.acquire(timeout=30.0)  # the first round ran: the next waits the spacing
    task.wake()
    task.stop()
    assert not thread.is_alive()
    assert not rounds.acquire(blocking=False)  # and the woken round never ran
