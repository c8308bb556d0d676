"""Conformance groups (a part of :mod:`wsnmom.testing.conformance`) of how messages are
handed out and settled: :class:`AckSemantics` (ack, nack, redelivery),
:class:`PullSemantics` (the adapter's own pull and take) and :class:`PauseResume` (stop,
start, purge, prefetch).
"""

from __future__ import annotations

import threading
import time

import pytest

from wsnmom.core.adapter import (
    Adapter,
    Received,
    SubscriptionHandle,
)
from wsnmom.testing.conformance_fixtures import (
    SENTINEL,
    AdapterFixtures,
    Collector,
    MakeAdapter,
    Names,
    require,
    require_pattern_support,
)
from wsnmom.topic_mapping.model import ANY


class AckSemantics(AdapterFixtures):
    """ack removes, nack requeues (redelivered) or drops, unsettled comes back."""

    def test_first_delivery_not_redelivered(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"1")
        (m,) = self.receive(handle, 1)
        assert m.redelivered is False

    def test_nack_requeue_redelivers(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"again")
        (first,) = self.receive(handle, 1, ack=False)
        first.nack(requeue=True)
        (second,) = self.receive(handle, 1)
        assert second.body == b"again"
        assert second.redelivered is True

    def test_nack_without_requeue_drops(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"gone")
        (first,) = self.receive(handle, 1, ack=False)
        first.nack(requeue=False)
        self.assert_quiet(adapter, handle, self.topic(namespace, "t"))

    def test_ack_removes(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        handle = self.subscribe(adapter, name, patterns)
        self.publish(adapter, self.topic(namespace, "t"), b"done")
        assert len(self.receive(handle, 1)) == 1
        handle.stop()
        again = self.subscribe(adapter, name, patterns)
        self.assert_quiet(adapter, again, self.topic(namespace, "t"))
        assert again.depth() in (0, None)

    def test_unacked_redelivered_after_stop(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        first = Collector(ack=False)
        handle.start(first, prefetch=10)
        self.publish(adapter, self.topic(namespace, "t"), b"unsettled")
        assert [m.body for m in first.wait_for(1, self.receive_timeout)] == [b"unsettled"]
        handle.stop()
        second = Collector(ack=True)
        handle.start(second, prefetch=10)
        got = second.wait_for(1, self.receive_timeout)
        handle.stop()
        assert [m.body for m in got] == [b"unsettled"]
        assert got[0].redelivered is True

    def test_unacked_redelivered_after_close(
        self, make_adapter: MakeAdapter, namespace: str, unique_name: Names
    ) -> None:
        first = make_adapter()
        require(first, "durable_subscriptions")
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        handle = self.subscribe(first, name, patterns)
        self.publish(first, self.topic(namespace, "t"), b"unsettled")
        assert len(self.receive(handle, 1, ack=False)) == 1
        first.close()
        second = make_adapter()
        got = self.receive(self.subscribe(second, name, patterns), 1)
        second.delete_subscription(name)
        assert [m.body for m in got] == [b"unsettled"]
        if second.capabilities.per_message_nack:
            # a queue counts hand-outs; a log cannot know a record was read before
            assert got[0].redelivered is True

    def test_settle_from_another_thread(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"x")
        (m,) = self.receive(handle, 1, ack=False)
        t = threading.Thread(target=m.ack)
        t.start()
        t.join(10)
        self.assert_quiet(adapter, handle, self.topic(namespace, "t"))


class PullSemantics(AdapterFixtures):
    """GetMessages: FIFO, bounded batches, waiting (the adapter's own ``pull``/``take``)."""

    def test_fifo(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require(adapter, "native_pull")
        require(adapter, "ordering", "subscription")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        bodies = [str(i).encode() for i in range(20)]
        for b in bodies:
            self.publish(adapter, self.topic(namespace, "t"), b)
        assert [m.body for m in self.receive(handle, 20)] == bodies

    def test_fifo_across_topics(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require(adapter, "native_pull")
        require(adapter, "ordering", "subscription")
        require_pattern_support(adapter, "single")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t", ANY),))
        bodies = [f"t/n{i % 3}/{i}".encode() for i in range(12)]  # paths are NCNames
        for b in bodies:
            self.publish(adapter, self.topic(namespace, "/".join(b.decode().split("/")[:2])), b)
        assert [m.body for m in self.receive(handle, 12)] == bodies

    def test_max_messages(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(5)]
        )
        got: list[Received] = []
        deadline = time.monotonic() + self.receive_timeout
        while len(got) < 5 and time.monotonic() < deadline:
            batch = handle.pull(2, timeout=0.5)
            assert len(batch) <= 2
            for m in batch:
                m.ack()
            got.extend(batch)
        assert sorted(m.body for m in got) == [b"0", b"1", b"2", b"3", b"4"]

    def test_empty_pull_returns_after_timeout(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        t0 = time.monotonic()
        assert handle.pull(5, timeout=0.3) == []
        assert time.monotonic() - t0 < 0.3 + 5.0

    def test_pull_waits_for_a_message(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        timer = threading.Timer(0.3, self.publish, (adapter, self.topic(namespace, "t"), b"late"))
        timer.start()
        try:
            got = handle.pull(1, timeout=self.receive_timeout + 0.3)
            got += self.receive(handle, 1 - len(got), ack=False)
        finally:
            timer.join()
        assert [m.body for m in got] == [b"late"]
        got[0].ack()

    def test_depth(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        if handle.depth() is None:
            pytest.skip("depth")
        adapter.publish_many([self.message(self.topic(namespace, "t"), b"x") for _ in range(3)])
        deadline = time.monotonic() + self.receive_timeout
        while handle.depth() != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handle.depth() == 3
        self.receive(handle, 3)
        assert handle.depth() == 0

    def test_take_removes_on_hand_out(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(3)]
        )
        first = self.take_until(handle, 2)
        rest = self.take_until(handle, 1)
        bodies = [m.body for m in first + rest]
        if adapter.capabilities.ordering == "subscription":
            assert bodies == [b"0", b"1", b"2"]
        assert sorted(bodies) == [b"0", b"1", b"2"]
        assert not any(m.redelivered for m in first + rest)
        assert handle.take(5) == []
        assert self.barrier(adapter, handle, self.topic(namespace, "t")) == []
        if handle.depth() is not None:
            assert handle.depth() == 0

    def test_settling_taken_messages_does_nothing(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"once")
        (taken,) = self.take_until(handle, 1)
        taken.nack(requeue=True)
        taken.ack()
        assert self.barrier(adapter, handle, self.topic(namespace, "t")) == []

    def test_hand_out_leaves_settling_to_the_caller(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """GetMessages' read: unsettled, out of later reads until acked or requeued; a
        requeue newest first gives them out again first."""
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(3)]
        )
        first = self._hand_out_until(handle, 2)
        rest = self._hand_out_until(handle, 1)  # not the first two again
        assert sorted(m.body for m in first + rest) == [b"0", b"1", b"2"]
        for m in reversed(first):
            m.nack(requeue=True)
        again = self._hand_out_until(handle, 2)
        assert sorted(m.body for m in again) == sorted(m.body for m in first)
        if adapter.capabilities.ordering == "subscription":
            assert [m.body for m in again] == [m.body for m in first]
        for m in again + rest:
            m.ack()
        assert self.barrier(adapter, handle, self.topic(namespace, "t")) == []

    def _hand_out_until(self, handle: SubscriptionHandle, n: int) -> list[Received]:
        deadline = time.monotonic() + self.receive_timeout
        got: list[Received] = []
        while len(got) < n:
            assert time.monotonic() < deadline, f"{len(got)} of {n} handed out"
            batch = handle.hand_out(n - len(got))
            assert len(batch) <= n - len(got), "hand_out returned more than max_messages"
            got.extend(batch)
            if not batch:
                time.sleep(0.05)
        return got

    def test_take_returns_at_most_max_and_does_not_wait(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "native_pull")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        t0 = time.monotonic()
        assert handle.take(3) == []
        assert time.monotonic() - t0 < 2.0
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(4)]
        )
        got = self.take_until(handle, 4)
        assert len(got) == 4


class PauseResume(AdapterFixtures):
    """stop() pauses (messages accumulate), start() resumes; prefetch bounds unsettled."""

    def test_stop_accumulates_start_delivers_in_order(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        patterns = (self.pattern(namespace, "t"),)
        topic = self.topic(namespace, "t")
        handle = self.subscribe(adapter, unique_name(), patterns)
        got = Collector()
        handle.start(got, prefetch=64)
        handle.stop()
        # the barrier: a witness on the same topic gets the ten and then a sentinel
        witness = self.subscribe(adapter, unique_name(), patterns)
        seen = Collector()
        witness.start(seen)
        bodies = [b"%d" % i for i in range(10)]
        for b in bodies:
            self.publish(adapter, topic, b)
        assert sorted(self.push_barrier(adapter, seen, topic)) == sorted(bodies)
        witness.stop()
        assert got.bodies() == []
        handle.start(got, prefetch=64)
        got.wait_for_body(SENTINEL, self.receive_timeout)
        handle.stop()
        if adapter.capabilities.ordering == "subscription":
            assert got.bodies() == [*bodies, SENTINEL]
        else:
            assert sorted(got.bodies()) == sorted([*bodies, SENTINEL])

    def test_start_is_idempotent(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        got = Collector()
        handle.start(got)
        handle.start(got)
        self.publish(adapter, self.topic(namespace, "t"), b"one")
        assert self.push_barrier(adapter, got, self.topic(namespace, "t")) == [b"one"]
        handle.stop()
        handle.stop()

    def test_purge_drops_what_waits(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``purge()`` (an operator's purge of a paused subscription) drops every waiting
        message; what is published afterwards is delivered."""
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(5)]
        )
        deadline = time.monotonic() + self.receive_timeout
        while handle.depth() not in (5, None) and time.monotonic() < deadline:
            time.sleep(0.05)
        dropped = handle.purge()
        assert dropped in (5, None)
        if handle.depth() is not None:
            assert handle.depth() == 0
        self.publish(adapter, self.topic(namespace, "t"), b"after")
        got = Collector()
        handle.start(got)
        assert self.push_barrier(adapter, got, self.topic(namespace, "t")) == [b"after"]
        handle.stop()

    def test_prefetch_bounds_unsettled(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many(
            [self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(6)]
        )
        got = Collector(ack=False)
        handle.start(got, prefetch=2)
        # No sentinel can pass a full window, and no other event follows a delivery the
        # window should have held back: the counts are read as soon as the window is
        # full (a window too wide shows when its extra deliveries come with the first).
        assert len(got.wait_for(2, self.receive_timeout)) == 2
        for m in list(got.received):
            m.ack()
        assert len(got.wait_for(4, self.receive_timeout)) == 4
        for m in got.received[2:]:
            m.ack()
        got.wait_for(6, self.receive_timeout)
        handle.stop()
        for m in got.received[4:]:
            m.ack()
        assert sorted(got.bodies()) == [b"%d" % i for i in range(6)]
