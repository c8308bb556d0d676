"""core.channel driven step by step: settling, acking, retry, give-up and circuit handling
of one subscription's channel, with an engine that records what the channel asks for
instead of running threads and timers (tests/support/channel_rig.py).  Its stops,
restarts, generations and concurrent runs are test_channel_restart_mutants.py.

These tests kill the mutants of ``core/channel.py`` (``make mutation``); they need no
conftest fixture, so the mutation run can start them without the repository's plugins.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
from wsnmom.core import metrics
from wsnmom.core.adapter import Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.channel_state import settle
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.log_context import current_request_id
from wsnmom.core.ports import DeliveryFailed

from tests.support.channel_rig import BrokenMsg, Engine, Rig, counter
from tests.support.handles import Handle, Msg


# -- Backoff -------------------------------------------------------------------------------
def test_backoff_grows_by_the_multiplier_and_is_capped() -> None:
    b = Backoff(max_attempts=6, initial_delay=0.5, multiplier=3.0, max_delay=10.0)
    assert [b.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 10.0]
    assert isinstance(b.delay(1), float)


def test_backoff_at_and_after_max_attempts_is_the_max_delay() -> None:
    b = Backoff(max_attempts=3, initial_delay=1.0, multiplier=2.0, max_delay=50.0)
    assert b.delay(2) == 2.0
    assert b.delay(3) == 50.0
    assert b.delay(4) == 50.0


def test_backoff_defaults() -> None:
    b = Backoff()
    assert (b.max_attempts, b.initial_delay, b.multiplier, b.max_delay, b.give_up) == (
        8,
        1.0,
        2.0,
        300.0,
        "end",
    )


# -- settling ------------------------------------------------------------------------------
def test_settle_acks_or_requeues_and_survives_a_gone_handle() -> None:
    journal: list[tuple[Any, ...]] = []
    settle(Msg(1, journal), ack=True)
    settle(Msg(2, journal), ack=False)
    assert journal == [("ack", 1), ("nack", 2, True)]
    settle(BrokenMsg(3, journal), ack=True)
    settle(BrokenMsg(4, journal), ack=False)


def test_end_subscription_carries_reason_and_cause() -> None:
    end = EndSubscription("gone", "filter")
    assert (end.reason, end.cause, str(end)) == ("gone", "filter", "gone")


# -- lifecycle -----------------------------------------------------------------------------
def test_start_opens_the_handle_once_with_the_engines_prefetch() -> None:
    rig = Rig()
    assert not rig.channel.active
    rig.channel.start()
    rig.channel.start()
    assert rig.handle.starts == [7]
    assert rig.channel.active
    assert rig.channel.status().active


def test_stop_stops_the_handle_once_and_requeues_late_messages() -> None:
    rig = Rig()
    rig.channel.start()
    on_message = rig.handle.on_message
    rig.channel.stop()
    rig.channel.stop()
    assert rig.handle.stops == 1
    assert not rig.channel.active
    assert not rig.channel.status().active
    assert on_message is not None
    on_message(Msg(1, rig.journal))
    assert rig.journal == [("nack", 1, True)]
    assert rig.engine.ready == []


def test_a_message_handed_over_while_the_handle_stops_is_left_to_it() -> None:
    """A message the handle delivers while it is being stopped (a shard handed over: the
    RabbitMQ consumer got it before its channel closed) is neither queued nor settled:
    the stopping handle gives it back in its place.  A requeue would put it behind later
    messages on a RabbitMQ quorum queue, so the next deliverer would break order."""
    rig = Rig()
    rig.channel.start()
    on_message = rig.handle.on_message
    assert on_message is not None
    late = Msg(2, rig.journal)

    class Stopping(Handle):
        def stop(self) -> None:
            super().stop()
            on_message(Msg(1, rig.journal))

    stopping = Stopping()
    rig.channel.handle = stopping
    rig.channel.stop()
    assert stopping.stops == 1
    assert rig.journal == []
    assert rig.channel.held() == 0 and rig.engine.ready == []
    on_message(late)  # once stopped: requeued, as before
    assert rig.journal == [("nack", 2, True)]


def test_close_stops_and_a_closed_channel_never_starts_again() -> None:
    rig = Rig()
    rig.channel.start()
    rig.channel.close()
    assert rig.handle.stops == 1
    rig.channel.start()
    assert rig.handle.starts == [7]
    assert not rig.channel.active


def test_close_before_start_marks_inactive() -> None:
    rig = Rig()
    rig.channel.close()
    rig.channel.start()
    assert rig.handle.starts == []
    assert not rig.channel.status().active


def test_messages_are_queued_and_scheduled_once_until_run() -> None:
    rig = Rig()
    rig.channel.start()
    rig.deliver(1, 2, 3)
    assert rig.engine.ready == [rig.channel._gen]
    assert rig.channel.held() == 3
    assert rig.channel.status().held == 3
    rig.run()
    assert rig.sent == [["m1", "m2", "m3"]]
    assert rig.acks() == [1, 2, 3]
    assert rig.channel.held() == 0
    rig.deliver(4)
    assert len(rig.engine.ready) == 2


def test_a_run_of_an_old_generation_or_a_stopped_channel_does_nothing() -> None:
    rig = Rig()
    rig.channel.start()
    rig.deliver(1)
    old = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    rig.channel._run(old)
    assert rig.sent == []
    rig.deliver(2)
    rig.channel.stop()
    rig.channel._run(rig.channel._gen)
    assert rig.sent == []


# -- batches and settling ------------------------------------------------------------------
def test_batch_size_bounds_a_run_and_the_rest_is_rescheduled() -> None:
    rig = Rig(batch_size=2)
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run()
    assert rig.sent == [["m1", "m2"]]
    assert rig.acks() == [1, 2]
    assert len(rig.engine.ready) == 2
    assert rig.channel.held() == 1
    rig.run()
    assert rig.sent[-1] == ["m3"]
    assert rig.acks() == [1, 2, 3]
    assert len(rig.engine.ready) == 2  # drained: not scheduled again
    rig.deliver(4)
    assert len(rig.engine.ready) == 3  # but a new message schedules it


def test_delivery_counts_and_time_in_status() -> None:
    rig = Rig()
    rig.channel.start()
    before = time.time()
    st = rig.channel.status()
    assert (st.delivered, st.last_delivery, st.failures, st.retry_at, st.last_error) == (
        0,
        None,
        0,
        None,
        None,
    )
    rig.deliver(1, 2)
    rig.run()
    st = rig.channel.status()
    assert st.delivered == 2 == rig.channel.delivered
    assert st.last_delivery is not None and st.last_delivery >= before
    assert st.held == 0


def test_unordered_filtered_message_is_acked_at_once_even_when_delivery_fails() -> None:
    filtered = counter(metrics.NOTIFICATIONS_FILTERED)
    rig = Rig(drop=lambda n: n == 2)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2, 3)
    rig.run()
    assert rig.sent == [["m1", "m3"]]
    assert rig.acks() == [2]
    assert counter(metrics.NOTIFICATIONS_FILTERED) == filtered + 1
    rig.run()
    assert rig.acks() == [2, 1, 3]


def test_ordered_filtered_message_waits_for_the_ones_before_it() -> None:
    rig = Rig(ordered=True, drop=lambda n: n == 2)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2, 3)
    rig.run()
    assert rig.acks() == []
    assert rig.channel.held() == 3
    rig.run()
    assert rig.sent == [["m1", "m3"], ["m1", "m3"]]
    assert rig.acks() == [1, 2, 3]
    assert rig.channel.status().delivered == 2


def test_ordered_filtered_message_with_nothing_before_it_is_acked_at_once() -> None:
    rig = Rig(ordered=True, drop=lambda n: n == 1)
    rig.channel.start()
    rig.failures.append(DeliveryFailed("down"))
    rig.deliver(1, 2)
    rig.run()
    assert rig.acks() == [1]


def test_a_batch_of_only_filtered_messages_sends_nothing() -> None:
    rig = Rig(drop=lambda n: True, destination="http://c:1")
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run(Lane("http://c:1"))
    assert rig.sent == []
    assert rig.acks() == [1, 2]
    assert rig.engine.admitted == []
    assert rig.engine.reports == []
    assert rig.channel.status().delivered == 0
    assert rig.channel.status().last_delivery is None


def test_prepare_failing_on_the_batch_is_retried_message_by_message() -> None:
    rig = Rig()

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        if len(batch) > 1 or batch[0].n == 2:  # type: ignore[attr-defined]
            raise ValueError("bad message")
        return [f"m{batch[0].n}"]  # type: ignore[attr-defined]

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run()
    assert rig.sent == [["m1", "m3"]]
    assert rig.acks() == [2, 1, 3]


def test_prepare_ending_the_subscription_stops_and_hands_over() -> None:
    rig = Rig()
    end = EndSubscription("filter over budget", "filter")

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        raise end

    rig.channel.prepare = prepare
    rig.channel.start()
    gen = rig.channel._gen
    rig.deliver(1, 2)
    rig.run()
    assert rig.ended == [end]
    assert rig.handle.stops == 1
    assert rig.journal == []  # left unsettled: the subscription is being ended
    assert not rig.channel.active
    assert rig.channel._gen == gen + 1
    assert rig.channel.held() == 0
    st = rig.channel.status()
    assert st.last_error == "filter over budget"
    assert st.retry_at is None
    assert not rig.channel._running


def test_prepare_ending_one_message_of_a_failed_batch_ends_too() -> None:
    rig = Rig()
    end = EndSubscription("over budget", "filter")

    def prepare(batch: Sequence[Received]) -> Sequence[str | None]:
        if len(batch) > 1:
            raise ValueError("batch")
        raise end

    rig.channel.prepare = prepare
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert rig.ended == [end]


def test_end_of_a_stale_generation_requeues_what_it_took() -> None:
    rig = Rig()
    rig.channel.start()
    old = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    msgs = [Msg(1, rig.journal), Msg(2, rig.journal)]
    rig.channel._end(old, list(msgs), EndSubscription("x", "filter"))
    assert rig.journal == [("nack", 1, True), ("nack", 2, True)]
    assert rig.ended == []
    assert rig.channel.active


def test_end_survives_a_handle_that_cannot_stop() -> None:
    rig = Rig()

    def boom() -> None:
        raise RuntimeError("gone")

    rig.channel.start()
    rig.handle.stop = boom  # type: ignore[method-assign]
    end = EndSubscription("x", "filter")
    rig.channel._end(rig.channel._gen, [], end)
    assert rig.ended == [end]


# -- retries and give-up -------------------------------------------------------------------
def test_failure_keeps_the_batch_and_arms_the_backoff_timer() -> None:
    failures = counter(metrics.DELIVERY_FAILURES)
    rig = Rig(backoff=Backoff(max_attempts=5, initial_delay=2.0, multiplier=3.0))
    rig.channel.start()
    rig.failures.append(DeliveryFailed("503"))
    rig.deliver(1, 2)
    before = time.time()
    rig.run()
    assert rig.journal == []
    assert rig.engine.later == [(2.0, rig.channel._gen)]
    st = rig.channel.status()
    assert st.failures == 1 == rig.channel.failures
    assert st.last_error == "503"
    assert st.retry_at is not None and before + 2.0 <= st.retry_at <= time.time() + 2.0
    assert st.held == 2
    assert counter(metrics.DELIVERY_FAILURES) == failures + 1
    # later messages wait behind the pending batch
    rig.deliver(3)
    rig.failures.append(DeliveryFailed("503"))
    rig.run()
    assert rig.sent == [["m1", "m2"], ["m1", "m2"]]
    assert rig.engine.later[-1] == (6.0, rig.channel._gen)
    assert rig.channel.failures == 2
    rig.run()
    assert rig.sent[-1] == ["m1", "m2"]
    assert rig.acks() == [1, 2]
    st = rig.channel.status()
    assert (st.failures, st.retry_at, st.last_error) == (0, None, None)
    assert len(rig.engine.ready) == 2  # message 3 is waiting: run again
    rig.run()
    assert rig.sent[-1] == ["m3"]
    assert rig.acks() == [1, 2, 3]


def test_give_up_end_stops_and_ends_with_the_reason() -> None:
    rig = Rig(backoff=Backoff(max_attempts=2, initial_delay=1.0, give_up="end"))
    rig.channel.start()
    rig.failures += [DeliveryFailed("refused"), DeliveryFailed("refused again")]
    rig.deliver(1)
    rig.run()
    assert rig.ended == []
    rig.deliver(2)
    rig.run()
    assert len(rig.ended) == 1
    assert (rig.ended[0].reason, rig.ended[0].cause) == ("refused again", "delivery")
    assert rig.handle.stops == 1
    assert rig.journal == []  # unsettled: the middleware keeps them
    assert len(rig.engine.later) == 1
    assert not rig.channel.active
    assert rig.channel.held() == 0
    assert rig.channel.status().retry_at is None


def test_give_up_survives_a_handle_that_cannot_stop() -> None:
    rig = Rig(backoff=Backoff(max_attempts=1))
    rig.channel.start()

    def boom() -> None:
        raise RuntimeError("gone")

    rig.handle.stop = boom  # type: ignore[method-assign]
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1)
    rig.run()
    assert len(rig.ended) == 1


def test_give_up_keep_retries_forever_at_the_max_delay() -> None:
    rig = Rig(backoff=Backoff(max_attempts=2, initial_delay=1.0, max_delay=9.0, give_up="keep"))
    rig.channel.start()
    rig.failures += [DeliveryFailed("x")] * 4
    rig.deliver(1)
    for _ in range(4):
        rig.run()
    assert rig.ended == []
    assert [d for d, _ in rig.engine.later] == [1.0, 9.0, 9.0, 9.0]
    assert rig.channel.failures == 4
    rig.run()
    assert rig.acks() == [1]


def test_an_unexpected_send_error_is_retried_like_a_failure() -> None:
    rig = Rig(destination="http://c:1")
    rig.channel.start()
    rig.failures.append(KeyError("bug"))
    rig.deliver(1)
    rig.run(Lane("http://c:1"))
    assert rig.journal == []
    assert rig.engine.reports == [Outcome.FAILED_FAST]
    assert rig.channel.status().last_error == "KeyError: 'bug'"
    assert len(rig.engine.later) == 1


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, Outcome.ANSWERED),
        (DeliveryFailed("500", answered=True), Outcome.ANSWERED),
        (DeliveryFailed("slow", timed_out=True), Outcome.TIMED_OUT),
        (DeliveryFailed("refused"), Outcome.FAILED_FAST),
    ],
)
def test_each_attempt_is_reported_to_the_lane(
    error: DeliveryFailed | None, outcome: Outcome
) -> None:
    rig = Rig(destination="http://c:1")
    rig.channel.start()
    if error is not None:
        rig.failures.append(error)
    rig.deliver(1)
    lane = Lane("http://c:1")
    rig.run(lane)
    assert rig.engine.admitted == [lane]
    assert rig.engine.reports == [outcome]


def test_no_lane_no_admission_and_no_report() -> None:
    rig = Rig(wait=5.0)
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert rig.sent == [["m1"]]
    assert rig.engine.admitted == []
    assert rig.engine.reports == []


def test_an_open_circuit_fails_the_attempt_without_sending() -> None:
    deferred = counter(metrics.DELIVERY_DEFERRED)
    failures = counter(metrics.DELIVERY_FAILURES)
    rig = Rig(wait=4.0, destination="http://c:1")
    rig.channel.start()
    rig.deliver(1)
    rig.run(Lane("http://c:1"))
    assert rig.sent == []
    assert rig.engine.reports == []
    assert rig.journal == []
    assert rig.channel.failures == 1
    assert rig.engine.later == [(1.0, rig.channel._gen)]
    assert rig.channel.status().last_error == "http://c:1 did not answer; circuit open for 4.0s"
    assert counter(metrics.DELIVERY_DEFERRED) == deferred + 1
    assert counter(metrics.DELIVERY_FAILURES) == failures
    rig.engine.wait = None
    rig.run(Lane("http://c:1"))
    assert rig.acks() == [1]


def test_trace_names_the_first_item_of_the_batch() -> None:
    seen: list[str] = []

    def trace(item: str) -> str | None:
        seen.append(item)
        return "req-1"

    rig = Rig(trace=trace)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert seen == ["m1"]


# -- shape ---------------------------------------------------------------------------------
def test_status_and_backoff_are_frozen_and_a_channel_has_no_instance_dict() -> None:
    rig = Rig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        rig.channel.status().held = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Backoff().max_attempts = 1  # type: ignore[misc]
    assert not hasattr(rig.channel, "__dict__")


def test_a_channel_is_unordered_unless_asked() -> None:
    journal: list[tuple[Any, ...]] = []
    engine = Engine()
    handle = Handle()
    channel: Channel[str] = Channel(
        engine,
        "s",
        handle,
        lambda batch: [None if m.n == 2 else "x" for m in batch],  # type: ignore[attr-defined]
        lambda items: (_ for _ in ()).throw(DeliveryFailed("down")),
        lambda end: None,
        10,
    )
    channel.start()
    assert handle.on_message is not None
    handle.on_message(Msg(1, journal))
    handle.on_message(Msg(2, journal))
    channel._run(channel._gen)
    assert journal == [("ack", 2)]


def test_log_records_name_the_subscription(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    rig.channel.start()
    rig.failures.append(DeliveryFailed("refused"))
    rig.deliver(1)
    with caplog.at_level(logging.DEBUG, logger="wsnmom.core.delivery"):
        rig.run()
    assert any("sub-1" in r.getMessage() for r in caplog.records)


# -- what operators see in the log ---------------------------------------------------------
def test_failures_to_settle_or_stop_are_logged_with_their_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom() -> None:
        raise RuntimeError("gone")

    with caplog.at_level(logging.DEBUG, logger="wsnmom.core.delivery"):
        settle(BrokenMsg(1, []), ack=True)
        ended = Rig()
        ended.channel.start()
        ended.handle.stop = boom  # type: ignore[method-assign]
        ended.channel._end(ended.channel._gen, [], EndSubscription("x", "filter"))
        gave_up = Rig(backoff=Backoff(max_attempts=1))
        gave_up.channel.start()
        gave_up.handle.stop = boom  # type: ignore[method-assign]
        gave_up.failures.append(DeliveryFailed("x"))
        gave_up.deliver(1)
        gave_up.run()
    failed = [
        r
        for r in caplog.records
        if r.getMessage() in ("settling a message failed", "stopping the handle failed")
    ]
    assert len(failed) == 3
    assert all(r.exc_info for r in failed)


def test_a_batch_without_a_trace_is_sent_with_no_request_id() -> None:
    seen: list[str | None] = []
    rig = Rig()
    rig.during_send = lambda: seen.append(current_request_id())
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert seen == [None]
