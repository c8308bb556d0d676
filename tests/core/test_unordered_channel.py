"""core.unordered: a subscription that chose unordered delivery keeps up to ``in_flight``
deliveries going at once; a stalled or failing one holds none of the others back; each
message is acknowledged only once its own delivery succeeded or it was confirmed as a
dead letter; a give-up, a final status, Pause and the memory budget behave as on an
ordered channel.

Driven step by step with a recording engine (tests/support/unordered_rig.py) and the
in-process stand-ins of tests/support/handles.py (a stalled consumer is a send blocked on
an event in a thread of the test), and once on the real ``DeliveryEngine`` with its
threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from wsnmom.core.adapter import HEADER_MESSAGE_ID, Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.delivery import DeliveryEngine
from wsnmom.core.delivery_budget import MemoryBudget
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.unordered import UnorderedChannel

from tests.support.handles import Handle, Msg
from tests.support.unordered_rig import LATER, NOW, Rig
from tests.support.waiting import wait_until


def test_a_stalled_delivery_holds_back_none_of_the_later_ones() -> None:
    rig = Rig(in_flight=4)
    rig.holds["m1"] = threading.Event()
    rig.channel.start()
    rig.deliver(1)
    rig.run_in_thread()
    rig.wait_arrived("m1")
    rig.deliver(2, 3, 4, 5)
    rig.run_ready()
    assert rig.acks() == [2, 3, 4, 5]  # while message 1's answer is still held
    assert rig.channel.held() == 1 and rig.channel.status().held == 1
    assert rig.channel.status().retry_at is None  # in flight, never failed
    rig.holds["m1"].set()
    rig.join()
    assert rig.acks() == [2, 3, 4, 5, 1]
    assert rig.channel.delivered == 5 and rig.channel.held() == 0
    assert rig.engine.budget.used == 0  # every message's bytes given back


def test_at_most_in_flight_deliveries_at_once_and_a_free_place_takes_the_next() -> None:
    rig = Rig(in_flight=2)
    rig.holds["m1"] = threading.Event()
    rig.holds["m2"] = threading.Event()
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run_in_thread()  # takes m1 and schedules one more run (a place is free)
    rig.wait_arrived("m1")
    rig.run_in_thread()  # takes m2: both places taken, nothing more scheduled
    rig.wait_arrived("m2")
    rig.deliver(4)
    rig.run_ready()
    assert [s for s in rig.sent] == [["m1"], ["m2"]]  # m3 waits for a place
    assert rig.channel.held() == 4
    rig.holds["m2"].set()  # m2 answers: its place takes m3, then m4
    rig.threads[1].join(10)
    rig.run_ready()
    assert rig.acks() == [2, 3, 4]
    assert rig.sent[2:] == [["m3"], ["m4"]]
    rig.holds["m1"].set()
    rig.join()
    assert rig.acks() == [2, 3, 4, 1]


def test_a_failing_message_is_retried_on_its_own_while_later_ones_are_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=4, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("busy"), DeliveryFailed("busy")]
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.channel._run(rig.engine.take_ready() or 0)  # m1 fails: its retry timer is armed
    assert rig.engine.later == [(1.0, rig.channel._gen)]
    status = rig.channel.status()
    assert (status.failures, status.last_error) == (1, "busy")
    assert status.retry_at is not None and status.retry_at > time.time()
    rig.run_ready()  # m1 is not due: m2 and m3 go meanwhile
    assert rig.acks() == [2, 3]
    rig.retry()  # fails again
    assert rig.channel.status().failures == 2 and len(rig.engine.later) == 2
    rig.deliver(4)
    rig.run_ready()
    assert rig.acks() == [2, 3, 4]
    rig.retry()  # the third attempt succeeds
    assert rig.acks() == [2, 3, 4, 1]
    assert rig.sent.count(["m1"]) == 3
    status = rig.channel.status()
    assert (status.failures, status.retry_at, status.last_error) == (0, None, None)
    assert [a.ok for a in status.attempts] == [False, True, True, False, True, True]
    assert rig.channel.delivered == 4


def test_exhausted_retries_bury_only_that_delivery_and_end_the_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=4, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("down")] * 3
    rig.holds["m2"] = threading.Event()
    rig.channel.start()
    rig.deliver(1, 2)
    rig.channel._run(rig.engine.take_ready() or 0)  # m1 fails once; m2's run is scheduled
    rig.run_in_thread()  # m2 stalls
    rig.wait_arrived("m2")
    rig.retry()  # m1: second failure
    assert rig.letters == [] and rig.channel.active
    rig.retry()  # m1: third, the last
    assert rig.letters == [([1], "retries-exhausted", 3)]
    assert [e.cause for e in rig.ended] == ["delivery"]
    assert rig.acks() == [1]  # settled once the dead letter was confirmed
    assert not rig.channel.active and rig.handle.stops == 1
    rig.holds["m2"].set()  # the stalled one still answers: it was delivered, so it is acked
    rig.join()
    assert rig.acks() == [1, 2]


def test_an_unconfirmed_dead_letter_settles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.confirm = False
    rig.fail["m1"] = [DeliveryFailed("down")] * 3
    restarts: list[float] = []
    monkeypatch.setattr(
        "wsnmom.core.channel_give_up.later", lambda delay, fn: restarts.append(delay)
    )
    rig.channel.start()
    rig.deliver(1)
    rig.channel._run(rig.engine.take_ready() or 0)
    rig.retry()
    rig.retry()
    assert rig.letters == [([1], "retries-exhausted", 3)]
    assert rig.acks() == [] and rig.requeued() == [] and rig.ended == []
    assert restarts == [1.0]  # started again after the longest delay: the give-up again


def test_a_final_status_buries_that_delivery_alone_and_the_rest_goes_on() -> None:
    rig = Rig(in_flight=2)
    rig.channel.backoff = Backoff(
        max_attempts=3, initial_delay=0.0, final_statuses=frozenset({410})
    )
    rig.fail["m1"] = [DeliveryFailed("gone", answered=True, status=410)]
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run_ready()
    assert rig.letters == [([1], "final-status", 1)]
    assert sorted(rig.acks()) == [1, 2, 3]
    assert rig.channel.active and rig.ended == []


def test_filtered_messages_are_acked_at_once_even_where_the_adapter_orders_acks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=2, ordered=True, batch_size=10, monkeypatch=monkeypatch)
    rig.drop = {2}
    rig.fail["m1"] = [DeliveryFailed("down")]
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run_ready()
    assert rig.sent == [["m1", "m3"]]
    assert rig.acks() == [2]
    rig.retry()
    assert rig.acks() == [2, 1, 3]


def test_pause_gives_everything_in_flight_back_unsettled_and_resume_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=4, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("down")]
    rig.holds["m2"] = threading.Event()
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.channel._run(rig.engine.take_ready() or 0)  # m1 fails, waits for its retry
    rig.run_in_thread()  # m2 stalls
    rig.wait_arrived("m2")
    old = rig.channel._gen
    rig.channel.stop()
    assert rig.handle.stops == 1 and rig.channel.held() == 0
    rig.elapse()
    rig.channel._run(old)  # the retry timer of the old generation does nothing
    assert rig.sent.count(["m1"]) == 1
    assert rig.requeued() == []  # a log would rewind; the stopped handle gives them back
    rig.holds["m2"].set()
    rig.join()
    assert rig.acks() == [2]  # delivered before the pause answered: acked
    rig.channel.start()
    rig.deliver(1, 3)  # the middleware redelivers
    rig.run_ready()
    assert sorted(rig.acks()) == [1, 2, 3]
    assert rig.channel.status().failures == 0


def test_prepare_later_puts_the_messages_back_and_frees_the_place() -> None:
    rig = Rig(in_flight=1)
    calls: list[int] = []

    def busy_once(batch: Sequence[Received]) -> Sequence[str | None]:
        from wsnmom.core.channel_signals import PrepareLater

        calls.append(len(batch))
        if len(calls) == 1:
            raise PrepareLater(0.5)
        return [f"m{m.n}" for m in batch]  # type: ignore[attr-defined]

    rig.channel.prepare = busy_once
    rig.channel.start()
    rig.deliver(1)
    rig.run_ready()
    assert rig.engine.later == [(0.5, rig.channel._gen)] and rig.sent == []
    rig.deliver(2)  # scheduled already: waits for the timer's run
    assert rig.engine.ready == []
    rig.channel._run(rig.channel._gen)
    rig.run_ready()
    assert rig.acks() == [1, 2]


def test_on_the_real_engine_a_stalled_consumer_holds_back_nothing() -> None:
    engine = DeliveryEngine(workers=2, backoff=NOW, per_destination=4)
    journal: list[tuple[Any, ...]] = []
    release = threading.Event()
    sent: list[str] = []

    def send(items: Sequence[str]) -> None:
        sent.extend(items)
        if "m1" in items:
            assert release.wait(10)

    try:
        handle = Handle()
        channel = engine.open_channel(
            "sub-e",
            handle,
            lambda batch: [f"m{m.n}" for m in batch],  # type: ignore[attr-defined]
            send,
            lambda end: None,
            batch_size=1,
            destination="http://127.0.0.1:1",
            in_flight=4,
        )
        assert isinstance(channel, UnorderedChannel)
        channel.start()
        handle.push(Msg(1, journal))
        wait_until(lambda: "m1" in sent, 10, what="message 1 sent")
        handle.push(*(Msg(n, journal) for n in (2, 3, 4, 5)))
        wait_until(lambda: sorted(e[1] for e in journal) == [2, 3, 4, 5], 10, what="2..5 acked")
        release.set()
        wait_until(lambda: len(journal) == 5, 10, what="message 1 acked")
        assert [e[0] for e in journal] == ["ack"] * 5 and journal[-1] == ("ack", 1)
    finally:
        release.set()
        engine.close()


def test_a_message_beyond_the_memory_budget_parks_the_channel_with_everything_in_flight() -> None:
    rig = Rig(in_flight=4)
    # each message is charged 513 bytes: two fit, the third does not
    rig.engine.budget = MemoryBudget(total=1200)
    try:
        rig.holds["m1"] = threading.Event()
        rig.channel.start()
        rig.deliver(1)
        rig.run_in_thread()
        rig.wait_arrived("m1")
        rig.deliver(2, 3)  # m3 does not fit: the channel parks
        wait_until(lambda: len(rig.handle.starts) == 2, 10, what="parked and started again")
        assert rig.handle.stops == 1
        assert rig.journal == []  # m2 and m3 given back by the stopped handle, not settled
        assert rig.channel.held() == 0 and rig.engine.budget.used == 0
        rig.holds["m1"].set()
        rig.join()
        assert rig.acks() == [1]  # its consumer took it: acked, although given back
        rig.deliver(2, 3)  # the middleware redelivers
        rig.run_ready()
        assert rig.acks() == [1, 2, 3] and rig.engine.budget.used == 0
    finally:
        rig.engine.budget.close()


def test_an_open_circuit_defers_the_attempt_without_sending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.engine.wait = 5.0
    rig.channel.start()
    rig.deliver(1)
    lane = Lane("http://c:1")
    rig.channel._run(rig.engine.take_ready() or 0, lane)
    assert rig.sent == [] and rig.engine.reports == []  # no attempt, nothing to report
    [attempt] = rig.channel.status().attempts
    assert attempt.deferred and not attempt.ok and "circuit open for 5.0s" in (attempt.error or "")
    assert rig.engine.later == [(1.0, rig.channel._gen)]
    rig.channel._run(rig.channel._gen, lane)  # before the retry is due: nothing happens
    assert rig.sent == []
    rig.engine.wait = None  # the circuit closed
    rig.elapse()
    rig.channel._run(rig.channel._gen, lane)
    assert rig.sent == [["m1"]] and rig.engine.reports == [Outcome.ANSWERED]
    assert rig.acks() == [1]


def test_a_retry_count_survives_a_park_and_a_pause_starts_it_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("down")] * 5

    def message(n: int) -> Msg:
        m = Msg(n, rig.journal)
        m.headers = {HEADER_MESSAGE_ID: f"id-{n}"}
        return m

    rig.channel.start()
    rig.handle.push(message(1))
    rig.channel._run(rig.engine.take_ready() or 0)  # failure 1
    rig.retry()  # failure 2
    rig.channel._parking = True  # what the budget asks of a channel waiting for a retry
    assert rig.channel._park() and rig.handle.stops == 1
    rig.channel._unpark()
    assert len(rig.handle.starts) == 2
    rig.handle.push(message(1))  # redelivered by the middleware
    rig.run_ready()  # failure 3: the last
    assert rig.letters == [([1], "retries-exhausted", 3)]
    # a Pause forgets the counts: after Resume a message gets its attempts again
    rig2 = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig2.fail["m1"] = [DeliveryFailed("down")] * 5
    rig2.channel.start()
    rig2.handle.push(message(1))
    rig2.channel._run(rig2.engine.take_ready() or 0)
    rig2.retry()
    rig2.channel.stop()
    rig2.channel.start()
    rig2.handle.push(message(1))
    rig2.run_ready()
    assert rig2.letters == [] and rig2.channel.status().failures == 1


def test_a_message_batched_with_one_that_failed_before_a_park_carries_only_its_own_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Across parks each message keeps the failed attempts it had itself.  Before, every
    message of a redelivered batch was carried at the batch's count, which started at the
    most any of them brought: a message that joined one that had failed took that count up
    and carried it, grown, into the next park, and was buried as exhausted before its
    attempts were."""
    rig = Rig(in_flight=2, batch_size=2, monkeypatch=monkeypatch)
    rig.channel.backoff = LATER  # three attempts
    rig.fail["m1"] = [DeliveryFailed("down")] * 5
    rig.fail["m2"] = [DeliveryFailed("down")] * 5

    def message(n: int) -> Msg:
        m = Msg(n, rig.journal)
        m.headers = {HEADER_MESSAGE_ID: f"id-{n}"}
        return m

    def park_and_unpark() -> None:
        rig.channel._parking = True  # what the budget asks of a channel waiting for a retry
        assert rig.channel._park()
        rig.channel._unpark()

    rig.channel.start()
    rig.handle.push(message(1))
    rig.run_ready()  # m1 alone: failure 1
    park_and_unpark()
    assert rig.channel._carried == {"id-1": 1}
    rig.handle.push(message(1), message(2))  # redelivered m1, and m2 new: one delivery
    rig.run_ready()
    assert rig.sent[-1] == ["m1", "m2"]  # failed: m1's second attempt, m2's first
    park_and_unpark()
    assert rig.channel._carried == {"id-1": 2, "id-2": 1}  # before: both at 2
    rig.channel.batch_size = 1
    rig.handle.push(message(2))  # m2 alone: its second attempt fails
    rig.run_ready()
    assert rig.letters == []  # before: buried as exhausted after two attempts
    assert rig.channel.status().failures == 2
    rig.retry()  # its third
    assert rig.letters == [([2], "retries-exhausted", 3)]


def test_on_the_real_engine_every_message_is_acked_once_through_random_failures() -> None:
    """200 messages, a consumer that refuses about a third of its attempts (seeded), four
    deliveries in flight on four threads: each message ends acknowledged exactly once,
    nothing stays held or charged."""
    import random

    rng = random.Random(25)
    rng_lock = threading.Lock()
    engine = DeliveryEngine(
        workers=4,
        backoff=Backoff(max_attempts=1000, initial_delay=0.001, max_delay=0.005, give_up="keep"),
        per_destination=4,
    )
    journal: list[tuple[Any, ...]] = []

    def send(items: Sequence[str]) -> None:
        with rng_lock:
            refuse = rng.random() < 0.3
        if refuse:
            raise DeliveryFailed("refused")

    try:
        handle = Handle()
        channel = engine.open_channel(
            "sub-r",
            handle,
            lambda batch: [f"m{m.n}" for m in batch],  # type: ignore[attr-defined]
            send,
            lambda end: None,
            batch_size=3,
            destination="http://127.0.0.1:1",
            in_flight=4,
        )
        channel.start()
        handle.push(*(Msg(n, journal) for n in range(200)))
        wait_until(lambda: len(journal) >= 200, 30, what="200 settled")
        wait_until(lambda: channel.held() == 0, 10, what="nothing held")
        assert sorted(e[1] for e in journal) == list(range(200))
        assert {e[0] for e in journal} == {"ack"}
        assert engine.budget.used == 0 and channel.delivered == 200
    finally:
        engine.close()


# -- an unexpected exception (a bug) never wedges a delivery -------------------------------
def test_a_trace_that_raises_is_a_failed_attempt_retried_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=1, monkeypatch=monkeypatch)
    calls: list[str] = []

    def trace(item: str) -> str | None:
        calls.append(item)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return None

    rig.channel.trace = trace
    rig.channel.start()
    rig.deliver(1)
    rig.run_ready()  # before: raised, the delivery running for ever and its place lost
    assert rig.sent == [] and rig.acks() == []
    assert [gen for _, gen in rig.engine.later] == [rig.channel._gen]
    rig.retry()
    assert rig.sent == [["m1"]] and rig.acks() == [1]
    rig.deliver(2, 3)
    rig.run_ready()
    assert rig.acks() == [1, 2, 3]


def test_a_dead_letter_sink_that_raises_frees_the_place() -> None:
    rig = Rig(in_flight=1)
    rig.channel.backoff = Backoff(
        max_attempts=3, initial_delay=0.0, final_statuses=frozenset({410})
    )
    rig.fail["m1"] = [DeliveryFailed("gone", answered=True, status=410)]

    def bury(messages: Sequence[Received], reason: str, attempts: int, error: Any) -> bool:
        raise RuntimeError("dead letters unreachable")

    rig.channel.dead_letter = bury
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run_ready()  # before: m2 queued for ever behind the lost place
    assert rig.sent == [["m1"], ["m2"]]
    assert rig.acks() == [2]  # m1 unsettled: the middleware gives it back
    assert rig.channel.held() == 0


def _count(counter: Any) -> float:
    return float(counter._value.get())


def test_what_operators_see_while_deliveries_are_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``held_messages`` lists the deliveries in flight first, then the queue, up to its
    limit; ``failures`` and ``status`` show the delivery that failed most and the retry
    due first; a give-up leaves the channel inactive."""
    from wsnmom.core import metrics

    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("one")] * 3
    rig.fail["m2"] = [DeliveryFailed("two")]
    failed = _count(metrics.DELIVERY_FAILURES)
    rig.channel.start()
    rig.deliver(1, 2, 3, 4)
    rig.run_ready()  # m1 and m2 fail once each; m3 and m4 wait for a place
    assert _count(metrics.DELIVERY_FAILURES) == failed + 2
    assert [m.n for m in rig.channel.held_messages(10)] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert [m.n for m in rig.channel.held_messages(3)] == [1, 2, 3]  # type: ignore[attr-defined]
    assert [m.n for m in rig.channel.held_messages(1)] == [1]  # type: ignore[attr-defined]
    assert rig.channel.held_messages(0) == []
    assert rig.channel.held() == 4
    rig.retry()  # m1 fails again
    rig.channel._run(rig.channel._gen)  # m2 is delivered: its place takes m3, then m4
    rig.run_ready()
    assert rig.acks() == [2, 3, 4]
    assert rig.channel.failures == 2
    status = rig.channel.status()
    assert status.failures == 2 and status.held == 1 and status.active
    assert status.delivered == 3 and status.last_delivery is not None
    assert status.last_error is None  # the last attempt's (m4 delivered)
    assert status.retry_at is not None and status.retry_at > time.time()
    rig.retry()  # the third attempt fails: given up, the channel is no longer active
    assert rig.letters == [([1], "retries-exhausted", 3)]
    assert not rig.channel.status().active and rig.channel.failures == 0


def test_a_deferred_attempt_and_a_failed_one_are_counted_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from wsnmom.core import metrics

    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("busy")]
    lane = Lane("http://c:1")
    failed, deferred = _count(metrics.DELIVERY_FAILURES), _count(metrics.DELIVERY_DEFERRED)
    rig.engine.wait = 5.0  # the destination's circuit is open
    rig.channel.start()
    rig.deliver(1)
    rig.channel._run(rig.engine.take_ready() or 0, lane)
    assert _count(metrics.DELIVERY_DEFERRED) == deferred + 1
    assert _count(metrics.DELIVERY_FAILURES) == failed
    rig.engine.wait = None
    rig.elapse()
    rig.channel._run(rig.channel._gen, lane)  # sent, and it fails
    assert rig.sent == [["m1"]]
    assert _count(metrics.DELIVERY_DEFERRED) == deferred + 1
    assert _count(metrics.DELIVERY_FAILURES) == failed + 1


def test_a_retry_due_runs_before_a_new_delivery_and_a_place_is_never_below_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``in_flight`` below one is one; a run takes the delivery whose retry is due before
    a new one from the queue."""
    rig = Rig(in_flight=0, monkeypatch=monkeypatch)
    assert rig.channel.in_flight == 1
    unnamed: UnorderedChannel[str] = UnorderedChannel(
        rig.engine, "sub-d", Handle(), rig.prepare, rig.send, rig.ended.append, 1, False
    )
    assert unnamed.in_flight == 1  # the default
    rig.fail["m1"] = [DeliveryFailed("busy")]
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run_ready()  # m1 fails; its one place is taken: m2 waits
    assert rig.sent == [["m1"]] and rig.channel.held() == 2
    rig.retry()  # the retry, not m2
    assert rig.sent == [["m1"], ["m1"]]
    rig.run_ready()
    assert rig.sent[2:] == [["m2"]] and rig.acks() == [1, 2]


def test_a_run_while_every_place_is_taken_takes_nothing_and_schedules_nothing() -> None:
    """With its one place taken (a stalled send), a run (a timer's, a spurious one)
    takes no second delivery, and taking the first scheduled no run for the next."""
    rig = Rig(in_flight=1)
    rig.holds["m1"] = threading.Event()
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run_in_thread()
    rig.wait_arrived("m1")
    assert rig.engine.ready == []  # no place for m2: nothing scheduled for it
    rig.channel._run(rig.channel._gen)
    assert rig.sent == [["m1"]] and rig.channel.held() == 2
    rig.holds["m1"].set()
    rig.join()
    rig.run_ready()  # m1's place takes m2
    assert rig.acks() == [1, 2]


def test_a_run_of_an_earlier_generation_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a Pause and Resume, a run scheduled before (of the old generation) neither
    takes a delivery nor looks at the queue again."""
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.channel.start()
    old = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    rig.deliver(1)
    rig.engine.ready.clear()
    rig.channel._run(old)
    rig.channel._look_again(old)
    assert rig.sent == [] and rig.engine.ready == []
    rig.channel._run(rig.channel._gen)
    assert rig.acks() == [1]


def test_a_batch_ending_the_subscription_leaves_nothing_in_flight() -> None:
    """Preparing a batch ends the subscription (``EndSubscription``): its delivery is
    dropped and what the channel holds reads as nothing."""
    rig = Rig(in_flight=2)

    def ending(batch: Sequence[Received]) -> Sequence[str | None]:
        raise EndSubscription("the filter's end", "filter")

    rig.channel.prepare = ending
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run_ready()
    assert [e.reason for e in rig.ended] == ["the filter's end"]
    assert rig.letters == [([1], "filter-budget", 0)]
    assert rig.channel.held() == 0 and rig.channel.held_messages(5) == []
    assert rig.channel.status().failures == 0 and rig.channel.failures == 0


def test_a_settling_bug_retries_the_delivery_after_the_first_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_finish`` raising before it let go of the delivery (a bug): the delivery is not
    left running with its place lost; it is retried after the schedule's first delay,
    not before, and then delivered."""
    rig = Rig(in_flight=1, monkeypatch=monkeypatch)
    rig.channel.backoff = Backoff(max_attempts=5, initial_delay=1.0, multiplier=2.0, max_delay=9)
    real = UnorderedChannel._remember
    calls: list[int] = []

    def remember(self: Any, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug while settling")
        real(self, *args)

    monkeypatch.setattr(UnorderedChannel, "_remember", remember)
    rig.channel.start()
    rig.deliver(1)
    rig.run_ready()
    assert rig.sent == [["m1"]] and rig.acks() == []
    assert rig.engine.later == [(1.0, rig.channel._gen)]
    rig.channel._run(rig.channel._gen)  # not due yet
    assert rig.sent == [["m1"]]
    rig.retry()
    assert rig.sent == [["m1"], ["m1"]] and rig.acks() == [1]


def test_a_second_stop_stops_nothing_more() -> None:
    rig = Rig(in_flight=2)
    rig.channel.start()
    rig.deliver(1)
    rig.channel.stop()
    rig.channel.stop()
    assert rig.handle.stops == 1 and rig.channel.held() == 0


def test_counts_carried_over_a_park_wait_for_each_message_to_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two messages failed before a park; the middleware redelivers them one at a time
    (and first one without a message id): each takes up its own count when it comes
    back, the second's kept while the first is taken."""
    rig = Rig(in_flight=2, batch_size=2, monkeypatch=monkeypatch)
    rig.fail["m1"] = [DeliveryFailed("down")] * 5
    rig.fail["m2"] = [DeliveryFailed("down")] * 5

    def message(n: int, key: bool = True) -> Msg:
        m = Msg(n, rig.journal)
        m.headers = {HEADER_MESSAGE_ID: f"id-{n}"} if key else {}
        return m

    rig.channel.start()
    rig.handle.push(message(1), message(2))
    rig.run_ready()  # one delivery: failure 1
    rig.retry()  # failure 2
    rig.channel._parking = True  # what the budget asks of a channel waiting for a retry
    assert rig.channel._park()
    rig.channel._unpark()
    assert rig.channel._carried == {"id-1": 2, "id-2": 2}
    rig.channel.batch_size = 2
    rig.handle.push(message(3, key=False), message(1))  # m1 back, behind one without id
    rig.run_ready()  # its third attempt: the last
    assert rig.letters == [([3, 1], "retries-exhausted", 3)]
    assert rig.channel._carried == {"id-2": 2}
