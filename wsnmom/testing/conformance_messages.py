"""Conformance groups (a part of :mod:`wsnmom.testing.conformance`) of the messages
themselves: :class:`CurrentMessage` (the last one per topic), :class:`HeadersAndBodies`
(bodies, headers and content type round-trip) and :class:`Peek` (looking without taking).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from wsnmom.core.adapter import (
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    Adapter,
    OutboundMessage,
    SubscriptionHandle,
)
from wsnmom.testing.conformance_fixtures import (
    AdapterFixtures,
    Names,
    require,
)


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
        published before they count as waiting); fails after the receive timeout."""
        deadline = time.monotonic() + self.receive_timeout
        while len(seen := handle.peek(n)) < n:
            assert time.monotonic() < deadline, f"{len(seen)} of {n} message(s) to peek at"
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
