"""One topic set for a cluster (``core.topic_share``): a topic admitted here is recorded
by a thread of its own, so the admission makes no store round trip and a store that does
not answer fails no request (the topic is recorded once it answers again); recorded
topics are taken in; a fixed topic set never changes."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from wsnmom.core import metrics, topic_share
from wsnmom.core.guard import refusals
from wsnmom.core.store import StoreUnavailable
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.core.topic_share import SharedTopics
from wsnmom.topic_mapping.errors import TopicNotSupported
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.namespaces import TopicNamespace
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.support.waiting import wait_until

A = Topic("urn:t", ("a",))
B = Topic("urn:t", ("b",))
DECLARED = "urn:declared"


class DownStore(SqliteStore):
    """A SQLite store whose topic recordings fail while ``down`` (a store that does not
    answer)."""

    down = False

    def record_topics(self, topics: Sequence[Topic], within: int | None = None) -> list[Topic]:
        if self.down:
            raise StoreUnavailable("down for the test")
        return super().record_topics(topics, within)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DownStore]:
    opened = DownStore(str(tmp_path / "store.db"))
    yield opened
    opened.close()


def test_a_topic_admitted_here_is_recorded_and_one_recorded_elsewhere_taken_in(
    store: DownStore,
) -> None:
    store.record_topics([B])  # another instance's
    topic_set = TopicSet()
    shared = SharedTopics(store, topic_set)
    shared.start()
    try:
        assert B in topic_set  # taken in at start, and not recorded again
        assert topic_set.admit(A) is True
        assert topic_set.admit(A) is False  # a member: nothing to record
        wait_until(lambda: store.list_topics() == [B, A], what="A recorded")
    finally:
        shared.stop()
    assert shared.pending == 0


def test_a_store_that_does_not_answer_fails_no_admission(
    store: DownStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topic_share, "RETRY_EVERY", 0.05)
    store.down = True
    topic_set = TopicSet()
    shared = SharedTopics(store, topic_set)
    shared.start()
    try:
        assert topic_set.admit(A) is True  # answered although the store is down
        wait_until(lambda: not shared.flush(), what="a failed recording")
        assert A in topic_set and shared.pending == 1
        store.down = False
        wait_until(lambda: store.list_topics() == [A], what="A recorded once the store answers")
    finally:
        shared.stop()


def test_a_fixed_topic_set_takes_in_nothing_and_records_nothing(store: DownStore) -> None:
    store.record_topics([B])
    topic_set = TopicSet((), [Topic("urn:fixed", ("x",))], fixed=True)
    shared = SharedTopics(store, topic_set)
    shared.start()
    try:
        assert topic_set.topics() == [Topic("urn:fixed", ("x",))]
        with pytest.raises(TopicNotSupported):
            topic_set.admit(A)
    finally:
        shared.stop()
    assert store.list_topics() == [B]


def test_a_recorded_topic_the_namespaces_here_forbid_is_left_out() -> None:
    declared = TopicNamespace(DECLARED)
    declared.define(("root",), final=True)
    topic_set = TopicSet([declared])
    forbidden = [Topic(DECLARED, ("other",)), Topic(DECLARED, ("root", "child"))]
    assert topic_set.take_in([*forbidden, A]) == [A]
    assert topic_set.take_in([A]) == []
    assert set(topic_set.topics()) == {Topic(DECLARED, ("root",)), A}


def unrecorded() -> float:
    return metrics.REGISTRY.get_sample_value("wsnmom_topics_not_recorded_total") or 0.0


def test_a_topic_the_recorded_set_has_no_room_for_stays_here_unrecorded(
    store: DownStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Another instance filled the recorded topics up to the bound meanwhile: a topic
    admitted here (its message accepted) stays in this topic set, is not recorded, and
    is counted and logged; the next recordings are not held up by it."""
    store.record_topics([B])  # the other instance's, recorded after this one's start
    topic_set = TopicSet()
    shared = SharedTopics(store, topic_set, limit=1)
    before = unrecorded()
    assert topic_set.admit(A, limit=1) is True  # this instance knew of no topic yet
    shared.admitted(A)  # (what the listener does once started)
    refusals.reset()  # (the line is throttled: another test may have written one)
    with caplog.at_level(logging.WARNING, "wsnmom.access"):
        assert shared.flush() is True
    assert shared.pending == 0 and A in topic_set
    assert store.list_topics() == [B]
    assert unrecorded() == before + 1
    assert "quotas.ad_hoc_topics" in caplog.text
    assert topic_set.take_in(store.list_topics()) == [B]  # the recorded set still reaches it
