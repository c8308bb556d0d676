"""Adapter conformance kit: the behaviour every wsnmom adapter must show, as pytest classes.

Subclass :class:`AdapterConformance` in your adapter's test suite and provide an
``adapter_url`` fixture (and, optionally, ``adapter_options``)::

    import pytest
    from wsnmom.testing.conformance import AdapterConformance

    class TestNatsConformance(AdapterConformance):
        @pytest.fixture
        def adapter_url(self, nats_server):
            return nats_server.url

        # brokers that route asynchronously may need more time
        receive_timeout = 10.0

Every test uses its own topic namespace and subscription names (uuid4), so the classes can
share one broker, also with other suites running against it.  A test that needs something
the adapter's ``Capabilities`` say it cannot do is *skipped*, with the capability name as
the reason (``retained_current_message``, ``syntax.multi_level_mid_path``, ...); it never
fails for that reason.  Pick single groups by subclassing only some of the base classes
(``class TestMine(TopicRouting, AckSemantics)``: each group brings the fixtures).

The adapter is resolved from the URL through the plugin registry (so your plugin's entry
point is exercised too), unless you override the ``adapter_class`` fixture.

Adapters without a pull of their own (``native_pull=False``: logs; RabbitMQ with its
default ``pull = "buffer"``) are checked through
``wsnmom.core.pull_buffer.PullBuffer``, the same buffer core uses for their pull points;
the ``PullSemantics`` group (the adapter's own pull) is skipped for them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

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
    Capabilities,
    OutboundMessage,
    Overflow,
    PublishReceipt,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError, describe_options
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Segment, Topic
from wsnmom.topic_mapping.syntax import WildcardSyntax

__all__ = [
    "SENTINEL",
    "AckSemantics",
    "AdapterBasics",
    "AdapterConformance",
    "AdapterFixtures",
    "Collector",
    "CurrentMessage",
    "Delete",
    "DroppedToDeadLetters",
    "Durability",
    "HeadersAndBodies",
    "PauseResume",
    "Peek",
    "PullSemantics",
    "QueueLimitsSemantics",
    "TopicRouting",
    "require",
]


#: fixture types: a factory of unique subscription names, a factory of open adapters
Names = Callable[[], str]
MakeAdapter = Callable[[], Adapter]
#: what the kit pulls from: the handle itself, or a pull buffer over a push-only handle
Puller = SubscriptionHandle | PullBuffer
#: messages a pull buffer of the kit holds (well above what any test publishes)
KIT_BUFFER = 1000

# --------------------------------------------------------------------------- helpers


def require(adapter: Adapter, flag: str, expected: object = True) -> None:
    """Skip the running test unless ``adapter.capabilities.<flag> == expected``.

    ``flag`` may be dotted into the syntax (``"syntax.multi_level_mid_path"``); the skip
    reason is the flag name.
    """
    value: Any = adapter.capabilities
    for part in flag.split("."):
        value = getattr(value, part)
    if value != expected:
        pytest.skip(flag)


def require_pattern_support(adapter: Adapter, *kinds: str) -> None:
    """Skip unless the adapter's syntax expresses the wildcard ``kinds``.

    Kinds: ``"single"`` (one level), ``"multi"`` (trailing zero-or-more levels),
    ``"multi_mid"`` (zero-or-more levels before the last level).
    """
    syntax: WildcardSyntax = adapter.capabilities.syntax
    if syntax.regex:
        return
    for kind in kinds:
        if kind == "single" and syntax.single_level is None:
            pytest.skip("syntax.single_level")
        if kind in {"multi", "multi_mid"} and syntax.multi_level is None:
            pytest.skip("syntax.multi_level")
        if kind == "multi_mid" and not syntax.multi_level_mid_path:
            pytest.skip("syntax.multi_level_mid_path")


#: the body of the kit's sentinel messages (see ``AdapterFixtures.barrier``)
SENTINEL = b"<wsnmom-conformance-sentinel/>"


class Collector:
    """An ``on_message`` callback that records what it gets (optionally acking it)."""

    def __init__(self, *, ack: bool = True) -> None:
        self.ack = ack
        self.received: list[Received] = []
        self._cv = threading.Condition()

    def __call__(self, message: Received) -> None:
        with self._cv:
            self.received.append(message)
            self._cv.notify_all()
        if self.ack:
            message.ack()

    def wait_for(self, n: int, timeout: float) -> list[Received]:
        """Wait until at least ``n`` messages arrived (or timeout); returns all so far."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self.received) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            return list(self.received)

    def wait_for_body(self, body: bytes, timeout: float) -> list[Received]:
        """Wait until a message with ``body`` arrived; returns all so far.

        :raises AssertionError: none arrived within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            while not any(m.body == body for m in self.received):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no {body!r} within {timeout:g} s; got {len(self.received)} other(s)"
                    )
                self._cv.wait(remaining)
            return list(self.received)

    def bodies(self) -> list[bytes]:
        with self._cv:
            return [m.body for m in self.received]

    def clear(self) -> None:
        with self._cv:
            self.received.clear()


# --------------------------------------------------------------------------- fixtures


class AdapterFixtures:
    """Fixtures and helpers every conformance group uses.  Authors provide ``adapter_url``."""

    #: seconds to wait for an expected message (a sentinel included)
    receive_timeout: float = 5.0

    @pytest.fixture
    def adapter_url(self) -> str:
        """The URL of the middleware under test.  Override in the subclass."""
        raise NotImplementedError("provide an adapter_url fixture in your conformance class")

    @pytest.fixture
    def adapter_options(self) -> Mapping[str, Any]:
        """Options passed to the adapter constructor (override to add some)."""
        return {}

    @pytest.fixture
    def adapter_class(self, adapter_url: str) -> type[Adapter]:
        """The class serving ``adapter_url``, resolved through the plugin registry."""
        from wsnmom.core.plugins import resolve

        return resolve(adapter_url)

    @pytest.fixture
    def make_adapter(
        self,
        adapter_class: type[Adapter],
        adapter_url: str,
        adapter_options: Mapping[str, Any],
    ) -> Iterator[Callable[[], Adapter]]:
        """Factory of open adapters on the URL under test; all are closed at teardown."""
        made: list[Adapter] = []

        def make() -> Adapter:
            adapter = adapter_class(adapter_url, dict(adapter_options))
            adapter.open()
            made.append(adapter)
            return adapter

        yield make
        for adapter in reversed(made):
            adapter.close()

    @pytest.fixture
    def adapter(self, make_adapter: MakeAdapter) -> Adapter:
        """An open adapter."""
        return make_adapter()

    @pytest.fixture(autouse=True)
    def _pull_buffers(self) -> Iterator[None]:
        """Pull buffers over the push-only handles of one test (stopped at teardown)."""
        self._buffers: dict[int, PullBuffer] = {}
        yield
        for buffer in self._buffers.values():
            with contextlib.suppress(Exception):
                buffer.stop()

    @pytest.fixture
    def namespace(self) -> str:
        """A topic namespace no other test uses."""
        return f"urn:wsnmom:conformance:{uuid.uuid4().hex}"

    @pytest.fixture
    def cleanup(self, adapter: Adapter) -> Iterator[list[str]]:
        """Subscription names to delete at teardown (``unique_name`` adds to it)."""
        names: list[str] = []
        yield names
        for name in names:
            with contextlib.suppress(Exception):  # the test may have closed the adapter
                adapter.delete_subscription(name)

    @pytest.fixture
    def unique_name(self, cleanup: list[str]) -> Callable[[], str]:
        """Factory of fresh subscription names (deleted at teardown)."""

        def make() -> str:
            name = f"conformance-{uuid.uuid4().hex}"
            cleanup.append(name)
            return name

        return make

    # -- helpers (not fixtures) -----------------------------------------------------

    @staticmethod
    def topic(namespace: str, path: str) -> Topic:
        """``Topic(namespace, ("a", "b"))`` from ``"a/b"``."""
        return Topic(namespace, tuple(path.split("/")))

    @staticmethod
    def pattern(namespace: str, *segments: Segment) -> PathPattern:
        return PathPattern(namespace, tuple(segments))

    @staticmethod
    def message(
        topic: Topic, body: bytes, headers: Mapping[str, str] | None = None
    ) -> OutboundMessage:
        return OutboundMessage(
            topic=topic, body=body, message_id=uuid.uuid4().hex, headers=dict(headers or {})
        )

    def publish(
        self, adapter: Adapter, topic: Topic, body: bytes, **headers: str
    ) -> PublishReceipt:
        receipt = adapter.publish(self.message(topic, body, headers))
        assert isinstance(receipt, PublishReceipt)
        return receipt

    def subscribe(
        self,
        adapter: Adapter,
        name: str,
        patterns: tuple[PathPattern, ...] | None,
        limits: QueueLimits | None = None,
        dead_letters: Topic | None = None,
    ) -> SubscriptionHandle:
        spec = SubscriptionSpec(
            name=name, patterns=patterns, limits=limits or QueueLimits(), dead_letters=dead_letters
        )
        handle = adapter.subscription(spec)
        if not adapter.capabilities.native_pull:
            self._buffers[id(handle)] = PullBuffer(handle, KIT_BUFFER)
        return handle

    def puller(self, handle: SubscriptionHandle) -> Puller:
        """What to pull ``handle``'s messages from (see the module docstring)."""
        return self._buffers.get(id(handle), handle)

    def receive(
        self, handle: SubscriptionHandle, n: int, *, ack: bool = True, timeout: float | None = None
    ) -> list[Received]:
        """Pull until ``n`` messages arrived or the timeout passed."""
        deadline = time.monotonic() + (self.receive_timeout if timeout is None else timeout)
        got: list[Received] = []
        while len(got) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            batch = self.puller(handle).pull(n - len(got), timeout=min(remaining, 0.5))
            assert len(batch) <= n - len(got), "pull returned more than max_messages"
            got.extend(batch)
        if ack:
            for m in got:
                m.ack()
        return got

    def take_until(self, handle: SubscriptionHandle, n: int) -> list[Received]:
        """``take`` until ``n`` messages arrived or the receive timeout passed."""
        deadline = time.monotonic() + self.receive_timeout
        got: list[Received] = []
        while len(got) < n and time.monotonic() < deadline:
            batch = self.puller(handle).take(n - len(got))
            assert len(batch) <= n - len(got), "take returned more than max_messages"
            got.extend(batch)
            if not batch:
                time.sleep(0.05)
        return got

    def wait_routed(self, handle: SubscriptionHandle, depth: int) -> None:
        """Wait until ``handle`` holds ``depth`` messages, so that what was published has
        reached it before anything is taken out (a middleware may confirm a publish before
        it routes the message: MQTT's PUBACK comes before the broker delivers to the
        gateway's session).  Returns at once when the adapter cannot tell a depth."""
        deadline = time.monotonic() + self.receive_timeout
        while (current := handle.depth()) is not None and current < depth:
            assert time.monotonic() < deadline, f"depth {current} of {depth}"
            time.sleep(0.02)

    def barrier(
        self,
        adapter: Adapter,
        handle: SubscriptionHandle,
        topic: Topic,
        *,
        ack: bool = True,
        also: Sequence[Topic] = (),
    ) -> list[Received]:
        """Publish a sentinel (body :data:`SENTINEL`) to ``topic``, a topic ``handle``
        selects, and pull from ``handle`` until it arrives; returns the messages pulled
        with it, without the sentinel (acked unless ``ack`` is False).

        This is how the kit asserts that something did *not* arrive: what was published
        to ``topic`` before the sentinel, and has not come with it, never comes (for a
        middleware that keeps order per topic only, the message under test and the
        sentinel share the topic).  A fixed wait would pass whenever delivery is slower
        than the wait.

        ``also``: more topics ``handle`` selects that get a sentinel each, for messages
        published to several topics (a middleware such as Kafka keeps no order between
        them); it waits until every sentinel has arrived.

        :raises AssertionError: no sentinel within ``receive_timeout`` seconds.
        """
        targets = [topic, *also]
        for target in targets:
            self.publish(adapter, target, SENTINEL)
        deadline = time.monotonic() + self.receive_timeout
        got: list[Received] = []
        while sum(1 for m in got if m.body == SENTINEL) < len(targets):
            remaining = deadline - time.monotonic()
            assert remaining > 0, (
                f"no sentinel on {topic} within {self.receive_timeout:g} s; "
                f"got {[m.body for m in got]}"
            )
            got += self.puller(handle).pull(100, timeout=min(remaining, 0.5))
        for m in got:
            if ack or m.body == SENTINEL:
                m.ack()
        return [m for m in got if m.body != SENTINEL]

    def push_barrier(self, adapter: Adapter, collector: Collector, topic: Topic) -> list[bytes]:
        """:meth:`barrier` for a started handle whose ``on_message`` is ``collector``:
        publish a sentinel to ``topic`` and wait until ``collector`` has it; returns the
        bodies collected so far, without the sentinel."""
        self.publish(adapter, topic, SENTINEL)
        collector.wait_for_body(SENTINEL, self.receive_timeout)
        return [b for b in collector.bodies() if b != SENTINEL]

    def assert_quiet(
        self,
        adapter: Adapter,
        handle: SubscriptionHandle,
        topic: Topic,
        namespace: str | None = None,
    ) -> None:
        """Nothing (of ``namespace``) arrives at ``handle`` before a sentinel published to
        ``topic`` now (see :meth:`barrier`)."""
        extra = self.barrier(adapter, handle, topic)
        if namespace is not None:
            extra = [m for m in extra if m.topic.namespace == namespace]
        assert extra == [], f"unexpected messages: {[(str(m.topic), m.body) for m in extra]}"

    def routed(
        self,
        adapter: Adapter,
        name: str,
        patterns: tuple[PathPattern, ...] | None,
        namespace: str,
        publish: list[str],
        publish_ns: str | None = None,
    ) -> list[str]:
        """Subscribe, publish one message per topic path, return the paths received.

        Receives until a sentinel published after them to each topic the canonical matcher
        selects has arrived (:meth:`barrier`), so extra deliveries are caught too.
        """
        handle = self.subscribe(adapter, name, patterns)
        ns = publish_ns or namespace
        topics = [self.topic(ns, path) for path in publish]
        for t in topics:
            self.publish(adapter, t, "/".join(t.path).encode())
        selected = [t for t in topics if patterns is None or any(p.matches(t) for p in patterns)]
        assert selected, "routed() needs a published topic the patterns select"
        # a sentinel on every selected topic: order holds within a topic only
        got = self.barrier(adapter, handle, selected[-1], also=selected[:-1])
        return sorted(m.body.decode() for m in got)


# --------------------------------------------------------------------------- groups


class AdapterBasics(AdapterFixtures):
    """Lifecycle: open, ping, close; class attributes."""

    def test_declares_itself(self, adapter: Adapter, adapter_url: str) -> None:
        assert isinstance(adapter.capabilities, Capabilities)
        assert isinstance(adapter.capabilities.syntax, WildcardSyntax)
        assert adapter.name
        assert adapter_url.split("://", 1)[0].lower() in adapter.schemes

    def test_declares_its_options(
        self, adapter_class: type[Adapter], adapter_url: str, adapter_options: Mapping[str, Any]
    ) -> None:
        """Options are declared once (``declared_options``), each with its doc string; an
        unknown one is a configuration error naming the closest declared option."""
        declared = adapter_class.declared_options
        if declared is None:
            pytest.skip("declared_options: the adapter declares no options")
        described = describe_options(declared)
        assert [d.name for d in described if not d.doc] == [], "options without a doc"
        if not described:
            return
        name = described[0].name
        with pytest.raises(AdapterOptionError, match=rf"did you mean {name}\?"):
            adapter_class(adapter_url, {**adapter_options, name + "z": "1"})

    def test_open_is_idempotent(self, adapter: Adapter) -> None:
        adapter.open()
        assert adapter.ping(timeout=2.0) is True

    def test_close_is_idempotent(self, make_adapter: MakeAdapter) -> None:
        adapter = make_adapter()
        assert adapter.ping(timeout=2.0) is True
        adapter.close()
        adapter.close()
        assert adapter.ping(timeout=1.0) is False

    def test_publish_without_subscriber(self, adapter: Adapter, namespace: str) -> None:
        receipt = self.publish(adapter, self.topic(namespace, "nobody/listens"), b"<x/>")
        assert receipt.routed in (False, None)

    def test_publish_many_one_receipt_each(self, adapter: Adapter, namespace: str) -> None:
        msgs = [self.message(self.topic(namespace, f"t{i}"), b"<x/>") for i in range(5)]
        receipts = adapter.publish_many(msgs)
        assert len(receipts) == 5
        assert all(isinstance(r, PublishReceipt) for r in receipts)

    def test_depths_bulk_equals_single(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handles = [
            self.subscribe(adapter, unique_name(), (self.pattern(namespace, f"d{i}"),))
            for i in range(3)
        ]
        for i in range(3):
            adapter.publish_many(
                [self.message(self.topic(namespace, f"d{i}"), b"x") for _ in range(i + 1)]
            )
        deadline = time.monotonic() + self.receive_timeout
        single = [h.depth() for h in handles]
        while time.monotonic() < deadline:
            single = [h.depth() for h in handles]
            if single in ([1, 2, 3], [None, None, None], [0, 0, 0]):
                break
            time.sleep(0.05)
        assert adapter.depths(handles) == single


class TopicRouting(AdapterFixtures):
    """Which messages a subscription's patterns select."""

    def test_exact(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        got = self.routed(
            adapter,
            unique_name(),
            (self.pattern(namespace, "a", "b"),),
            namespace,
            ["a/b", "a/c", "a/b/c", "a", "b"],
        )
        assert got == ["a/b"]

    def test_routed_receipt(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        self.subscribe(adapter, unique_name(), (self.pattern(namespace, "r"),))
        assert self.publish(adapter, self.topic(namespace, "r"), b"1").routed in (True, None)

    def test_single_level(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require_pattern_support(adapter, "single")
        got = self.routed(
            adapter,
            unique_name(),
            (self.pattern(namespace, "a", ANY),),
            namespace,
            ["a/b", "a/c", "a", "a/b/c", "x/b"],
        )
        assert got == ["a/b", "a/c"]

    def test_single_level_first(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require_pattern_support(adapter, "single")
        got = self.routed(
            adapter,
            unique_name(),
            (self.pattern(namespace, ANY, "z"),),
            namespace,
            ["a/z", "b/z", "z", "a/b/z", "a/y"],
        )
        assert got == ["a/z", "b/z"]

    def test_multi_level_trailing(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require_pattern_support(adapter, "multi")
        got = self.routed(
            adapter,
            unique_name(),
            (self.pattern(namespace, "a", DEEP),),
            namespace,
            ["a", "a/b", "a/b/c", "b", "b/a"],
        )
        if (
            adapter.capabilities.syntax.multi_level_matches_parent
            or adapter.capabilities.syntax.regex
        ):
            assert got == ["a", "a/b", "a/b/c"]
        else:
            assert got == ["a/b", "a/b/c"]

    def test_multi_level_mid_path(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require_pattern_support(adapter, "multi_mid")
        got = self.routed(
            adapter,
            unique_name(),
            (self.pattern(namespace, "a", DEEP, "z"),),
            namespace,
            ["a/z", "a/b/z", "a/b/c/z", "a/b", "a/z/b", "z"],
        )
        assert got == ["a/b/c/z", "a/b/z", "a/z"]

    def test_namespace_isolation(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        other = f"{namespace}:other"
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "a"),))
        self.publish(adapter, self.topic(other, "a"), b"other")
        self.publish(adapter, self.topic(namespace, "a"), b"mine")
        got = self.receive(handle, 1)
        assert [m.body for m in got] == [b"mine"]
        assert got[0].topic == self.topic(namespace, "a")
        self.assert_quiet(adapter, handle, self.topic(namespace, "a"))

    def test_wildcards_stay_in_namespace(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require_pattern_support(adapter, "multi")
        other = f"{namespace}:other"
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "a", DEEP),))
        self.publish(adapter, self.topic(other, "a/b"), b"other")
        self.publish(adapter, self.topic(namespace, "a/b"), b"mine")
        assert [m.body for m in self.receive(handle, 1)] == [b"mine"]
        self.assert_quiet(adapter, handle, self.topic(namespace, "a/b"))

    def test_patterns_none_gets_everything(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        other = f"{namespace}:other"
        handle = self.subscribe(adapter, unique_name(), None)
        self.publish(adapter, self.topic(namespace, "a"), b"1")
        self.publish(adapter, self.topic(namespace, "a/b/c"), b"2")
        self.publish(adapter, self.topic(other, "x"), b"3")
        mine: list[Received] = []
        deadline = time.monotonic() + self.receive_timeout
        while len(mine) < 3 and time.monotonic() < deadline:
            # a shared broker may carry other suites' traffic: keep only ours
            for m in self.puller(handle).pull(100, timeout=0.5):
                m.ack()
                if m.topic.namespace in (namespace, other):
                    mine.append(m)
        assert sorted(m.body for m in mine) == [b"1", b"2", b"3"]

    def test_patterns_none_skips_internal(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """``patterns=None`` is every topic of every *non-internal* namespace: a topic of an
        internal namespace (``INTERNAL_NAMESPACE_PREFIX``, e.g. a pull point inbox) reaches
        only subscriptions that name it."""
        internal = f"{INTERNAL_NAMESPACE_PREFIX}conformance:{uuid.uuid4().hex}"
        everything = self.subscribe(adapter, unique_name(), None)
        inbox = self.subscribe(adapter, unique_name(), (self.pattern(internal, "inbox"),))
        self.publish(adapter, self.topic(internal, "inbox"), b"internal")
        self.publish(adapter, self.topic(namespace, "a"), b"public")
        assert [m.body for m in self.receive(inbox, 1)] == [b"internal"]
        mine: list[Received] = []
        deadline = time.monotonic() + self.receive_timeout
        while time.monotonic() < deadline:
            # a shared broker may carry other suites' traffic: keep only ours
            for m in self.puller(everything).pull(100, timeout=0.2):
                m.ack()
                if m.topic.namespace in (namespace, internal):
                    mine.append(m)
            if any(m.body == b"public" for m in mine):
                break
        # the public message, published after the internal one, arrived, and so does a
        # sentinel after both
        mine += self.barrier(adapter, everything, self.topic(namespace, "a"))
        assert [
            (m.topic.namespace, m.body) for m in mine if m.topic.namespace in (namespace, internal)
        ] == [(namespace, b"public")]

    def test_union_patterns_deliver_one_copy(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        patterns: list[PathPattern] = [self.pattern(namespace, "a", "b")]
        syntax = adapter.capabilities.syntax
        if syntax.regex or syntax.single_level is not None:
            patterns.append(self.pattern(namespace, "a", ANY))
        if syntax.regex or syntax.multi_level is not None:
            patterns.append(self.pattern(namespace, "a", DEEP))
        patterns.append(self.pattern(namespace, "c"))
        handle = self.subscribe(adapter, unique_name(), tuple(patterns))
        self.publish(adapter, self.topic(namespace, "a/b"), b"once")
        assert [m.body for m in self.receive(handle, 1)] == [b"once"]
        self.assert_quiet(adapter, handle, self.topic(namespace, "a/b"))

    def test_rebind_changes_patterns(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        name = unique_name()
        self.subscribe(adapter, name, (self.pattern(namespace, "old"),))
        handle = self.subscribe(adapter, name, (self.pattern(namespace, "new"),))
        self.publish(adapter, self.topic(namespace, "old"), b"old")
        self.publish(adapter, self.topic(namespace, "new"), b"new")
        assert [m.body for m in self.receive(handle, 1)] == [b"new"]
        self.assert_quiet(adapter, handle, self.topic(namespace, "new"))


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
        require(adapter, "native_queue_limits")
        limits = QueueLimits(max_age=timedelta(milliseconds=300))
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),), limits)
        self.publish(adapter, self.topic(namespace, "t"), b"old")
        time.sleep(1.0)
        self.publish(adapter, self.topic(namespace, "t"), b"fresh")
        got = self.receive(handle, 1)
        got += self.barrier(adapter, handle, self.topic(namespace, "t"))
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
        grave, box = self._grave(adapter, unique_name)
        require(adapter, "native_queue_limits")  # otherwise core drops what is too old
        name = unique_name()
        limits = QueueLimits(max_age=timedelta(milliseconds=300))
        handle = self.subscribe(
            adapter, name, (self.pattern(namespace, "t"),), limits, dead_letters=grave
        )
        published = datetime.now(UTC)
        self.publish(adapter, self.topic(namespace, "t"), b"old")
        time.sleep(1.0)  # past max_age: what is asserted is that it arrives below
        self.publish(adapter, self.topic(namespace, "t"), b"fresh")
        got = self.receive(handle, 1) + self.barrier(adapter, handle, self.topic(namespace, "t"))
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


class CurrentMessage(AdapterFixtures):
    """The middleware keeps the last message per topic (``retained_current_message``)."""

    def test_last_message_per_topic(self, adapter: Adapter, namespace: str) -> None:
        require(adapter, "retained_current_message")
        topic = self.topic(namespace, "cur/a")
        assert adapter.current_message(topic) is None
        self.publish(adapter, topic, b"<first/>")
        self.publish(adapter, topic, b"<second/>", **{"x-h": "v"})
        self.publish(adapter, self.topic(namespace, "cur/b"), b"<other/>")
        deadline = time.monotonic() + self.receive_timeout
        cur = adapter.current_message(topic)
        while (cur is None or cur.body != b"<second/>") and time.monotonic() < deadline:
            time.sleep(0.05)
            cur = adapter.current_message(topic)
        assert cur is not None
        assert cur.body == b"<second/>"
        assert cur.topic == topic
        if adapter.capabilities.native_headers:
            assert cur.headers.get("x-h") == "v"

    def test_no_current_message_for_parent(self, adapter: Adapter, namespace: str) -> None:
        require(adapter, "retained_current_message")
        self.publish(adapter, self.topic(namespace, "p/child"), b"<c/>")
        assert adapter.current_message(self.topic(namespace, "p")) is None


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


class HeadersAndBodies(AdapterFixtures):
    """Bodies are opaque bytes; headers and content type travel with them."""

    def test_binary_body_round_trips(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "bin"),))
        body = bytes(range(256)) * 4 + b"\x00\xff\x00"
        self.publish(adapter, self.topic(namespace, "bin"), body)
        (m,) = self.receive(handle, 1)
        assert m.body == body
        assert m.topic == self.topic(namespace, "bin")

    def test_large_body(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        limit = adapter.capabilities.max_message_bytes
        size = 512 * 1024 if limit is None else min(512 * 1024, limit // 2)
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "big"),))
        body = b"<big>" + b"x" * size + b"</big>"
        self.publish(adapter, self.topic(namespace, "big"), body)
        (m,) = self.receive(handle, 1)
        assert m.body == body

    def test_headers_round_trip(self, adapter: Adapter, namespace: str, unique_name: Names) -> None:
        require(adapter, "native_headers")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "h"),))
        headers = {"x-plain": "value", "x-unicode": "é€😀", "x-empty": ""}
        msg = OutboundMessage(
            topic=self.topic(namespace, "h"),
            body=b"<h/>",
            message_id=uuid.uuid4().hex,
            headers=headers,
            content_type="application/octet-stream",
        )
        adapter.publish(msg)
        (m,) = self.receive(handle, 1)
        for key, value in headers.items():
            assert m.headers.get(key) == value, key
        assert m.content_type == "application/octet-stream"

    def test_topic_headers_given_by_core_are_kept(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        """A message routed on one topic whose ``wsnmom-topic-*`` headers name another (a
        copy into a pull point inbox keeps the topic it was published on) arrives with
        those headers unchanged, while ``Received.topic`` is the routing topic."""
        require(adapter, "native_headers")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "inbox"),))
        headers = {HEADER_TOPIC_NAMESPACE: f"{namespace}:origin", HEADER_TOPIC_PATH: "a/b"}
        adapter.publish(self.message(self.topic(namespace, "inbox"), b"<copy/>", headers))
        (m,) = self.receive(handle, 1)
        assert m.headers.get(HEADER_TOPIC_NAMESPACE) == f"{namespace}:origin"
        assert m.headers.get(HEADER_TOPIC_PATH) == "a/b"
        assert m.topic == self.topic(namespace, "inbox")


class Peek(AdapterFixtures):
    """``SubscriptionHandle.peek``: an operator's look at the waiting messages that leaves
    them exactly where they are (``Capabilities.peek``), or a refusal that says why."""

    def _peek_until(self, handle: SubscriptionHandle, n: int) -> list[Any]:
        """Peek until ``n`` messages show (a log's head must have read what was just
        published before they count as waiting) or the receive timeout passed."""
        deadline = time.monotonic() + self.receive_timeout
        while len(seen := handle.peek(n)) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return seen

    def test_peek_shows_and_leaves_waiting_messages(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "peek")
        topic = self.topic(namespace, "t")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        bodies = [b"%d" % i for i in range(5)]
        adapter.publish_many([self.message(topic, b, {"x-peek": b.decode()}) for b in bodies])
        everything = self._peek_until(handle, 5)
        assert sorted(m.body for m in everything) == bodies
        first = handle.peek(3)
        assert len(first) == 3
        if adapter.capabilities.ordering == "subscription":
            assert [m.body for m in first] == bodies[:3]
        assert [m.body for m in handle.peek(3)] == [m.body for m in first], "peek changed them"
        for m in everything:
            assert m.topic == topic
            if adapter.capabilities.native_headers:
                assert m.headers.get("x-peek") == m.body.decode()
        depth = handle.depth()
        assert depth is None or depth >= 5
        # still there, handed out once, as if nobody had looked
        got = self.receive(handle, 5)
        assert sorted(m.body for m in got) == bodies
        assert not any(m.redelivered for m in got)
        self.assert_quiet(adapter, handle, topic)
        assert handle.peek(5) == []

    def test_peek_of_an_empty_subscription(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "peek")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        assert handle.peek(10) == []

    def test_peek_leaves_out_handed_out_messages(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "peek")
        require(adapter, "native_pull")
        topic = self.topic(namespace, "t")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        adapter.publish_many([self.message(topic, b"%d" % i) for i in range(3)])
        self.wait_routed(handle, 3)
        (out,) = self.receive(handle, 1, ack=False)
        assert out.body == b"0"
        assert [m.body for m in handle.peek(10)] == [b"1", b"2"]
        out.nack(requeue=True)
        assert [m.body for m in handle.peek(10)] == [b"0", b"1", b"2"]

    def test_peek_refused_says_why(
        self, adapter: Adapter, namespace: str, unique_name: Names
    ) -> None:
        require(adapter, "peek", False)
        topic = self.topic(namespace, "t")
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t"),))
        self.publish(adapter, topic, b"kept")
        with pytest.raises(NotImplementedError) as refused:
            handle.peek(1)
        assert len(str(refused.value)) > 20, "the refusal must say why"
        (got,) = self.receive(handle, 1)
        assert got.body == b"kept" and not got.redelivered


class AdapterConformance(
    AdapterBasics,
    TopicRouting,
    AckSemantics,
    PullSemantics,
    PauseResume,
    Durability,
    QueueLimitsSemantics,
    DroppedToDeadLetters,
    CurrentMessage,
    Delete,
    HeadersAndBodies,
    Peek,
):
    """Every conformance group.  Subclass it (name it ``Test...``) and give ``adapter_url``."""
