"""The topics a cluster's instances share (``Store.record_topics``, ``core.topic_share``),
on SQLite and on PostgreSQL alike: recorded once in the order first recorded, and on
PostgreSQL a first recording, not a repeated one, leaves a change the other instances
follow."""

from __future__ import annotations

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
