"""MQTT cluster mode: the adapter's questions to core's store (adapters/mqtt/store_questions.py),
asked of PostgreSQL as core asks it (``Store.held``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from wsnmom.adapters.mqtt.store_questions import REPLY_AT_ONCE, Answer, StoreQuestions
from wsnmom.core.store_postgres import PostgresStore

from tests.core.test_store_conformance import subscription
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt


@pytest.fixture
def store(postgres_store_url: str) -> Iterator[PostgresStore]:
    pg = PostgresStore(postgres_store_url, instance_id="questions")
    yield pg
    pg.close()


def test_a_waiting_question_is_answered_while_every_reply_thread_is_busy(
    store: PostgresStore,
) -> None:
    """A burst's replies each wait for the broker (subscribe, end a session) on the
    :data:`REPLY_AT_ONCE` reply threads; a restart's check (``answer``, on a handle's
    timer thread) asked meanwhile still gets the store's answer within its timeout.
    Before, its reply was queued behind theirs: past the timeout it took "not known" (the
    session not made again for ``reconnect_max_delay``, what was published meanwhile
    lost)."""
    store.put_subscription(subscription("kept"))
    questions = StoreQuestions()
    questions.held = store.held
    release = threading.Event()
    replying: list[Answer] = []

    def slow(answer: Answer) -> None:  # a broker round trip that does not come back
        replying.append(answer)
        assert release.wait(30)

    try:
        for n in range(REPLY_AT_ONCE):
            questions.ask(f"lost-{n}", slow)
        wait_until(lambda: len(replying) == REPLY_AT_ONCE, 10, what="every reply thread busy")
        assert questions.answer("kept", timeout=5.0) is True
        assert questions.answer("never-made", timeout=5.0) is False
    finally:
        release.set()
        questions.close()
    assert replying == [False] * REPLY_AT_ONCE
