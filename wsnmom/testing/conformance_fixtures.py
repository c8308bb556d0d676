"""The conformance kit's fixtures and helpers (a part of :mod:`wsnmom.testing.conformance`,
which plugin authors import from): :class:`AdapterFixtures`, the base of every group (the
adapter under test, unique names, publishing, subscribing, pulling, and the sentinel
barriers that check that something did not arrive), :class:`Collector` (a push handler
that records), :data:`SENTINEL` and the capability skips :func:`require` and
:func:`require_pattern_support`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from wsnmom.core.adapter import (
    Adapter,
    OutboundMessage,
    PublishReceipt,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.topic_mapping.model import PathPattern, Segment, Topic
from wsnmom.topic_mapping.syntax import WildcardSyntax

#: fixture types: a factory of unique subscription names, a factory of open adapters
Names = Callable[[], str]
MakeAdapter = Callable[[], Adapter]
#: what the kit pulls from: the handle itself, or a pull buffer over a push-only handle
Puller = SubscriptionHandle | PullBuffer
#: messages a pull buffer of the kit holds (well above what any test publishes)
KIT_BUFFER = 1000


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
        """Wait until at least ``n`` messages arrived; returns all so far.

        :raises AssertionError: fewer than ``n`` arrived within ``timeout`` seconds (a
            wait that runs out is never a pause: wait for a sentinel instead).
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self.received) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{len(self.received)} of {n} message(s) within {timeout:g} s"
                    )
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
        """Pull buffers over the push-only handles of one test (stopped and dropped at
        teardown: pytest keeps the test's instance to the end of the run, and a buffer
        keeps its handle and so the closed adapter, its sockets and threads' memory)."""
        self._buffers: dict[int, PullBuffer] = {}
        yield
        for buffer in self._buffers.values():
            with contextlib.suppress(Exception):
                buffer.stop()
        self._buffers.clear()

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
        """Pull until ``n`` messages arrived (acked unless ``ack`` is false).

        :raises AssertionError: fewer arrived within the timeout (the receive timeout
            unless given); never a pause before an absence: use :meth:`barrier`.
        """
        wait = self.receive_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        got: list[Received] = []
        while len(got) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                bodies = [m.body for m in got]
                raise AssertionError(f"{len(got)} of {n} message(s) within {wait:g} s: {bodies}")
            batch = self.puller(handle).pull(n - len(got), timeout=min(remaining, 0.5))
            assert len(batch) <= n - len(got), "pull returned more than max_messages"
            got.extend(batch)
        if ack:
            for m in got:
                m.ack()
        return got

    def take_until(self, handle: SubscriptionHandle, n: int) -> list[Received]:
        """``take`` until ``n`` messages arrived.

        :raises AssertionError: fewer within the receive timeout.
        """
        deadline = time.monotonic() + self.receive_timeout
        got: list[Received] = []
        while len(got) < n:
            if time.monotonic() >= deadline:
                bodies = [m.body for m in got]
                raise AssertionError(
                    f"{len(got)} of {n} message(s) taken within {self.receive_timeout:g} s: "
                    f"{bodies}"
                )
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

    def young(
        self, adapter: Adapter, handle: SubscriptionHandle, topic: Topic
    ) -> list[Received] | None:
        """For a ``max_age`` test, once the old messages are past it: start taking from
        ``handle`` (a push-only handle's consumer starts at the first pull), then publish
        ``b"fresh"`` and a sentinel to ``topic`` and pull until the sentinel arrives;
        returns the messages pulled before it (acked).  The fresh message is taken as
        soon as it is stored, so it expires only on a machine slower than the window:
        then (no sentinel within the receive timeout) returns None, and the test tries a
        longer ``max_age``.  The consumer started before the publish is what makes the
        window hold: started after it, the consumer's start counted against the fresh
        message's age (300 ms missed in a run of the suite on three workers)."""
        got = self.puller(handle).pull(KIT_BUFFER)  # nothing old: it expired before this
        self.publish(adapter, topic, b"fresh")
        self.publish(adapter, topic, SENTINEL)
        deadline = time.monotonic() + self.receive_timeout
        while not any(m.body == SENTINEL for m in got) and time.monotonic() < deadline:
            got += self.puller(handle).pull(KIT_BUFFER, timeout=0.1)
        for m in got:
            m.ack()
        if not any(m.body == SENTINEL for m in got):
            return None
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
