"""core.channel driven step by step across stops, restarts and concurrent runs: which
generation a run belongs to and what a stale one may still do, a batch sent or failed while
the channel stops, what arrives while a batch is prepared, and an unexpected exception (a
bug) that never wedges the channel.

Like test_channel_mutants.py (whose recording engine and rig, tests/support/channel_rig.py,
these tests share) they kill the mutants of ``core/channel.py`` (``make mutation``); they
need no conftest fixture, so the mutation run can start them without the repository's
plugins.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from wsnmom.core.adapter import Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel_signals import EndSubscription, PrepareLater
from wsnmom.core.lanes import Lane
from wsnmom.core.ports import DeliveryFailed

from tests.support.channel_rig import Rig
from tests.support.handles import Handle


# -- stop, restart and concurrent runs -----------------------------------------------------
def test_a_batch_sent_while_the_channel_stops_is_acked_but_not_kept() -> None:
    rig = Rig()
    rig.channel.start()
    rig.during_send = rig.channel.stop
    rig.deliver(1, 2)
    rig.run()
    assert rig.acks() == [1, 2]
    assert rig.channel.held() == 0
    assert rig.engine.later == []
    assert len(rig.engine.ready) == 1  # a stopped channel is not run again


def test_a_failed_batch_of_a_stopped_channel_is_not_retried_and_not_settled() -> None:
    rig = Rig()
    rig.channel.start()
    rig.during_send = rig.channel.stop
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1, 2)
    rig.run()
    assert rig.journal == []
    assert rig.engine.later == []
    assert rig.channel.failures == 0
    assert rig.channel.held() == 0
    assert rig.channel.status().last_error == "x"


def test_a_restart_during_send_drops_the_old_batch_and_runs_the_new_messages() -> None:
    rig = Rig()
    rig.channel.start()

    def restart() -> None:
        rig.during_send = None
        rig.channel.stop()
        rig.channel.start()
        rig.deliver(5)

    rig.during_send = restart
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1)
    rig.run()
    assert rig.engine.later == []
    assert rig.channel.held() == 1
    assert rig.engine.ready[-1] == rig.channel._gen
    rig.run()
    assert rig.sent[-1] == ["m5"]
    assert rig.acks() == [5]


def test_stop_while_idle_forgets_the_pending_batch() -> None:
    rig = Rig()
    rig.channel.start()
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1)
    rig.run()
    assert rig.channel.held() == 1
    rig.channel.stop()
    assert rig.channel.held() == 0
    rig.channel.start()
    st = rig.channel.status()
    assert (st.failures, st.retry_at) == (0, None)


def test_stop_while_running_keeps_the_batch_until_the_run_ends() -> None:
    rig = Rig()
    rig.channel.start()
    held: list[int] = []

    def stop_and_look() -> None:
        rig.channel.stop()
        held.append(len(rig.channel._pending))

    rig.during_send = stop_and_look
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1)
    rig.run()
    assert held == [1]
    assert rig.channel.held() == 0


def test_a_second_run_while_one_is_running_reruns_afterwards() -> None:
    rig = Rig()
    rig.channel.start()
    gen = rig.channel._gen

    def nested() -> None:
        rig.during_send = None
        rig.channel._run(gen)  # another worker: must not send concurrently

    rig.during_send = nested
    rig.deliver(1)
    rig.run()
    assert rig.sent == [["m1"]]
    assert rig.engine.ready == [gen, gen]
    assert not rig.channel._rerun
    rig.run()
    assert rig.sent == [["m1"]]
    assert rig.engine.ready == [gen, gen]


# -- generations ---------------------------------------------------------------------------
def test_every_stop_moves_to_a_new_generation() -> None:
    rig = Rig()
    rig.channel.start()
    rig.channel.stop()
    rig.channel.start()
    second = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    assert rig.channel._gen > second
    rig.deliver(1)
    rig.channel._run(second)  # a timer of an earlier start
    assert rig.sent == []


def test_a_run_of_an_old_generation_sends_nothing_while_the_channel_runs() -> None:
    rig = Rig()
    rig.channel.start()
    old = rig.channel._gen
    rig.channel.stop()
    rig.channel.start()
    rig.deliver(1)
    rig.channel._run(old)
    assert rig.sent == []
    rig.run()
    assert rig.sent == [["m1"]]


def test_prepare_must_give_one_verdict_per_message() -> None:
    rig = Rig()
    rig.channel.prepare = lambda batch: ["only one"]
    rig.channel.start()
    rig.deliver(1, 2)
    with pytest.raises(ValueError):
        rig.run()
    assert not rig.channel._running


def test_delivered_accumulates_over_batches() -> None:
    rig = Rig(batch_size=2)
    rig.channel.start()
    rig.deliver(1, 2, 3)
    rig.run()
    rig.run()
    assert rig.channel.status().delivered == 3


def test_no_retry_time_before_start_and_after_stop() -> None:
    rig = Rig()
    assert rig.channel.status().retry_at is None
    assert rig.channel.status().failures == 0
    rig.channel.start()
    rig.failures.append(DeliveryFailed("x"))
    rig.deliver(1)
    rig.run()
    assert rig.channel.status().retry_at is not None
    rig.channel.stop()
    assert rig.channel.status().retry_at is None


def test_a_drained_run_does_not_schedule_itself_again() -> None:
    rig = Rig()
    rig.channel.start()
    rig.deliver(1)
    rig.run()
    assert len(rig.engine.ready) == 1
    assert not rig.channel._scheduled


def test_the_status_records_have_no_instance_dict() -> None:
    rig = Rig()
    assert not hasattr(rig.channel.status(), "__dict__")
    assert not hasattr(Backoff(), "__dict__")


def test_a_run_asked_for_during_a_restart_runs_after_the_old_batch() -> None:
    """Restarted while sending: the new generation's worker finds the channel busy; when
    the old batch is done, the channel is scheduled again for the new messages."""
    rig = Rig()
    rig.channel.start()

    def restart() -> None:
        rig.during_send = None
        rig.channel.stop()
        rig.channel.start()
        rig.deliver(5)
        rig.channel._run(rig.channel._gen)  # the new generation's worker: busy, returns

    rig.during_send = restart
    rig.deliver(1)
    rig.run()
    readies = list(rig.engine.ready)
    assert readies[-2:] == [rig.channel._gen, rig.channel._gen]
    rig.run()
    assert rig.sent[-1] == ["m5"]
    assert rig.acks() == [1, 5]


def test_retry_timers_of_a_given_up_channel_stay_stale_after_a_restart() -> None:
    rig = Rig(backoff=Backoff(max_attempts=2, initial_delay=1.0, give_up="end"))
    rig.channel.start()
    rig.failures += [DeliveryFailed("x"), DeliveryFailed("x")]
    rig.deliver(1)
    rig.run()
    (_, timer_gen), *_ = rig.engine.later
    rig.run()  # the retry fails too: given up
    assert len(rig.ended) == 1
    rig.channel.start()
    rig.deliver(2)
    rig.channel._run(timer_gen)  # the first attempt's retry timer fires late
    assert rig.sent == [["m1"], ["m1"]]


def test_a_failed_attempt_is_logged_at_info_a_deferred_one_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="wsnmom.core.delivery"):
        rig = Rig()
        rig.channel.start()
        rig.failures.append(DeliveryFailed("refused"))
        rig.deliver(1)
        rig.run()
        open_circuit = Rig(wait=3.0, destination="http://c:1")
        open_circuit.channel.start()
        open_circuit.deliver(1)
        open_circuit.run(Lane("http://c:1"))
    levels = [r.levelno for r in caplog.records if "delivery failed" in r.getMessage()]
    assert levels == [logging.INFO, logging.DEBUG]


# -- an unexpected exception (a bug) never wedges the channel ------------------------------
def test_a_trace_that_raises_is_a_failed_attempt_retried_later() -> None:
    calls: list[str] = []

    def trace(item: str) -> str | None:
        calls.append(item)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return None

    rig = Rig(ordered=True, trace=trace)
    rig.channel.start()
    rig.deliver(1)
    rig.run()  # before: raised, and the channel stayed scheduled for ever
    assert rig.sent == [] and rig.acks() == []
    assert [gen for _, gen in rig.engine.later] == [rig.channel._gen]
    assert "unexpected error" in (rig.channel.status().last_error or "")
    rig.run()  # the retry timer
    assert rig.sent == [["m1"]] and rig.acks() == [1]
    rig.deliver(2)
    rig.run()
    assert rig.sent == [["m1"], ["m2"]] and rig.acks() == [1, 2]


def test_a_dead_letter_sink_that_raises_leaves_the_channel_running() -> None:
    rig = Rig(
        ordered=True,
        backoff=Backoff(max_attempts=3, initial_delay=1.0, final_statuses=frozenset({410})),
    )
    rig.failures = [DeliveryFailed("gone", answered=True, status=410)]

    def bury(messages: Sequence[Received], reason: str, attempts: int, error: Any) -> bool:
        raise RuntimeError("dead letters unreachable")

    rig.channel.dead_letter = bury
    rig.channel.start()
    rig.deliver(1)
    rig.run()  # before: raised, and the channel stayed scheduled for ever
    assert [gen for _, gen in rig.engine.later] == [rig.channel._gen]
    rig.run()  # the timer's run: nothing left, the channel waits for messages
    ready = len(rig.engine.ready)
    rig.deliver(2)
    assert len(rig.engine.ready) == ready + 1
    rig.run()
    assert rig.sent == [["m1"], ["m2"]] and rig.acks() == [2]


def test_a_channel_opened_while_the_engine_closes_never_starts() -> None:
    """A SIGTERM while the cluster thread opens a gained shard's deliveries: what it opens
    after the engine began closing is closed at once, so the handle is never started
    (nothing consumes after the shards were handed back)."""
    from wsnmom.core.delivery import DeliveryEngine

    engine = DeliveryEngine(workers=1)
    before = Handle("before")
    engine.open_channel("a", before, lambda b: list(b), lambda b: None, lambda e: None).start()
    engine.close()
    after = Handle("after")
    channel = engine.open_channel("b", after, lambda b: list(b), lambda b: None, lambda e: None)
    channel.start()
    assert before.starts and before.stops == 1
    assert after.starts == [] and not channel.active
    assert engine.channel("b") is None


# -- what arrives while a batch is prepared ------------------------------------------------
def test_what_arrives_while_a_batch_is_prepared_joins_its_post() -> None:
    rig = Rig(batch_size=10)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.during_prepare = lambda: rig.deliver(3, 4, 5)
    rig.run()
    assert rig.sent == [["m1", "m2", "m3", "m4", "m5"]]
    assert rig.prepared == [[1, 2], [3, 4, 5]]
    assert rig.acks() == [1, 2, 3, 4, 5]
    assert rig.channel.held() == 0
    assert rig.engine.ready == [rig.channel._gen]  # scheduled once, not run again


def test_arrivals_join_only_up_to_the_batch_size() -> None:
    rig = Rig(batch_size=3)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.during_prepare = lambda: rig.deliver(3, 4, 5)
    rig.run()
    assert rig.sent == [["m1", "m2", "m3"]]
    assert rig.channel.held() == 2
    rig.run()
    assert rig.sent[1] == ["m4", "m5"]
    assert rig.acks() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("error", [PrepareLater(0.5), EndSubscription("over budget", "filter")])
def test_arrivals_prepare_refuses_go_back_to_the_head_of_the_queue(error: Exception) -> None:
    rig = Rig(batch_size=10)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.during_prepare = lambda: rig.deliver(3, 4)
    rig.refuse = (3, error)
    rig.run()
    assert rig.sent == [["m1", "m2"]]
    assert rig.acks() == [1, 2]
    assert [m.n for m in rig.channel.held_messages(10)] == [3, 4]  # type: ignore[attr-defined]
    assert len(rig.engine.ready) == 2  # run again for them
    rig.run()
    assert rig.sent[1] == ["m3", "m4"]
    assert rig.acks() == [1, 2, 3, 4]


def test_arrivals_after_a_stop_are_not_joined() -> None:
    rig = Rig(batch_size=10)
    rig.channel.start()
    rig.deliver(1, 2)
    gen = rig.channel._gen

    def arrive_then_stop() -> None:
        rig.deliver(3)
        rig.channel.stop()

    rig.during_prepare = arrive_then_stop
    rig.channel._run(gen)
    assert rig.prepared == [[1, 2]]
    assert 3 not in rig.acks()
