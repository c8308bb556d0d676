"""core.channel's later features driven step by step: the byte budget and parking, dead
letters (give-up, final statuses, a filter over its budget), the delivery attempts kept for
operators, ``PrepareLater`` (filter shares), the retry schedule's options and the peek at
held messages.

Like ``test_channel_mutants.py`` (whose recording engine and rig these tests share:
tests/support/channel_rig.py), they kill the mutants of ``core/channel.py`` (``make
mutation``) in process, with stand-ins for the memory budget and the dead-letter sink; no
conftest fixture, no thread, no broker.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import pytest
from wsnmom.core import channel_give_up
from wsnmom.core.adapter import Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription, PrepareLater
from wsnmom.core.channel_status import ATTEMPTS_KEPT, DeliveryAttempt
from wsnmom.core.lanes import Lane
from wsnmom.core.ports import DeliveryFailed

from tests.support.channel_rig import Budget, Rig, Sink, Timers, rig_with, size
from tests.support.handles import Msg


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[Timers]:
    Timers.made = []
    monkeypatch.setattr(channel_give_up, "later", Timers)
    return Timers.made


# -- the byte budget -------------------------------------------------------------------------
def test_each_message_is_charged_to_the_group_and_released_once_settled() -> None:
    budget = Budget()
    rig = rig_with(budget)
    rig.channel.start()
    rig.deliver(1, 22)
    assert budget.taken == [("owner", size(1), False), ("owner", size(22), False)]
    assert budget.released == []
    rig.run()
    assert budget.released == [("owner", size(1)), ("owner", size(22))]
    rig.channel.stop()
    assert budget.released == [("owner", size(1)), ("owner", size(22))]  # nothing held: 0


def test_an_unbounded_channel_forces_its_charges() -> None:
    budget = Budget(room=0)
    rig = rig_with(budget, bounded=False)
    rig.channel.start()
    rig.deliver(1)
    assert budget.taken == [("owner", size(1), True)]
    assert budget.parks == []
    assert rig.channel.held() == 1


def test_stop_and_start_release_what_is_held_as_one_sum() -> None:
    budget = Budget()
    rig = rig_with(budget)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.channel.stop()
    assert budget.released == [("owner", size(1) + size(2))]
    rig.channel.start()
    assert budget.released == [("owner", size(1) + size(2))]


def test_a_message_that_does_not_fit_is_forgotten_unsettled_and_parks_once() -> None:
    budget = Budget(room=size(1))
    rig = rig_with(budget)
    rig.channel.start()
    rig.deliver(1, 2, 3)
    assert rig.journal == []  # neither acked nor requeued: the handle gives them back
    assert rig.channel.held() == 1
    assert len(rig.engine.ready) == 1  # only the first one scheduled a run
    assert budget.parks == [("owner", rig.channel)]
    assert [s for _, s, _ in budget.taken] == [size(1), size(2)]  # 3: parking already
    assert rig.channel.active


def test_parking_stops_the_handle_releases_and_keeps_the_channel_active() -> None:
    budget = Budget(room=size(1))
    rig = rig_with(budget)
    rig.channel.start()
    gen = rig.channel._gen
    rig.deliver(1, 2)
    assert rig.channel._park() is True
    assert rig.handle.stops == 1
    assert budget.released == [("owner", size(1))]
    assert rig.channel.held() == 0
    assert rig.channel.active and rig.channel.status().active
    assert rig.channel._gen != gen
    rig.run()  # the run scheduled before the park is stale
    assert rig.sent == []
    # while parked, the stopped handle gives messages back: neither settled nor queued
    rig.deliver(3)
    assert rig.journal == []
    assert rig.channel.held() == 0
    assert budget.parks == [("owner", rig.channel)]


def test_park_without_a_request_or_after_close_does_nothing() -> None:
    rig = rig_with(Budget())
    rig.channel.start()
    assert rig.channel._park() is False
    assert rig.handle.stops == 0
    assert rig.channel.active
    closed = rig_with(Budget(room=0))
    closed.channel.start()
    closed.deliver(1)  # the first message is refused: parking requested
    closed.channel._closed = True
    assert closed.channel._park() is False
    assert closed.handle.stops == 0
    assert not closed.channel._parking


def test_a_parked_channel_starts_again_on_unpark_keeping_its_retry_count() -> None:
    budget = Budget(room=size(1) + size(2))
    rig = rig_with(budget)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    rig.run()
    assert rig.channel.failures == 1
    rig.deliver(2, 3)  # 3 does not fit
    assert rig.channel._park()
    rig.channel._unpark()
    assert rig.handle.starts == [7, 7]
    assert rig.channel.failures == 1
    assert rig.channel.status().retry_at is None  # the park dropped the timer: runs now
    assert not rig.channel._parking
    rig.deliver(4)  # consuming again
    assert rig.channel.held() == 1
    rig.channel._unpark()  # not parked any more: no second start
    assert rig.handle.starts == [7, 7]


def test_unpark_of_a_channel_that_is_not_parked_does_nothing() -> None:
    rig = rig_with(Budget())
    rig.channel.start()
    rig.channel.stop()
    rig.channel._unpark()
    assert rig.handle.starts == [7]


def test_stop_while_parked_does_not_stop_again_and_is_not_unparked() -> None:
    rig = rig_with(Budget(room=0))
    rig.channel.start()
    rig.deliver(1)
    assert rig.channel._park()
    rig.channel.stop()
    assert rig.handle.stops == 1
    assert not rig.channel.active
    rig.channel._unpark()
    assert rig.handle.starts == [7]
    rig.channel.start()  # Resume
    assert rig.handle.starts == [7, 7]
    assert rig.channel.failures == 0


def test_close_while_parked_is_final() -> None:
    rig = rig_with(Budget(room=0))
    rig.channel.start()
    rig.deliver(1)
    assert rig.channel._park()
    rig.channel.close()
    assert rig.handle.stops == 1
    assert not rig.channel.active
    rig.channel._unpark()
    rig.channel.start()
    assert rig.handle.starts == [7]


def test_a_stopped_channel_that_is_not_parking_requeues_a_late_message() -> None:
    budget = Budget()
    rig = rig_with(budget)
    rig.channel.start()
    on_message = rig.handle.on_message
    rig.channel.stop()
    assert on_message is not None
    on_message(Msg(1, rig.journal))
    assert rig.journal == [("nack", 1, True)]
    assert budget.taken == []


def test_a_failing_channel_parks_while_others_wait_for_room() -> None:
    budget = Budget(waiting=True)
    rig = rig_with(budget)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    rig.run()
    assert rig.engine.later == []  # no timer: parked instead
    assert budget.parks == [("owner", rig.channel)]
    assert rig.channel._parking
    assert rig.channel._park()
    assert budget.released == [("owner", size(1))]
    rig.channel._unpark()
    assert rig.channel.failures == 1


@pytest.mark.parametrize(
    ("bounded", "waiting", "charged"),
    [(False, True, True), (True, False, True), (True, True, False)],
)
def test_a_failing_channel_keeps_its_timer_unless_it_can_give_room_back(
    bounded: bool, waiting: bool, charged: bool
) -> None:
    budget = Budget(waiting=waiting)
    rig = rig_with(budget, bounded=bounded)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    if not charged:
        rig.channel._charged.clear()
    rig.run()
    assert budget.parks == []
    assert [d for d, _ in rig.engine.later] == [1.0]


def test_a_failing_channel_that_is_parking_already_keeps_its_timer() -> None:
    budget = Budget(room=size(1), waiting=True)
    rig = rig_with(budget)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2)  # 2 does not fit: parking requested
    assert len(budget.parks) == 1
    rig.run()
    assert len(budget.parks) == 1
    assert [d for d, _ in rig.engine.later] == [1.0]


def test_yield_room_of_a_stale_generation_or_a_stopped_channel_does_nothing() -> None:
    budget = Budget(waiting=True)
    rig = rig_with(budget)
    rig.channel.start()
    rig.deliver(1)
    gen = rig.channel._gen
    assert rig.channel._yield_room(gen - 1) is False
    rig.channel.stop()
    assert rig.channel._yield_room(rig.channel._gen) is False
    assert budget.parks == []


def test_a_filtered_message_releases_its_bytes() -> None:
    budget = Budget()
    rig = rig_with(budget, drop=lambda n: True)
    rig.channel.start()
    rig.deliver(5)
    rig.run()
    assert budget.released == [("owner", size(5))]


# -- dead letters ------------------------------------------------------------------------------
def test_a_give_up_publishes_the_batch_as_dead_letters_then_acks_it_in_order() -> None:
    sink = Sink()
    rig = rig_with(sink=sink, ordered=True, drop=lambda n: n == 2, backoff=Backoff(max_attempts=2))
    rig.channel.start()
    rig.failures += [DeliveryFailed("down"), DeliveryFailed("still down")]
    rig.deliver(1, 2, 3)
    rig.run()
    rig.run()
    assert sink.letters == [([1, 3], "retries-exhausted", 2, "still down")]
    assert rig.acks() == [1, 2, 3]
    assert rig.handle.stops == 1
    assert [e.cause for e in rig.ended] == ["delivery"]


def test_a_give_up_whose_dead_letters_are_not_confirmed_settles_nothing_and_retries(
    timers: list[Timers],
) -> None:
    sink = Sink(confirm=False)
    rig = rig_with(sink=sink, backoff=Backoff(max_attempts=1, max_delay=42.0))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    rig.run()
    assert sink.letters == [([1], "retries-exhausted", 1, "down")]
    assert rig.journal == []
    assert rig.ended == []
    assert rig.handle.stops == 1
    assert [(t.interval, t.function) for t in timers] == [(42.0, rig.channel._start_if_due)]


def test_a_give_up_of_only_filtered_messages_acks_without_a_dead_letter() -> None:
    sink = Sink()
    rig = rig_with(sink=sink)
    rig.channel.start()
    msgs = [Msg(1, rig.journal), Msg(2, rig.journal)]
    assert rig.channel._bury([], msgs, "retries-exhausted", 3, "x") is True
    assert sink.letters == []
    assert rig.acks() == [1, 2]
    assert rig.channel._bury([], [], "retries-exhausted", 3, "x") is True
    assert rig.acks() == [1, 2]


def test_without_a_sink_a_give_up_leaves_the_batch_unsettled() -> None:
    rig = rig_with(sink=None, backoff=Backoff(max_attempts=1))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    rig.run()
    assert rig.journal == []
    assert len(rig.ended) == 1


def test_a_filter_over_its_budget_buries_the_batch_with_its_reason() -> None:
    sink = Sink()
    rig = rig_with(sink=sink)
    end = EndSubscription("filter over budget", "filter")

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        raise end

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert sink.letters == [([1, 2], "filter-budget", 0, "filter over budget")]
    assert rig.acks() == [1, 2]
    assert rig.ended == [end]


def test_a_filter_over_its_budget_whose_letters_are_not_confirmed_is_not_ended(
    timers: list[Timers],
) -> None:
    sink = Sink(confirm=False)
    rig = rig_with(sink=sink)

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        raise EndSubscription("over", "filter")

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert rig.ended == []
    assert rig.journal == []
    assert rig.handle.stops == 1
    assert len(timers) == 1


def test_end_releases_what_the_channel_held() -> None:
    budget = Budget()
    rig = rig_with(budget)

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        raise EndSubscription("over", "filter")

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert sum(s for _, s in budget.released) == size(1) + size(2)


def test_a_final_status_buries_the_batch_and_goes_on_with_the_next() -> None:
    sink = Sink()
    rig = rig_with(
        sink=sink,
        batch_size=1,
        backoff=Backoff(max_attempts=5, final_statuses=frozenset({410})),
    )
    rig.channel.start()
    gen = rig.channel._gen
    rig.failures.append(DeliveryFailed("gone", answered=True, status=410))
    rig.deliver(1, 2)
    rig.run()
    assert sink.letters == [([1], "final-status", 1, "gone")]
    assert rig.acks() == [1]
    assert rig.engine.later == []
    assert rig.engine.ready == [gen, gen]  # message 2 waits: run again
    assert rig.channel.failures == 0
    assert rig.channel.status().last_error == "gone"
    rig.run()
    assert rig.sent[-1] == ["m2"]
    assert rig.acks() == [1, 2]


def test_a_final_status_with_nothing_queued_leaves_the_channel_idle() -> None:
    sink = Sink()
    rig = rig_with(sink=sink, backoff=Backoff(final_statuses=frozenset({404})))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("not found", answered=True, status=404))
    rig.deliver(1)
    rig.run()
    assert rig.acks() == [1]
    assert len(rig.engine.ready) == 1
    assert not rig.channel._scheduled
    rig.deliver(2)  # a new message schedules it again
    assert len(rig.engine.ready) == 2


def test_a_final_status_without_a_sink_drops_the_batch_settled() -> None:
    rig = rig_with(sink=None, backoff=Backoff(final_statuses=frozenset({410})))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("gone", status=410))
    rig.deliver(1)
    rig.run()
    assert rig.acks() == [1]
    assert rig.channel.held() == 0


def test_a_final_status_whose_letters_are_not_confirmed_stops_and_starts_later(
    timers: list[Timers],
) -> None:
    sink = Sink(confirm=False)
    rig = rig_with(sink=sink, backoff=Backoff(final_statuses=frozenset({410}), max_delay=7.0))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("gone", status=410))
    rig.deliver(1, 2)
    rig.run()
    assert rig.journal == []
    assert rig.handle.stops == 1
    assert not rig.channel.active
    assert [t.interval for t in timers] == [7.0]
    assert len(rig.engine.ready) == 1


def test_a_status_that_is_not_final_is_retried() -> None:
    sink = Sink()
    rig = rig_with(sink=sink, backoff=Backoff(final_statuses=frozenset({410})))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("busy", status=503))
    rig.deliver(1)
    rig.run()
    assert sink.letters == []
    assert rig.journal == []
    assert [d for d, _ in rig.engine.later] == [1.0]


def test_a_final_status_of_a_stopped_channel_is_not_buried() -> None:
    sink = Sink()
    rig = rig_with(sink=sink, backoff=Backoff(final_statuses=frozenset({410})))
    rig.channel.start()
    rig.during_send = rig.channel.stop
    rig.failures.append(DeliveryFailed("gone", status=410))
    rig.deliver(1)
    rig.run()
    assert sink.letters == []
    assert rig.journal == []


def test_bury_final_of_a_stale_generation_does_not_run_again() -> None:
    sink = Sink()
    rig = rig_with(sink=sink)
    rig.channel.start()
    rig.deliver(2)  # queued
    gen = rig.channel._gen
    m = Msg(1, rig.journal)
    assert rig.channel._bury_final([(m, "m1")], 1, "gone", gen) is True
    assert rig.channel._bury_final([(m, "m1")], 1, "gone", gen + 1) is False
    rig.channel.stop()
    assert rig.channel._bury_final([(m, "m1")], 1, "gone", rig.channel._gen) is False


def test_bury_final_sends_only_the_delivered_items_and_acks_all_in_order() -> None:
    sink = Sink()
    rig = rig_with(sink=sink)
    rig.channel.start()
    m1, m2, m3 = (Msg(n, rig.journal) for n in (1, 2, 3))
    rig.channel._bury_final([(m1, "m1"), (m2, None), (m3, "m3")], 2, "gone", rig.channel._gen)
    assert sink.letters == [([1, 3], "final-status", 2, "gone")]
    assert rig.acks() == [1, 2, 3]


# -- the retry schedule ------------------------------------------------------------------------
def test_a_linear_schedule_adds_the_initial_delay_and_is_capped() -> None:
    b = Backoff(max_attempts=10, initial_delay=1.5, linear=True, max_delay=4.0)
    assert [b.delay(n) for n in (1, 2, 3)] == [1.5, 3.0, 4.0]
    assert isinstance(Backoff(initial_delay=2, linear=True).delay(1), float)


def test_retry_after_is_honoured_up_to_its_bound_and_only_when_asked() -> None:
    b = Backoff(initial_delay=1.0, retry_after_max=30.0)
    assert b.delay(1, 12.0) == 12.0
    assert b.delay(1, 90.0) == 30.0
    assert b.delay(1, -5.0) == 0.0
    assert b.delay(2, None) == 2.0
    assert isinstance(Backoff(retry_after_max=30).delay(1, 3), float)
    assert Backoff(initial_delay=1.0).delay(1, 12.0) == 1.0
    assert Backoff().retry_after_max is None
    assert not Backoff().linear


def test_final_statuses_are_none_by_default_and_need_a_status() -> None:
    assert not Backoff().is_final(410)
    b = Backoff(final_statuses=frozenset({410}))
    assert b.is_final(410)
    assert not b.is_final(None)
    assert not b.is_final(500)


def test_a_retry_after_sets_the_next_attempt() -> None:
    rig = Rig(backoff=Backoff(initial_delay=1.0, retry_after_max=60.0))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("busy", answered=True, status=503, retry_after=20.0))
    rig.deliver(1)
    rig.run()
    assert [d for d, _ in rig.engine.later] == [20.0]


def test_a_channels_own_schedule_wins_over_the_engines() -> None:
    rig = Rig(backoff=Backoff(initial_delay=1.0))
    rig.channel.backoff = Backoff(initial_delay=5.0)
    assert rig.channel.schedule is rig.channel.backoff
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    rig.run()
    assert [d for d, _ in rig.engine.later] == [5.0]


# -- attempts kept for operators -----------------------------------------------------------------
def test_each_attempt_is_kept_with_its_outcome() -> None:
    rig = Rig(ordered=True, drop=lambda n: n == 2)
    rig.channel.start()
    assert rig.channel.status().attempts == ()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2, 3)
    before = time.time()
    rig.run()
    rig.run()
    after = time.time()
    failed, ok = rig.channel.status().attempts
    assert failed == DeliveryAttempt(at=failed.at, ok=False, messages=2, error="down")
    assert ok == DeliveryAttempt(at=ok.at, ok=True, messages=2, error=None, deferred=False)
    assert before <= failed.at <= ok.at <= after
    assert not failed.deferred


def test_an_attempt_deferred_by_an_open_circuit_is_marked_so() -> None:
    rig = Rig(wait=3.0, destination="http://c:1")
    rig.channel.start()
    rig.deliver(1)
    rig.run(Lane("http://c:1"))
    (attempt,) = rig.channel.status().attempts
    assert (attempt.ok, attempt.deferred, attempt.messages) == (False, True, 1)
    assert attempt.error == "http://c:1 did not answer; circuit open for 3.0s"


def test_a_batch_of_only_filtered_messages_is_no_attempt() -> None:
    rig = Rig(drop=lambda n: True)
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert rig.channel.status().attempts == ()
    assert rig.channel._attempts is None


def test_only_the_last_attempts_are_kept() -> None:
    rig = Rig(batch_size=1)
    rig.channel.start()
    for n in range(ATTEMPTS_KEPT + 3):
        rig.deliver(n)
        rig.run()
    attempts = rig.channel.status().attempts
    assert len(attempts) == ATTEMPTS_KEPT == 20
    assert all(a.ok and a.messages == 1 for a in attempts)
    assert attempts[0].at <= attempts[-1].at


def test_a_delivery_attempt_defaults_to_no_error_and_not_deferred() -> None:
    a = DeliveryAttempt(at=1.0, ok=True, messages=3)
    assert (a.error, a.deferred) == (None, False)


# -- filter shares (PrepareLater) ----------------------------------------------------------------
def test_prepare_later_puts_the_batch_back_in_order_and_runs_again_after_the_delay() -> None:
    rig = Rig(batch_size=2)
    calls: list[list[int]] = []

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        calls.append([m.n for m in batch])  # type: ignore[attr-defined]
        if len(calls) == 1:
            raise PrepareLater(2.5)
        return [f"m{m.n}" for m in batch]  # type: ignore[attr-defined]

    rig.channel.prepare = prepare
    rig.channel.start()
    gen = rig.channel._gen
    rig.deliver(1, 2, 3)
    rig.run()
    assert rig.journal == []
    assert rig.engine.later == [(2.5, gen)]
    assert rig.channel.held() == 3
    assert [m.n for m in rig.channel.held_messages(10)] == [1, 2, 3]  # type: ignore[attr-defined]
    assert rig.channel.failures == 0
    assert rig.channel.status().attempts == ()
    assert not rig.channel._running
    assert len(rig.engine.ready) == 1
    rig.run()
    assert rig.sent == [["m1", "m2"]]
    assert calls[1] == [1, 2]


def test_prepare_later_of_the_whole_queue_creates_it_again() -> None:
    rig = Rig()
    rig.channel.prepare = lambda batch: (_ for _ in ()).throw(PrepareLater(1.0))
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert rig.channel.held() == 1


def test_prepare_later_during_a_rerun_request_clears_it() -> None:
    rig = Rig()
    rig.channel.start()
    gen = rig.channel._gen

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        rig.channel._run(gen)  # another worker: finds the channel busy
        raise PrepareLater(1.0)

    rig.channel.prepare = prepare
    rig.deliver(1)
    rig.run()
    assert not rig.channel._rerun
    assert rig.engine.later == [(1.0, gen)]
    assert rig.engine.ready == [gen]


def test_prepare_later_of_a_stale_generation_requeues_unless_parking() -> None:
    rig = rig_with(Budget())
    rig.channel.start()
    old = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    msgs = [Msg(1, rig.journal), Msg(2, rig.journal)]
    rig.channel._put_back(old, list(msgs), 1.0)
    assert rig.journal == [("nack", 1, True), ("nack", 2, True)]
    assert rig.engine.later == []
    assert rig.channel.held() == 0
    rig.channel._parking = True
    rig.channel._put_back(old, [Msg(3, rig.journal)], 1.0)
    assert len(rig.journal) == 2


def test_prepare_later_of_one_message_of_a_failed_batch_puts_all_back() -> None:
    rig = Rig()

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        if len(batch) > 1:
            raise ValueError("batch")
        raise PrepareLater(3.0)

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert rig.journal == []
    assert rig.channel.held() == 2
    assert [d for d, _ in rig.engine.later] == [3.0]


def test_prepare_later_says_when() -> None:
    later = PrepareLater(0.25)
    assert later.delay == 0.25
    assert str(later) == "prepare again in 0.25s"


# -- what operators peek at ----------------------------------------------------------------------
def test_held_messages_are_the_pending_items_then_the_queue_up_to_the_limit() -> None:
    rig = Rig(batch_size=3, ordered=True, drop=lambda n: n == 2)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2, 3, 4, 5)
    rig.run()  # pending: 1, (2 filtered), 3; queued: 4, 5
    assert [m.n for m in rig.channel.held_messages(10)] == [1, 3, 4, 5]  # type: ignore[attr-defined]
    assert [m.n for m in rig.channel.held_messages(3)] == [1, 3, 4]  # type: ignore[attr-defined]
    assert [m.n for m in rig.channel.held_messages(1)] == [1]  # type: ignore[attr-defined]
    assert rig.channel.held_messages(0) == []
    assert rig.channel.held() == 5
    assert rig.channel.status().held == 5


def test_a_new_channel_holds_nothing_and_is_idle() -> None:
    rig = Rig()
    st = rig.channel.status()
    assert (st.active, st.held, st.attempts, st.delivered) == (False, 0, (), 0)
    assert rig.channel.held_messages(5) == []
    assert rig.channel.group == ""
    assert rig.channel.bounded is True
    assert rig.channel.dead_letter is None
    assert rig.channel.backoff is None


def test_a_channel_made_with_a_group_and_unbounded_keeps_them() -> None:
    rig = Rig()
    ch: Channel[str] = Channel(
        rig.engine,
        "s",
        rig.handle,
        rig.prepare,
        rig.send,
        rig.ended.append,
        4,
        group="g",
        bounded=False,
    )
    assert (ch.group, ch.bounded, ch.batch_size, ch.name) == ("g", False, 4, "s")


def test_a_message_arriving_while_the_final_batch_is_buried_is_run() -> None:
    """The channel stays scheduled while a final batch is buried (nothing runs meanwhile):
    a message that comes during the sink's call does not schedule a run itself, so the
    burial does."""
    rig = rig_with(backoff=Backoff(final_statuses=frozenset({410})))
    gen_box: list[int] = []

    def sink(messages: Sequence[Received], reason: str, attempts: int, error: str | None) -> bool:
        rig.deliver(2)
        gen_box.append(len(rig.engine.ready))
        return True

    rig.channel.dead_letter = sink
    rig.channel.start()
    gen = rig.channel._gen
    rig.failures.append(DeliveryFailed("gone", status=410))
    rig.deliver(1)
    rig.run()
    assert gen_box == [1]  # the new message did not schedule a run
    assert rig.engine.ready == [gen, gen]
    rig.run()
    assert rig.sent[-1] == ["m2"]
    assert rig.acks() == [1, 2]


def test_a_message_settled_after_its_charge_was_forgotten_releases_nothing() -> None:
    budget = Budget()
    rig = rig_with(budget)
    rig.channel.start()
    rig.during_send = rig.channel.stop
    rig.deliver(1, 2)
    rig.run()
    assert rig.acks() == [1, 2]
    assert budget.released == [("owner", size(1) + size(2))]  # by the stop, once


def test_delivery_attempts_are_frozen_and_have_no_instance_dict() -> None:
    a = DeliveryAttempt(at=1.0, ok=False, messages=1, error="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.ok = True  # type: ignore[misc]
    assert not hasattr(a, "__dict__")


def test_a_handle_that_cannot_stop_after_unconfirmed_letters_is_logged_with_its_stack(
    timers: list[Timers], caplog: pytest.LogCaptureFixture
) -> None:
    rig = rig_with(sink=Sink(confirm=False), backoff=Backoff(max_attempts=1))

    def boom() -> None:
        raise RuntimeError("gone")

    rig.channel.start()
    rig.handle.stop = boom  # type: ignore[method-assign]
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1)
    with caplog.at_level(logging.DEBUG, logger="wsnmom.core.delivery"):
        rig.run()
    failed = [r for r in caplog.records if r.getMessage() == "stopping the handle failed"]
    assert len(failed) == 1 and failed[0].exc_info
    assert len(timers) == 1
    assert rig.ended == []
