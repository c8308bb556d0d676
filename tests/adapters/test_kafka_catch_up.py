"""The cursor engine's shared catch-up read (adapters/logbase/catch_up.py, ``_gather``) on
a real Kafka-protocol broker, in cluster mode: an instance takes over many subscriptions
behind the head, at equal and at different positions (what a failover leaves), reads
each stream once for the cursors that start at the same positions, and each cursor gets
every record from its own saved position on, exactly once and in order; the position
writes of the cursors the lease fence refuses (a zombie's) stay dropped."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.core.adapter import OutboundMessage, SpecOrigin, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_kafka_conformance import isolated_options
from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.kafka

NS = "http://example.org/plant"
TOPIC = Topic(NS, ("line", "speed"))
#: seconds to wait for what is expected (a sentinel included); generous under load
WAIT = 30.0


def message(body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=TOPIC, body=body, message_id=uuid.uuid4().hex)


def spec(name: str, origin: SpecOrigin = "") -> SubscriptionSpec:
    return SubscriptionSpec(name, (PathPattern(NS, TOPIC.path),), origin=origin)


class _CountingReaders:
    """Wraps the backend's ``reader`` of an open adapter: counts the catch-up readers'
    assignments, and holds the first poll until ``release`` (so every cursor is queued
    before the reader serves the second one)."""

    def __init__(self, adapter: KafkaAdapter) -> None:
        self.backend = adapter.cursor_engine().backend
        self.make = self.backend.reader
        self.assigns = 0
        self.release = threading.Event()
        self.backend.reader = self._reader  # type: ignore[method-assign]

    def _reader(self) -> Any:
        inner = self.make()
        outer = self

        class Reader:
            def assign(self, positions: Mapping[Any, int]) -> None:
                outer.assigns += 1
                inner.assign(positions)

            def poll(self, max_records: int, timeout: float) -> Any:
                assert outer.release.wait(WAIT)
                return inner.poll(max_records, timeout)

            def close(self) -> None:
                inner.close()

        return Reader()


@pytest.fixture
def instances(kafka_url: str) -> Iterator[Callable[[str, Callable[[str], bool]], KafkaAdapter]]:
    """Gateway instances of one cluster: the same topics and subscription groups, each
    with a head group of its own and the given lease fence (``may_save``)."""
    options = isolated_options()
    made: list[KafkaAdapter] = []

    def make(name: str, may_save: Callable[[str], bool], **extra: Any) -> KafkaAdapter:
        adapter = KafkaAdapter(
            kafka_url, {**options, "head_group": f"{options['head_group']}.{name}", **extra}
        )
        adapter.shared_by_instances(may_save)
        adapter.open()
        made.append(adapter)
        return adapter

    yield make
    for adapter in reversed(made):
        adapter.close()


def test_cursors_taken_over_behind_the_head_get_every_record_once_in_order(
    instances: Callable[..., KafkaAdapter],
) -> None:
    zombies = {"g1-0", "g1-1", "g0-0"}  # this instance's lease on them lapsed
    dead = instances("dead", lambda name: True)
    survivor = instances("survivor", lambda name: name not in zombies, catch_up_readers=1)
    groups = {g: [f"g{g}-{i}" for i in range(8)] for g in range(3)}
    names = [n for members in groups.values() for n in members]
    for name in names:  # made through the survivor before the topic's first record
        survivor.subscription(spec(name, "new"))
    dead.publish_many([message(b"pre")])
    bodies = [b"m%d" % i for i in range(10)]
    dead.publish_many([message(b) for b in bodies])
    # the dead instance delivered groups 1 and 2 and settled the first 4 and 7 records
    # of each before it stopped: its saved positions are there
    settled = {1: 4, 2: 7}
    held: dict[str, Collector] = {}
    for g in settled:
        for name in groups[g]:
            held[name] = Collector(ack=False)
            # the dead instance follows them (it has a head group of its own)
            dead.subscription(spec(name, "elsewhere")).start(held[name], prefetch=100)
    for name, got in held.items():
        got.wait_for(10, WAIT)
        for received in got.received[: settled[int(name[1])]]:
            received.ack()
    dead.close()  # saves the positions below the first unsettled record
    store = survivor.cursor_engine().backend.position_store()
    first = {n: store.load_one(n) or {} for n in names}

    def saved(positions: Mapping[tuple[str, int], int]) -> int:
        """The saved offset in the topic's stream (0: none saved, read from its start)."""
        return next((o for (log, _), o in positions.items() if log.endswith("line.speed")), 0)

    starts = {n: saved(first[n]) for n in names}
    # group 0 where it was made (nothing saved: each stream from its start), groups 1
    # and 2 past the records settled ("pre" is offset 0; before, a cursor the survivor
    # saved no start for was started by the dead instance at its own end, past "pre")
    assert {starts[n] for n in groups[0]} == {0}, starts
    assert {starts[n] for n in groups[1]} == {4}, starts
    assert {starts[n] for n in groups[2]} == {7}, starts

    readers = _CountingReaders(survivor)
    got = {name: Collector() for name in names}
    for name in names:
        survivor.subscription(spec(name)).start(got[name], prefetch=100)
    readers.release.set()
    survivor.publish_many([message(b"end")])  # the sentinel, read by the head
    everything = [b"pre", *bodies, b"end"]  # offsets 0 to 11
    for name in names:
        got[name].wait_for_body(b"end", WAIT)
        assert got[name].bodies() == everything[starts[name] :], name
    # one read per start position, not one per cursor (the first cursor is served
    # alone: the others were not queued yet when the reader took it)
    assert readers.assigns <= 1 + len(set(starts.values())) + 2, readers.assigns

    # every cursor this instance still holds saves past the sentinel; the zombies'
    # positions stay where the dead instance left them
    def saved_past_the_sentinel() -> bool:
        return all(saved(store.load_one(n) or {}) == 12 for n in names if n not in zombies)

    wait_until(saved_past_the_sentinel, WAIT, what="the survivor saving its positions")
    for name in zombies:
        assert store.load_one(name) == first[name], name


def test_subscriptions_made_before_their_topics_first_record_get_it_whoever_delivers(
    instances: Callable[..., KafkaAdapter],
) -> None:
    """Subscriptions made through one instance before their topic had a record, the
    first records published, then another instance (a head group of its own, already
    reading the topic's stream past them) follows them; half are delivered by each.
    Every one gets every record: the follower takes up the start the maker saved, and
    reads the stream that start has no position in from its beginning, not from where
    its own head is."""
    maker = instances("maker", lambda name: True)
    follower = instances("follower", lambda name: True)
    names = [f"s{i}" for i in range(6)]
    made = {name: maker.subscription(spec(name, "new")) for name in names}
    # a subscription the follower delivers: once it has the first records, the
    # follower's head reads the topic's stream past them
    witness = Collector()
    follower.subscription(spec("witness", "new")).start(witness, prefetch=100)
    first = [b"f%d" % i for i in range(3)]
    maker.publish_many([message(b) for b in first])
    witness.wait_for(len(first), WAIT)
    followed = {name: follower.subscription(spec(name, "elsewhere")) for name in names}
    got = {name: Collector() for name in names}
    for i, name in enumerate(names):
        (made if i % 2 else followed)[name].start(got[name], prefetch=100)
    maker.publish_many([message(b"end")])  # the sentinel
    for name in names:
        got[name].wait_for_body(b"end", WAIT)
        assert got[name].bodies() == [*first, b"end"], name
