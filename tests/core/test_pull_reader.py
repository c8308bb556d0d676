"""core.pull_reader: a pull point read through the middleware's own pull — the inbox first,
then the feeds in turn; a feed that cannot be read is skipped; what a suspended feed held
is taken unsettled and can be given back (in-memory handles, no middleware)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle
from wsnmom.core.pull_buffer import Fed
from wsnmom.core.pull_reader import PullReader
from wsnmom.topic_mapping.model import Topic

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
