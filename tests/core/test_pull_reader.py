"""core.pull_reader: a pull point read through the middleware's own pull — the inbox first,
then the feeds in turn; a feed that cannot be read is skipped; what a suspended feed held
is taken unsettled and can be given back; what an answer took is settled only by its
settlement, or given back first again (in-memory handles, no middleware)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import pytest
from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle
from wsnmom.core.pull_buffer import Fed
from wsnmom.core.pull_reader import PullReader
from wsnmom.topic_mapping.model import Topic

from tests.support.waiting import wait_until

TOPIC = Topic("urn:t", ("a",))


class Msg(Received):
    def __init__(self, handle: Queue, body: bytes) -> None:
        self.handle = handle
        self.topic = TOPIC
        self.body = body
        self.headers = {}
        self.content_type = "application/xml"
        self.redelivered = False

    def ack(self) -> None:
        self.handle.acked.append(self.body)

    def nack(self, requeue: bool = True) -> None:
        self.handle.nacked.append(self.body)
        if requeue:
            self.handle.ready.appendleft(self.body)


class Queue(SubscriptionHandle):
    """A queue with pull and take (no push)."""

    def __init__(self, name: str, *bodies: str, failing: bool = False) -> None:
        self.name = name
        self.ready: deque[bytes] = deque(b.encode() for b in bodies)
        self.acked: list[bytes] = []
        self.nacked: list[bytes] = []
        self.failing = failing

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        raise AssertionError("a native reader never starts a handle")

    def stop(self) -> None:
        pass

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        if self.failing:
            raise AdapterError("gone")
        out: list[Received] = []
        while self.ready and len(out) < max_messages:
            out.append(Msg(self, self.ready.popleft()))
        return out

    def take(self, max_messages: int) -> list[Received]:
        return self.pull(max_messages)

    def depth(self) -> int | None:
        return len(self.ready)

    def delete(self) -> None:
        self.ready.clear()


def keep_all(received: Received) -> object | None:
    return b"rendered " + received.body


def bodies(got: list[Received]) -> list[bytes]:
    return [r.body for r in got]


def test_the_inbox_first_then_each_feed_rendered() -> None:
    reader = PullReader(Queue("pp", "i0"), cap=10)
    reader.add_feed("s1", Queue("s1", "a0", "a1"), keep_all, active=True)
    got = reader.take(10)
    assert bodies(got) == [b"i0", b"a0", b"a1"]
    assert not isinstance(got[0], Fed)
    assert [r.message for r in got[1:] if isinstance(r, Fed)] == [b"rendered a0", b"rendered a1"]


def test_a_full_answer_starts_with_another_feed_next_time() -> None:
    reader = PullReader(Queue("pp"), cap=10)
    reader.add_feed("s1", Queue("s1", "a0", "a1", "a2"), keep_all, active=True)
    reader.add_feed("s2", Queue("s2", "b0", "b1", "b2"), keep_all, active=True)
    first, second = bodies(reader.take(2)), bodies(reader.take(2))
    assert sorted([first, second]) == [[b"a0", b"a1"], [b"b0", b"b1"]]
    assert sorted(bodies(reader.take(10))) == [b"a2", b"b2"]
    assert reader.take(10) == []


def test_filtered_messages_are_not_handed_out_and_the_answer_fills_up() -> None:
    reader = PullReader(Queue("pp"), cap=10)
    feed = Queue("s1", "x0", "k1", "x2", "k3")
    reader.add_feed("s1", feed, lambda r: r.body if r.body.startswith(b"k") else None, active=True)
    assert bodies(reader.take(2)) == [b"k1", b"k3"]


def test_a_feed_that_cannot_be_read_is_skipped() -> None:
    reader = PullReader(Queue("pp"), cap=10)
    reader.add_feed("gone", Queue("gone", failing=True), keep_all, active=True)
    reader.add_feed("s2", Queue("s2", "b0"), keep_all, active=True)
    assert bodies(reader.take(10)) == [b"b0"]


def test_a_suspended_feed_is_not_read_and_gives_what_reached_the_pull_point() -> None:
    reader = PullReader(Queue("pp"), cap=2)
    feed = Queue("s1", "a0", "a1", "a2")
    reader.add_feed("s1", feed, keep_all, active=True)
    waiting = reader.suspend_feed("s1")
    assert bodies(list(waiting)) == [b"a0", b"a1"]  # at most cap, unsettled
    assert feed.acked == [] and list(feed.ready) == [b"a2"]
    assert reader.take(10) == []
    reader.give_back(waiting)
    assert list(feed.ready) == [b"a0", b"a1", b"a2"]  # back, in order
    reader.resume_feed("s1")
    assert bodies(reader.take(10)) == [b"a0", b"a1", b"a2"]


def test_a_change_made_through_another_instance_takes_nothing() -> None:
    reader = PullReader(Queue("pp"), cap=10)
    feed = Queue("s1", "a0")
    reader.add_feed("s1", feed, keep_all, active=True)
    assert reader.remove_feed("s1", drain=False) == []
    assert list(feed.ready) == [b"a0"]
    assert reader.feeds(active=True) == [] and reader.feeds(active=False) == []


class Racing(Queue):
    """A feed whose first read lets ``during`` run on another thread before it takes
    (a PauseSubscription or Unsubscribe arriving while GetMessages reads the feed)."""

    def __init__(self, name: str, *bodies: str) -> None:
        super().__init__(name, *bodies)
        self.during: Callable[[], None] | None = None

    def hand_out(self, max_messages: int) -> list[Received]:
        during, self.during = self.during, None
        if during is not None:
            other = threading.Thread(target=during, daemon=True)
            other.start()
            # the pause gets its chance to read the feed first; with the feed's reads
            # serialised it waits for this take instead (the join times out)
            other.join(timeout=1.0)
        return super().hand_out(max_messages)


def test_a_feed_suspended_while_getmessages_reads_it_keeps_its_order() -> None:
    reader = PullReader(Queue("pp"), cap=2)
    feed = Racing("s1", "a0", "a1", "a2", "a3")
    reader.add_feed("s1", feed, keep_all, active=True)
    suspended: list[list[Fed[object]]] = []
    feed.during = lambda: suspended.append(reader.suspend_feed("s1"))
    answer = bodies(reader.take(10))
    wait_until(lambda: bool(suspended), 5.0, what="the suspend")
    kept = bodies(list(suspended[0]))
    # what the answer holds comes before what the pause keeps in the inbox (handed out
    # later): never a later message of the subscription ahead of an earlier one
    assert answer + kept == [b"a0", b"a1", b"a2", b"a3"]


class Broken(Queue):
    """A feed whose middleware fails with something other than an AdapterError."""

    def hand_out(self, max_messages: int) -> list[Received]:
        raise RuntimeError("database disk image is malformed")


def test_an_unexpected_feed_failure_keeps_what_the_answer_took() -> None:
    inbox = Queue("pp", "i0")
    reader = PullReader(inbox, cap=10)
    reader.add_feed("s1", Broken("s1"), keep_all, active=True)
    # the inbox's message was taken: it is in the answer (settled with it)
    assert bodies(reader.take(10)) == [b"i0"]
    assert list(inbox.ready) == [] and inbox.acked == [b"i0"]


def test_an_unexpected_feed_failure_with_nothing_taken_reaches_the_caller() -> None:
    reader = PullReader(Queue("pp"), cap=10)
    reader.add_feed("s1", Broken("s1"), keep_all, active=True)
    with pytest.raises(RuntimeError):
        reader.take(10)


def test_an_answer_is_settled_only_by_its_settlement_filtered_messages_too() -> None:
    inbox = Queue("pp", "i0")
    reader = PullReader(inbox, cap=10)
    feed = Queue("s1", "x0", "k1")
    reader.add_feed("s1", feed, lambda r: r.body if r.body.startswith(b"k") else None, active=True)
    got, settlement = reader.hand_out(10)
    assert bodies(got) == [b"i0", b"k1"]
    assert inbox.acked == [] and feed.acked == []  # nothing settled before the answer's write
    assert reader.take(10) == []  # nor handed out twice meanwhile
    settlement.settle()
    assert inbox.acked == [b"i0"] and feed.acked == [b"x0", b"k1"]  # in order, the filtered too
    settlement.give_back()  # once settled, nothing more
    assert inbox.nacked == [] and feed.nacked == []


def test_an_answer_given_back_comes_again_first_in_order() -> None:
    inbox = Queue("pp", "i0", "i1", "i2")
    reader = PullReader(inbox, cap=10)
    got, settlement = reader.hand_out(2)
    assert bodies(got) == [b"i0", b"i1"]
    settlement.give_back()
    settlement.settle()  # once given back, nothing more
    assert inbox.acked == []
    assert bodies(reader.take(10)) == [b"i0", b"i1", b"i2"]


@pytest.mark.parametrize("answer", ["written", "given back"])
def test_what_an_answer_took_before_its_feed_halted_goes_with_the_answer(answer: str) -> None:
    """The answer that meets the breach: what it took from the feed before (handed out
    or filtered) is settled once the answer was written, else given to the feed's
    ``late`` (core.pull_feeds: the dead letters), never settled before (then lost when
    the answer was not sent); the breaching message and those behind it go to ``late``
    before the answer is made (which settles them once their dead letters are
    confirmed), never settled by the reader itself."""
    reader = PullReader(Queue("pp"), cap=10)
    feed = Queue("s1", "k0", "x1", "over", "k3")

    ended: list[bytes] = []
    late: list[bytes] = []

    def prepare(r: Received) -> object | None:
        # its filter goes over its budget at "over"; from there on every message it
        # meets goes to the dead letters (core.pull_feeds)
        if r.body == b"over" or ended:
            ended.append(r.body)
            reader.halt_feed("s1", lambda fed: late.extend(f.body for f in fed))
            return None
        return None if r.body.startswith(b"x") else r.body

    reader.add_feed("s1", feed, prepare, active=True)
    got, settlement = reader.hand_out(10)
    assert bodies(got) == [b"k0"] and ended == [b"over", b"k3"]
    assert late == [b"over", b"k3"] and feed.acked == []  # to ``late``, not settled here
    if answer == "written":
        settlement.settle()
        assert feed.acked == [b"k0", b"x1"] and late == [b"over", b"k3"]
    else:
        settlement.give_back()
        assert late == [b"over", b"k3", b"k0", b"x1"] and feed.acked == []
    assert feed.nacked == [] and list(feed.ready) == []


@pytest.mark.parametrize("late", ["none", "failing"])
def test_what_a_halted_feeds_answer_met_after_the_breach_goes_back_without_its_late(
    late: str,
) -> None:
    """Without a ``late`` to take them (or one that fails), the breaching message and
    those behind it go back to the feed, never settled (they go with its backlog)."""
    reader = PullReader(Queue("pp"), cap=10)
    feed = Queue("s1", "k0", "over", "k2")

    def failing(fed: list[Fed[object]]) -> None:
        raise RuntimeError("dead letters refused")

    ended: list[bytes] = []

    def prepare(r: Received) -> object | None:
        if r.body == b"over" or ended:  # from there on nothing is handed out
            ended.append(r.body)
            reader.halt_feed("s1", failing if late == "failing" else None)
            return None
        return r.body

    reader.add_feed("s1", feed, prepare, active=True)
    got, settlement = reader.hand_out(10)
    assert bodies(got) == [b"k0"]
    settlement.settle()
    assert feed.acked == [b"k0"]
    assert list(feed.ready) == [b"over", b"k2"]  # back, in order


def test_a_feed_whose_durable_subscription_is_gone_is_removed_without_its_drain() -> None:
    """In a cluster the instance that declared the durable subscription deletes it as it
    follows an end made through another one: the ending instance's drain then fails, and
    the end goes on with nothing to keep (it was answered 503 before)."""
    reader = PullReader(Queue("pp"), cap=10)
    reader.add_feed("s1", Queue("s1", failing=True), keep_all, active=True)
    assert reader.remove_feed("s1") == []
    assert reader.feeds(active=True) == [] and reader.feeds(active=False) == []


def test_a_keeper_keeps_what_an_answer_gives_back_while_the_feed_is_read() -> None:
    """A cluster's feed (``Feed.keeper``): an unsent answer's messages of the feed go to
    its keeper (the pull point's inbox), in order, not back into the feed, whose queue
    another instance may be deleting; the inbox's own go back to it."""
    inbox = Queue("pp", "i0")
    reader = PullReader(inbox, cap=10)
    feed = Queue("s1", "a0", "a1")
    kept: list[list[bytes]] = []
    reader.add_feed(
        "s1", feed, keep_all, active=True, keeper=lambda fed: kept.append(bodies(list(fed)))
    )
    got, settlement = reader.hand_out(10)
    assert bodies(got) == [b"i0", b"a0", b"a1"]
    settlement.give_back()
    assert kept == [[b"a0", b"a1"]]
    assert feed.nacked == [] and list(feed.ready) == []
    assert inbox.nacked == [b"i0"]


@pytest.mark.parametrize("answer", ["written", "given back"])
def test_an_end_waits_for_the_answers_holding_a_feeds_messages(answer: str) -> None:
    """``wait_settled`` (an end before its backlog goes to the dead letters) returns once
    the answers that took the feed's messages were settled or given back."""
    reader = PullReader(Queue("pp", "i0"), cap=10)
    reader.add_feed("s1", Queue("s1", "k0"), keep_all, active=True)
    got, settlement = reader.hand_out(10)
    assert bodies(got) == [b"i0", b"k0"]
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(reader.wait_settled("s1")))
    waiter.start()
    wait_until(lambda: reader.settling("s1"), 5, what="the wait")
    if answer == "written":
        settlement.settle()
    else:
        settlement.give_back()
    waiter.join(5)
    assert waited == [True] and not reader.settling("s1")
