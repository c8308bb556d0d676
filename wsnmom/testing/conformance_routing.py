"""Conformance groups (a part of :mod:`wsnmom.testing.conformance`): :class:`AdapterBasics`
(open, ping, close, class attributes) and :class:`TopicRouting` (which subscriptions a
topic reaches: exact, wildcards, namespaces, internal topics, unions, re-binding).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from wsnmom.core.adapter import (
    INTERNAL_NAMESPACE_PREFIX,
    Adapter,
    Capabilities,
    PublishReceipt,
    Received,
)
from wsnmom.core.adapter_options import AdapterOptionError, describe_options
from wsnmom.testing.conformance_fixtures import (
    AdapterFixtures,
    MakeAdapter,
    Names,
    require_pattern_support,
)
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern
from wsnmom.topic_mapping.syntax import WildcardSyntax


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

    def test_says_why_it_is_unavailable(self, make_adapter: MakeAdapter) -> None:
        """``unavailable_reason`` (core's 503 and ``/readyz`` text, no I/O): None while the
        adapter is available; a non-empty text once ``available()`` says False (here:
        closed).  Skipped for an adapter that does not report availability or keeps the
        default reason (None: the refusal then names the middleware only)."""
        adapter = make_adapter()
        assert adapter.available() is True
        assert adapter.unavailable_reason() is None
        adapter.close()
        if adapter.available():
            pytest.skip("available: the adapter does not report an outage (the default)")
        why = adapter.unavailable_reason()
        if why is None and type(adapter).unavailable_reason is Adapter.unavailable_reason:
            pytest.skip("unavailable_reason: the adapter gives none (the default)")
        assert isinstance(why, str) and why.strip(), f"unavailable but says {why!r}"

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
        # settled: each holds what was routed to it, or (a log, whose cursors that never
        # started count every record after their position) all six; or no depths at all
        settled = ([1, 2, 3], [6, 6, 6], [None, None, None], [0, 0, 0])
        deadline = time.monotonic() + self.receive_timeout
        while (single := [h.depth() for h in handles]) not in settled:
            assert time.monotonic() < deadline, f"depths {single}, not one of {settled}"
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
