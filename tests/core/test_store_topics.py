"""The topics a cluster's instances share (``Store.record_topics``, ``core.topic_share``),
on SQLite and on PostgreSQL alike: recorded once in the order first recorded, and on
PostgreSQL a first recording, not a repeated one, leaves a change the other instances
follow."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.core.coordination import Change
from wsnmom.core.store import Store
from wsnmom.core.store_documents import topic_from_key, topic_key
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.model import Topic


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
    else:
        url = request.getfixturevalue("postgres_store_url")
    opened = open_store(url)
    yield opened
    opened.close()


A = Topic("urn:t", ("a",))
AB = Topic("urn:t", ("a", "b"))
ODD = Topic("urn:odd:{x}/y", ("c", "d"))


def test_topics_are_recorded_once_in_the_order_first_recorded(store: Store) -> None:
    assert store.list_topics() == []
    store.record_topics([AB, A])
    store.record_topics([A, ODD])  # A again: kept as it is
    store.record_topics([])
    assert store.list_topics() == [AB, A, ODD]


def test_a_topic_key_reads_back_whatever_its_namespace_holds() -> None:
    for topic in (A, AB, ODD, Topic("", ("e",))):
        assert topic_from_key(topic_key(topic)) == topic
    assert topic_key(AB) == "{urn:t}a/b"
    for bad in ("a/b", "{urn:t}", "urn:t}a"):
        with pytest.raises(ValueError):
            topic_from_key(bad)


def test_a_first_recording_leaves_a_change_for_the_other_instances(
    postgres_store_url: str,
) -> None:
    writer = open_store(postgres_store_url, instance_id="writer")
    reader = open_store(postgres_store_url, instance_id="reader")
    try:
        others = reader.coordination("reader")
        cursor = others.cursor()
        writer.record_topics([A, AB])
        writer.record_topics([A])  # recorded already: no second change
        _, changes = others.changes(cursor)
        assert changes == [Change("topic", topic_key(A)), Change("topic", topic_key(AB))]
    finally:
        writer.close()
        reader.close()


def test_recording_within_a_bound_keeps_the_first_and_returns_the_rest(store: Store) -> None:
    store.record_topics([A])
    refused = store.record_topics([A, AB, ODD, Topic("urn:t", ("c",))], within=2)
    assert refused == [ODD, Topic("urn:t", ("c",))]  # A known already: neither room nor refusal
    assert store.list_topics() == [A, AB]
    assert store.record_topics([AB, A], within=2) == []  # recorded ones pass a full table
    assert store.record_topics([ODD], within=5) == []
    assert store.list_topics() == [A, AB, ODD]


def test_instances_recording_at_once_never_pass_the_bound(postgres_store_url: str) -> None:
    """Four stores (instances) record 40 new topics each at once, in batches of 5, within
    a bound of 50: exactly 50 are recorded, and every other one is returned to its
    recorder."""
    stores = [open_store(postgres_store_url, instance_id=f"i{n}") for n in range(4)]
    refused: list[list[Topic]] = [[] for _ in stores]
    start = threading.Barrier(len(stores))

    def record(n: int) -> None:
        start.wait()
        for batch in range(8):
            topics = [Topic("urn:race", (f"i{n}", f"t{batch}-{k}")) for k in range(5)]
            refused[n].extend(stores[n].record_topics(topics, within=50))

    try:
        threads = [threading.Thread(target=record, args=(n,)) for n in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        recorded = stores[0].list_topics()
        assert len(recorded) == 50
        assert sum(len(r) for r in refused) == 4 * 40 - 50
        assert not set(recorded) & {t for r in refused for t in r}
    finally:
        for s in stores:
            s.close()
