"""Conformance groups (a part of :mod:`wsnmom.testing.conformance`) of what a subscription
keeps and what it loses: :class:`Durability` (across adapter instances),
:class:`QueueLimitsSemantics` (``max_messages``, ``max_bytes``, ``max_age``),
:class:`DroppedToDeadLetters` (what the limits drop, and a backlog sent there whole) and
:class:`Delete`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from wsnmom.core.adapter import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    DROPPED_OVERFLOW_END,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    INTERNAL_NAMESPACE_PREFIX,
    Adapter,
    Overflow,
    QueueLimits,
    Received,
    SubscriptionHandle,
)
from wsnmom.testing.conformance_fixtures import (
    AdapterFixtures,
    Collector,
    MakeAdapter,
    Names,
    require,
)
from wsnmom.topic_mapping.model import Topic

#: the ``max_age`` windows the max-age tests try in turn: the fresh message must be taken
#: within the window, which a loaded machine can miss (its consumer started late); the old
#: one must not, whatever the window, so a longer one weakens nothing
MAX_AGES = (timedelta(milliseconds=300), timedelta(seconds=1.2), timedelta(seconds=4.8))


class Durability(AdapterFixtures):
    """Subscriptions outlive the adapter instance (and the gateway process)."""

    def test_reattach_finds_messages(
        self, make_adapter: MakeAdapter, namespace: str, unique_name: Names
    ) -> None:
        first = make_adapter()
        require(first, "durable_subscriptions")
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        self.subscribe(first, name, patterns)
        first.publish_many([self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(3)])
        first.close()
        second = make_adapter()
        handle = self.subscribe(second, name, patterns)
        got = self.receive(handle, 3)
        second.delete_subscription(name)
        assert sorted(m.body for m in got) == [b"0", b"1", b"2"]

    def test_retiring_departed_instances_takes_nothing_of_a_live_one(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``joined_as`` and ``retire_departed`` (core's cluster hooks, docs/plugins.md):
        with this instance the only live one, nothing of its own is retired; its
        subscription keeps what was published to it."""
        adapter.joined_as("kit-self")
        name = unique_name()
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"kept")
        self.wait_routed(handle, 1)
        retired = adapter.retire_departed(lambda: {"kit-self"})
        assert isinstance(retired, list)
        got = self.receive(handle, 1)
        adapter.delete_subscription(name)
        assert [m.body for m in got] == [b"kept"]

    def test_the_store_is_not_asked_while_the_middleware_keeps_a_subscription(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``kept_in_store`` and ``kept_in_store_many`` (core's questions to its store in
        cluster mode, docs/plugins.md): asked only after the middleware lost what it kept
        of a subscription, so never while it keeps one, which delivers what was published
        to it; both hooks accepted."""
        asked: list[object] = []

        def stored(name: str) -> bool:
            asked.append(name)
            return True

        def held(names: Collection[str]) -> set[str]:
            asked.append(sorted(names))
            return set(names)

        adapter.kept_in_store(stored)
        adapter.kept_in_store_many(held)
        name = unique_name()
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "t"),))
        self.publish(adapter, self.topic(namespace, "t"), b"kept")
        got = self.receive(handle, 1)
        adapter.delete_subscription(name)
        assert [m.body for m in got] == [b"kept"]
        assert asked == []

    def test_taken_messages_stay_gone_after_reattach(
        self, make_adapter: MakeAdapter, namespace: str, unique_name: Names
    ) -> None:
        first = make_adapter()
        require(first, "durable_subscriptions")
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        handle = self.subscribe(first, name, patterns)
        first.publish_many([self.message(self.topic(namespace, "t"), b"%d" % i) for i in range(3)])
        taken = self.take_until(handle, 2)
        assert len(taken) == 2
        first.close()
        second = make_adapter()
        again = self.subscribe(second, name, patterns)
        left = self.barrier(second, again, self.topic(namespace, "t"))
        second.delete_subscription(name)
        assert sorted(m.body for m in left + taken) == [b"0", b"1", b"2"]
        assert len(left) == 1

    def test_accumulates_while_nobody_consumes(
        self, make_adapter: MakeAdapter, namespace: str, unique_name: Names
    ) -> None:
        first = make_adapter()
        require(first, "durable_subscriptions")
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        self.subscribe(first, name, patterns)
        first.close()
        publisher = make_adapter()
        self.publish(publisher, self.topic(namespace, "t"), b"while-away")
        handle = self.subscribe(publisher, name, patterns)
        got = self.receive(handle, 1)
        publisher.delete_subscription(name)
        assert [m.body for m in got] == [b"while-away"]


class QueueLimitsSemantics(AdapterFixtures):
    """QueueLimits enforced by the middleware (``native_queue_limits``)."""

    def _fill(
        self,
        adapter: Adapter,
        namespace: str,
        name: str,
        limits: QueueLimits,
        n: int,
        size: int = 1,
    ) -> list[bytes]:
        require(adapter, "native_queue_limits")
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "t"),), limits)
        # a witness on another topic, without limits: once it has a sentinel published
        # after the n messages, the middleware has routed them all (a session's broker
        # confirms a publish before it delivers to the session)
        witness = self.subscribe(adapter, f"{name}-witness", (self.pattern(namespace, "w"),))
        try:
            for i in range(n):
                self.publish(adapter, self.topic(namespace, "t"), (b"%d" % i).rjust(size, b"."))
            assert self.barrier(adapter, witness, self.topic(namespace, "w")) == []
        finally:
            witness.delete()
        got = self.receive(handle, 3)  # every case keeps three
        # the queue is empty now: a sentinel is kept whatever the limits
        got += self.barrier(adapter, handle, self.topic(namespace, "t"))
        return [m.body.lstrip(b".") for m in got]

    def test_drop_oldest(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        limits = QueueLimits(max_messages=3, overflow=Overflow.DROP_OLDEST)
        assert self._fill(adapter, namespace, unique_name(), limits, 6) == [b"3", b"4", b"5"]

    def test_drop_newest(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        limits = QueueLimits(max_messages=3, overflow=Overflow.DROP_NEWEST)
        assert self._fill(adapter, namespace, unique_name(), limits, 6) == [b"0", b"1", b"2"]

    def test_max_bytes(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        limits = QueueLimits(max_bytes=30, overflow=Overflow.DROP_OLDEST)
        assert self._fill(adapter, namespace, unique_name(), limits, 5, size=10) == [
            b"2",
            b"3",
            b"4",
        ]

    def test_max_age(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        """A message older than ``max_age`` is not delivered, a fresh one is (see
        :meth:`AdapterFixtures.young`; a longer window when the machine missed one)."""
        require(adapter, "native_queue_limits")
        topic = self.topic(namespace, "t")
        for age in MAX_AGES:
            limits = QueueLimits(max_age=age)
            handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),), limits)
            self.publish(adapter, topic, b"old")  # confirmed: stored now
            time.sleep(age.total_seconds() + 0.7)  # past max_age; what arrives is asserted
            got = self.young(adapter, handle, topic)
            if got is not None:
                break
        assert got is not None, f"no fresh message within any max_age of {MAX_AGES}"
        assert [m.body for m in got] == [b"fresh"]


class DroppedToDeadLetters(AdapterFixtures):
    """What the adapter drops for ``QueueLimits`` goes to ``SubscriptionSpec.dead_letters``
    with ``HEADER_DROPPED_REASON`` and ``HEADER_DROPPED_FROM`` (``native_dead_letters``):
    dropped by the middleware itself (``native_queue_limits``), or by
    ``SubscriptionHandle.discard``, as core asks where it enforces limits."""

    def _grave(self, adapter: Adapter, unique_name: Names) -> tuple[Topic, SubscriptionHandle]:
        """A dead-letter topic (internal, as core's are) and a subscription reading it."""
        require(adapter, "native_dead_letters")
        topic = Topic(f"{INTERNAL_NAMESPACE_PREFIX}conformance-{uuid.uuid4().hex}", ("dl",))
        box = self.subscribe(adapter, unique_name(), (self.pattern(topic.namespace, "dl"),))
        return topic, box

    def _limit(
        self,
        adapter: Adapter,
        namespace: str,
        name: str,
        handle: SubscriptionHandle,
        published: int,
        bound: int,
        newest: bool = False,
    ) -> None:
        """Let the limits act on the ``published`` messages: the middleware's, once it has
        routed them all (a witness on another topic gets a sentinel published after
        them: a session's broker confirms a publish before it routes it); otherwise what
        core's sweep does, ``discard`` of the excess (the oldest, or ``newest``)."""
        if adapter.capabilities.native_queue_limits:
            witness = self.subscribe(adapter, f"{name}-witness", (self.pattern(namespace, "w"),))
            try:
                assert self.barrier(adapter, witness, self.topic(namespace, "w")) == []
            finally:
                witness.delete()
        else:
            self.wait_routed(handle, published)
            excess = published - bound
            assert handle.discard(excess, newest=newest) == excess

    @staticmethod
    def _assert_dropped_at(message: Received, published: datetime) -> None:
        """``HEADER_DROPPED_AT``: an ISO 8601 time with its zone, not before the message
        was published (a second of clock skew between the middleware and here allowed)."""
        when = datetime.fromisoformat(message.headers[HEADER_DROPPED_AT])
        assert when.tzinfo is not None, when
        assert when >= published - timedelta(seconds=1), (when, published)
        assert when <= datetime.now(UTC) + timedelta(seconds=1), when

    def _dropped(self, box: SubscriptionHandle, n: int) -> list[Received]:
        got = self.receive(box, n)
        assert len(got) == n, f"{len(got)} of {n} dead letters: {[m.body for m in got]}"
        return got

    def test_overflow_is_dead_lettered(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        grave, box = self._grave(adapter, unique_name)
        name = unique_name()
        limits = QueueLimits(max_messages=2, overflow=Overflow.DROP_OLDEST)
        handle = self.subscribe(
            adapter, name, (self.pattern(namespace, "t"),), limits, dead_letters=grave
        )
        published = datetime.now(UTC)
        for i in range(4):
            self.publish(adapter, self.topic(namespace, "t"), b"%d" % i, **{"x-kept": str(i)})
        self._limit(adapter, namespace, name, handle, 4, 2)
        dropped = self._dropped(box, 2)
        assert [m.body for m in dropped] == [b"0", b"1"]
        for i, m in enumerate(dropped):
            assert m.headers[HEADER_DROPPED_REASON] == DROPPED_OVERFLOW
            assert m.headers[HEADER_DROPPED_FROM] == name
            self._assert_dropped_at(m, published)
            if adapter.capabilities.native_headers:  # the original headers travel along
                assert m.headers["x-kept"] == str(i)
            assert m.headers[HEADER_TOPIC_NAMESPACE] == namespace
            assert m.headers[HEADER_TOPIC_PATH] == "t"
        kept = self.receive(handle, 2) + self.barrier(adapter, handle, self.topic(namespace, "t"))
        assert [m.body for m in kept] == [b"2", b"3"]
        # nothing else was dead-lettered
        self.assert_quiet(adapter, box, grave)

    def test_drop_newest_is_dead_lettered(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        grave, box = self._grave(adapter, unique_name)
        name = unique_name()
        limits = QueueLimits(max_messages=2, overflow=Overflow.DROP_NEWEST)
        handle = self.subscribe(
            adapter, name, (self.pattern(namespace, "t"),), limits, dead_letters=grave
        )
        for i in range(4):
            self.publish(adapter, self.topic(namespace, "t"), b"%d" % i)
        self._limit(adapter, namespace, name, handle, 4, 2, newest=True)
        # a log's cursor delivers the oldest before it reads (and buries) the newest
        kept = self.receive(handle, 2) + self.barrier(adapter, handle, self.topic(namespace, "t"))
        assert [m.body for m in kept] == [b"0", b"1"]
        dropped = self._dropped(box, 2)
        assert [m.body for m in dropped] == [b"2", b"3"]
        assert {m.headers[HEADER_DROPPED_REASON] for m in dropped} == {DROPPED_OVERFLOW}
        assert {m.headers[HEADER_DROPPED_FROM] for m in dropped} == {name}
        self.assert_quiet(adapter, box, grave)

    def test_without_a_topic_nothing_is_dead_lettered(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        grave, box = self._grave(adapter, unique_name)
        limits = QueueLimits(max_messages=1, overflow=Overflow.DROP_OLDEST)
        name = unique_name()
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "t"),), limits)
        for i in range(3):
            self.publish(adapter, self.topic(namespace, "t"), b"%d" % i)
        self._limit(adapter, namespace, name, handle, 3, 1)
        kept = self.receive(handle, 1) + self.barrier(adapter, handle, self.topic(namespace, "t"))
        assert [m.body for m in kept] == [b"2"]
        self.assert_quiet(adapter, box, grave)

    def test_max_age_is_dead_lettered(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """The old message is dead-lettered, the fresh one delivered (see
        :meth:`AdapterFixtures.young`; on a machine that missed the window, a longer one,
        with a dead-letter topic of its own)."""
        require(adapter, "native_dead_letters")
        require(adapter, "native_queue_limits")  # otherwise core drops what is too old
        topic = self.topic(namespace, "t")
        for age in MAX_AGES:
            grave, box = self._grave(adapter, unique_name)
            name = unique_name()
            limits = QueueLimits(max_age=age)
            handle = self.subscribe(
                adapter, name, (self.pattern(namespace, "t"),), limits, dead_letters=grave
            )
            published = datetime.now(UTC)
            self.publish(adapter, topic, b"old")  # confirmed: stored now
            # past max_age (a middleware may expire only when the queue is read, so its
            # dead letter cannot be awaited first); what arrives is asserted
            time.sleep(age.total_seconds() + 0.7)
            got = self.young(adapter, handle, topic)
            if got is not None:
                break
        assert got is not None, f"no fresh message within any max_age of {MAX_AGES}"
        assert [m.body for m in got] == [b"fresh"]
        [old] = self._dropped(box, 1)
        assert old.body == b"old"
        assert old.headers[HEADER_DROPPED_REASON] == DROPPED_MAX_AGE
        assert old.headers[HEADER_DROPPED_FROM] == name
        self._assert_dropped_at(old, published)

    def test_delete_into_dead_letters(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``delete_into_dead_letters``: the whole backlog, what was handed out and not
        settled included, reaches the dead-letter topic, each message once, with the
        reason and the context given, and the subscription is gone."""
        grave, box = self._grave(adapter, unique_name)
        name = unique_name()
        topic = self.topic(namespace, "t")
        patterns = (self.pattern(namespace, "t"),)
        handle = self.subscribe(adapter, name, patterns, dead_letters=grave)
        published = datetime.now(UTC)
        for i in range(3):
            self.publish(adapter, topic, b"%d" % i, **{"x-kept": str(i)})
        held = Collector(ack=False)
        handle.start(held, prefetch=2)
        assert len(held.wait_for(2, self.receive_timeout)) == 2  # handed out, not settled
        handle.stop()  # as core stops its delivery first
        for i in range(3, 5):
            self.publish(adapter, topic, b"%d" % i)
        self.wait_routed(handle, 5)
        sent = handle.delete_into_dead_letters(
            DROPPED_OVERFLOW_END, {"x-context": "ended"}, timeout=2 * self.receive_timeout
        )
        assert sent == 5
        dropped = self._dropped(box, 5)
        assert sorted(m.body for m in dropped) == [b"0", b"1", b"2", b"3", b"4"]
        for m in dropped:
            assert m.headers[HEADER_DROPPED_REASON] == DROPPED_OVERFLOW_END
            assert m.headers[HEADER_DROPPED_FROM] == name
            assert m.headers[HEADER_TOPIC_PATH] == "t"
            self._assert_dropped_at(m, published)
            if adapter.capabilities.native_headers:
                assert m.headers["x-context"] == "ended"
        if adapter.capabilities.native_headers:
            kept = {m.body: m.headers.get("x-kept") for m in dropped}
            assert kept[b"0"] == "0" and kept[b"2"] == "2"
        self.assert_quiet(adapter, box, grave)  # each once, nothing more
        self.publish(adapter, topic, b"after")  # reaches no queue: the subscription is gone
        again = self.subscribe(adapter, name, patterns)
        self.assert_quiet(adapter, again, topic)

    def test_delete_into_dead_letters_right_after_a_publish(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``delete_into_dead_letters`` called as soon as the middleware confirmed a
        publish: what it confirmed is the backlog, whether or not the adapter has read it
        yet (a log's head reader; MQTT's gateway session, whose PUBACK comes before the
        broker delivers to it), so each message reaches the dead letters once."""
        grave, box = self._grave(adapter, unique_name)
        name = unique_name()
        topic = self.topic(namespace, "t")
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "t"),), dead_letters=grave)
        count = 300
        adapter.publish_many([self.message(topic, b"%d" % i) for i in range(count)])
        sent = handle.delete_into_dead_letters(
            DROPPED_OVERFLOW_END, {}, timeout=2 * self.receive_timeout
        )
        assert sent == count
        dropped = self._dropped(box, count)
        assert sorted(m.body for m in dropped) == sorted(b"%d" % i for i in range(count))
        self.assert_quiet(adapter, box, grave)


class Delete(AdapterFixtures):
    """Deleting a subscription destroys what it holds."""

    def test_handle_delete(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        handle = self.subscribe(adapter, name, patterns)
        self.publish(adapter, self.topic(namespace, "t"), b"doomed")
        self.wait_routed(handle, 1)
        handle.delete()
        handle.delete()  # idempotent
        self.publish(adapter, self.topic(namespace, "t"), b"unrouted")
        again = self.subscribe(adapter, name, patterns)
        self.assert_quiet(adapter, again, self.topic(namespace, "t"))

    def test_forget_of_a_name_never_known_here_leaves_nothing(
        self, adapter: Adapter, unique_name: Names
    ) -> None:
        """``forget_subscription`` (cluster mode: another instance destroyed it) of a name
        this instance never declared: idempotent, and it says nothing was left here (a
        truthy answer makes core write an intent for the orphan sweep)."""
        name = unique_name()
        assert not adapter.forget_subscription(name)
        assert not adapter.forget_subscription(name)

    def test_delete_subscription_by_name(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        name = unique_name()
        patterns = (self.pattern(namespace, "t"),)
        doomed = self.subscribe(adapter, name, patterns)
        self.publish(adapter, self.topic(namespace, "t"), b"doomed")
        self.wait_routed(doomed, 1)
        adapter.delete_subscription(name)
        adapter.delete_subscription(name)
        again = self.subscribe(adapter, name, patterns)
        self.assert_quiet(adapter, again, self.topic(namespace, "t"))

    def test_delete_unknown_is_noop(self, adapter: Adapter) -> None:
        adapter.delete_subscription(f"never-existed-{uuid.uuid4().hex}")
