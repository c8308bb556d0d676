"""core.pull_buffer driven step by step: what a push-only pull point buffers, hands out and
settles, in which order, with feeds, suspension and stop.

These tests kill the mutants of ``core/pull_buffer.py`` (``make mutation``); they need no
conftest fixture.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from wsnmom.core.adapter import Received
from wsnmom.core.pull_buffer import Fed, PullBuffer

from tests.support.handles import Handle, Msg

Journal = list[tuple[Any, ...]]


def ns(items: list[Received]) -> list[int]:
    return [getattr(m, "received", m).n for m in items]  # type: ignore[attr-defined]


def keep_odd(received: Received) -> str | None:
    n: int = received.n  # type: ignore[attr-defined]
    return f"f{n}" if n % 2 else None


def started(prefetch: int = 5) -> tuple[PullBuffer, Handle, Journal]:
    handle = Handle("pp")
    buf = PullBuffer(handle, prefetch)
    buf.start()
    return buf, handle, []


def test_start_is_idempotent_and_uses_the_prefetch() -> None:
    buf, handle, _ = started(prefetch=9)
    buf.start()
    assert handle.starts == [9]
    assert buf.name == "pp"
    assert buf.prefetch == 9


def test_messages_are_handed_out_oldest_first_and_settled_by_take() -> None:
    buf, handle, journal = started()
    handle.push(Msg(1, journal), Msg(2, journal), Msg(3, journal))
    assert buf.buffered() == 3
    got = buf.take(2)
    assert ns(got) == [1, 2]
    assert journal == [("ack", 1), ("ack", 2)]
    assert buf.buffered() == 1
    assert ns(buf.take(5)) == [3]
    assert buf.take(5) == []


def test_pull_leaves_settling_to_the_caller() -> None:
    buf, handle, journal = started()
    handle.push(Msg(1, journal), Msg(2, journal))
    got = buf.pull(1)
    assert ns(got) == [1]
    assert journal == []
    assert ns(buf.pull(10)) == [2]


def test_pull_waits_for_the_first_message_up_to_the_timeout() -> None:
    buf, handle, journal = started()
    assert buf.pull(1, timeout=0.05) == []
    timer = threading.Timer(0.05, handle.push, (Msg(7, journal),))
    timer.start()
    assert ns(buf.pull(1, timeout=30.0)) == [7]
    timer.join()


def test_pull_starts_a_buffer_that_was_not_started() -> None:
    handle = Handle("pp")
    buf = PullBuffer(handle, 3)
    assert handle.starts == []
    assert buf.pull(1) == []
    assert handle.starts == [3]


def test_stop_gives_everything_back_and_late_messages_are_requeued() -> None:
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    handle.push(Msg(1, journal))
    feed.push(Msg(3, journal), Msg(4, journal))
    buf.stop()
    buf.stop()
    assert (handle.stops, feed.stops) == (1, 1)
    assert buf.buffered() == 0
    assert journal == []  # the handles' stop gives them back
    handle.push(Msg(4, journal))
    assert journal == [("nack", 4, True)]
    # a restart starts the handle and the active feed again, with nothing left over
    buf.start()
    assert (handle.starts, feed.starts) == ([5, 5], [5, 5])
    feed.push(Msg(6, journal))
    assert journal == [("nack", 4, True), ("ack", 6)]  # no stale waiting count
    feed.push(Msg(7, journal))
    assert ns(buf.take(5)) == [7]


def test_stop_of_a_buffer_never_started_does_nothing() -> None:
    handle = Handle("pp")
    PullBuffer(handle, 3).stop()
    assert handle.stops == 0


def test_depth_adds_what_the_middleware_holds_back() -> None:
    buf, handle, journal = started()
    handle.held = 4
    handle.push(Msg(1, journal))
    assert buf.depth() == 5
    handle.held = None
    assert buf.depth() is None


# -- feeds -----------------------------------------------------------------------------
def test_feed_messages_arrive_prepared_in_order_with_the_pull_points_own() -> None:
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    assert feed.starts == [5]
    handle.push(Msg(10, journal))
    fed = Msg(1, journal)
    fed.headers = {"k": "v"}
    fed.content_type = "text/plain"
    fed.redelivered = True
    fed.timestamp = datetime(2026, 1, 2, tzinfo=UTC)
    feed.push(fed)
    got = buf.take(5)
    assert ns(got) == [10, 1]
    assert isinstance(got[1], Fed) and got[1].message == "f1"
    assert got[1].feed is buf._feeds["s1"]
    assert (got[1].topic, got[1].body) == (got[1].received.topic, b"1")
    assert (got[1].headers, got[1].content_type) == ({"k": "v"}, "text/plain")
    assert got[1].redelivered is True
    assert got[1].timestamp == datetime(2026, 1, 2, tzinfo=UTC)
    assert journal == [("ack", 10), ("ack", 1)]


def test_fed_settles_the_middlewares_message() -> None:
    journal: Journal = []
    buf, _, _ = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(3, journal))
    a, b = buf.pull(2)
    assert isinstance(a, Fed)
    a.nack(requeue=False)
    b.nack()
    assert journal == [("nack", 1, False), ("nack", 3, True)]


def test_a_filtered_feed_message_with_nothing_before_it_is_settled_at_once() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(2, journal))
    assert journal == [("ack", 2)]
    assert buf.buffered() == 0
    assert len(buf._queue) == 0


def test_a_filtered_feed_message_waits_behind_its_feeds_earlier_messages() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(2, journal), Msg(3, journal))
    assert journal == []
    assert buf.buffered() == 2  # the filtered one is not counted
    got = buf.take(1)
    assert ns(got) == [1]
    assert journal == [("ack", 1)]
    # the filtered message is settled when reached, in its place, and never handed out
    got = buf.take(1)
    assert ns(got) == [3]
    assert journal == [("ack", 1), ("ack", 2), ("ack", 3)]
    assert buf.buffered() == 0
    assert buf._feeds["s1"].waiting == 0


def test_pull_settles_a_filtered_message_met_on_the_way() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(2, journal), Msg(3, journal))
    assert ns(buf.pull(1)) == [1]
    assert journal == []
    assert ns(buf.pull(5)) == [3]
    assert journal == [("ack", 2)]


def test_only_filtered_messages_waiting_is_an_empty_buffer() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(2, journal))
    assert ns(buf.pull(1)) == [1]
    assert buf.buffered() == 0
    assert buf.pull(1, timeout=0.01) == []
    assert buf.take(1) == []


def test_max_messages_counts_handed_out_messages_not_filtered_ones() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(2, journal), Msg(4, journal), Msg(5, journal))
    assert ns(buf.take(1)) == [1]
    assert ns(buf.take(1)) == [5]
    assert journal == [("ack", 1), ("ack", 2), ("ack", 4), ("ack", 5)]


def test_an_inactive_feed_is_not_started_and_its_messages_are_ignored() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=False)
    assert feed.starts == []
    assert buf.feeds(active=False) == [feed]
    assert buf.feeds(active=True) == []
    buf._fed("s1", buf._feeds["s1"], Msg(1, journal))
    assert buf.buffered() == 0
    assert journal == []  # left to the handle's stop, to keep the order


def test_a_feed_added_before_start_starts_with_the_buffer() -> None:
    handle = Handle("pp")
    buf = PullBuffer(handle, 4)
    feed, idle = Handle("f"), Handle("g")
    buf.add_feed("s1", feed, keep_odd, active=True)
    buf.add_feed("s2", idle, keep_odd, active=False)
    assert feed.starts == []
    buf.start()
    assert (feed.starts, idle.starts) == ([4], [])


def test_suspend_takes_the_feeds_waiting_messages_out_in_order() -> None:
    buf, handle, journal = started()
    feed, other = Handle("f"), Handle("g")
    buf.add_feed("s1", feed, keep_odd, active=True)
    buf.add_feed("s2", other, keep_odd, active=True)
    feed.push(Msg(1, journal))
    handle.push(Msg(10, journal))
    other.push(Msg(21, journal))
    feed.push(Msg(2, journal), Msg(3, journal))
    mine = buf.suspend_feed("s1")
    assert ns(mine) == [1, 2, 3]  # type: ignore[arg-type]
    assert [m.message for m in mine] == ["f1", None, "f3"]
    assert journal == []  # the caller settles them
    assert buf.buffered() == 2
    assert buf._skips == 0
    assert ns(buf.take(5)) == [10, 21]
    assert buf.feeds(active=False) == [feed]
    feed_state = buf._feeds["s1"]
    assert feed_state.waiting == 0
    # delivered while suspended: ignored
    feed.push(Msg(5, journal))
    assert buf.buffered() == 0
    # suspended twice, or unknown: nothing
    assert buf.suspend_feed("s1") == []
    assert buf.suspend_feed("nope") == []


def test_suspend_of_a_feed_with_nothing_waiting_keeps_the_others() -> None:
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    handle.push(Msg(10, journal))
    assert buf.suspend_feed("s1") == []
    assert ns(buf.take(5)) == [10]


def test_resume_starts_the_feed_again() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    buf.suspend_feed("s1")
    buf.resume_feed("s1")
    buf.resume_feed("s1")  # already active: not started twice
    buf.resume_feed("nope")
    assert feed.starts == [5, 5]
    feed.push(Msg(7, journal))
    assert ns(buf.take(5)) == [7]


def test_resume_of_a_stopped_buffer_starts_the_feed_with_the_buffer() -> None:
    handle = Handle("pp")
    buf = PullBuffer(handle, 2)
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=False)
    buf.resume_feed("s1")
    assert feed.starts == []
    assert buf.feeds(active=True) == [feed]
    buf.start()
    assert feed.starts == [2]


def test_remove_feed_returns_its_messages_and_forgets_it() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    arrived = feed.on_message
    feed.push(Msg(1, journal))
    assert ns(buf.remove_feed("s1")) == [1]  # type: ignore[arg-type]
    assert buf.feeds(active=True) == [] and buf.feeds(active=False) == []
    assert arrived is not None
    arrived(Msg(3, journal))  # a late delivery of the removed feed
    assert buf.buffered() == 0
    assert buf.remove_feed("s1") == []


def test_a_replaced_feed_ignores_the_old_handles_messages() -> None:
    buf, _, journal = started()
    old, new = Handle("old"), Handle("new")
    buf.add_feed("s1", old, keep_odd, active=True)
    old_arrived = old.on_message
    buf.add_feed("s1", new, keep_odd, active=True)
    assert old_arrived is not None
    old_arrived(Msg(1, journal))
    new.push(Msg(3, journal))
    assert ns(buf.take(5)) == [3]


def test_a_waiting_pull_wakes_for_a_feed_message() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    timer = threading.Timer(0.05, feed.push, (Msg(2, journal), Msg(3, journal)))
    timer.start()
    assert ns(buf.pull(1, timeout=30.0)) == [3]
    timer.join()


@pytest.mark.parametrize("method", ["pull", "take"])
def test_nothing_to_hand_out_returns_at_once(method: str) -> None:
    buf, _, _ = started()
    assert getattr(buf, method)(3) == []


class ArrivesWhileWaiting(threading.Condition):
    """The buffer's condition: the first ``wait`` runs ``arrive`` (as if a message came
    while the puller waited) and every wait is recorded; no real time passes."""

    def __init__(self, arrive: Any = None) -> None:
        super().__init__()
        self.arrive = arrive
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if self.arrive is not None:
            arrive, self.arrive = self.arrive, None
            arrive()
        return super().wait(0)


def test_a_short_timeout_still_waits_for_the_first_message() -> None:
    buf, handle, journal = started()
    cv = ArrivesWhileWaiting(lambda: handle.push(Msg(1, journal)))
    buf._cv = cv
    assert ns(buf.pull(1, timeout=0.5)) == [1]
    assert len(cv.waits) == 1


@pytest.mark.parametrize("method", ["pull", "take"])
def test_without_a_timeout_nothing_waits(method: str) -> None:
    buf, _, _ = started()
    cv = ArrivesWhileWaiting()
    buf._cv = cv
    assert getattr(buf, method)(1) == []
    assert cv.waits == []


def test_every_filtered_message_waiting_is_left_out_of_the_count() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(1, journal), Msg(2, journal), Msg(4, journal))
    assert buf.buffered() == 1
    assert ns(buf.take(5)) == [1]
    assert buf.buffered() == 0


def test_hand_out_settles_nothing_until_its_settlement_in_order_filtered_too() -> None:
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    handle.push(Msg(1, journal))
    feed.push(Msg(3, journal), Msg(4, journal), Msg(5, journal))
    got, settlement = buf.hand_out(3)
    assert ns(got) == [1, 3, 5]
    assert journal == []  # nothing settled before the answer was written
    assert buf.take(5) == []  # and nothing handed out twice meanwhile
    settlement.settle()
    assert journal == [("ack", 1), ("ack", 3), ("ack", 4), ("ack", 5)]
    settlement.give_back()  # settled once: nothing comes back
    assert buf.buffered() == 0


def test_an_answer_given_back_is_handed_out_first_again() -> None:
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    handle.push(Msg(1, journal))
    feed.push(Msg(3, journal), Msg(4, journal))
    got, settlement = buf.hand_out(2)
    assert ns(got) == [1, 3]
    handle.push(Msg(7, journal))
    settlement.give_back()
    settlement.settle()  # given back once: nothing settled
    assert journal == []
    assert buf.buffered() == 3
    assert ns(buf.take(10)) == [1, 3, 7]
    assert journal == [("ack", 1), ("ack", 3), ("ack", 4), ("ack", 7)]


def test_a_given_back_answer_after_a_stop_is_left_to_the_middleware() -> None:
    buf, handle, journal = started()
    handle.push(Msg(1, journal))
    _, settlement = buf.hand_out(1)
    buf.stop()
    buf.start()
    settlement.give_back()
    assert buf.buffered() == 0 and journal == []  # the stop gave it back already


def test_a_given_back_message_of_a_suspended_feed_goes_back_to_its_subscription() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(3, journal))
    _, settlement = buf.hand_out(1)
    assert buf.suspend_feed("s1") == []
    settlement.give_back()
    assert journal == [("nack", 3, True)]
    assert buf.buffered() == 0


def test_a_given_back_message_of_a_removed_feed_is_kept_in_the_pull_point_in_order() -> None:
    """Its subscription is being deleted: a nack into it would lose the messages."""
    buf, handle, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    handle.push(Msg(1, journal))
    feed.push(Msg(3, journal), Msg(4, journal), Msg(5, journal))
    _, settlement = buf.hand_out(3)
    kept: list[list[int]] = []
    assert buf.remove_feed("s1", keep_late=lambda late: kept.append(ns(late))) == []
    settlement.give_back()
    assert kept == [[3, 4, 5]]  # the filtered one too: settled in its place by the keeper
    assert journal == []
    assert ns(buf.take(5)) == [1]


def test_a_removed_feeds_given_back_messages_are_kept_after_a_stop_too() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(3, journal))
    _, settlement = buf.hand_out(1)
    kept: list[list[int]] = []
    buf.remove_feed("s1", keep_late=lambda late: kept.append(ns(late)))
    buf.stop()
    buf.start()
    settlement.give_back()
    assert kept == [[3]] and journal == []


def test_a_feed_resumed_before_the_give_back_takes_its_messages_back_first() -> None:
    buf, _, journal = started()
    feed = Handle("f")
    buf.add_feed("s1", feed, keep_odd, active=True)
    feed.push(Msg(3, journal))
    _, settlement = buf.hand_out(1)
    kept: list[list[int]] = []
    buf.suspend_feed("s1", keep_late=lambda late: kept.append(ns(late)))
    buf.resume_feed("s1")
    settlement.give_back()  # read here again: first in the buffer again
    assert kept == [] and journal == []
    assert ns(buf.take(5)) == [3]
