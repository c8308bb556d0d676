"""MQTT cluster mode, adapter level: a subscription session found gone from the broker
together with its record is made again while core's store still holds the subscription
(``Adapter.kept_in_store``; a broker that lost its state), and never when a delete
through another instance removed it (core deletes the store's record first, then the
session, then the session's record; docs/scale-out.md "MQTT in cluster mode").
``stored`` plays core's store: the names it holds."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
from wsnmom.adapters.mqtt.cluster_sessions import SubscriptionSessions
from wsnmom.core.adapter import AdapterError

from tests.adapters.test_mqtt_cluster import Collector, Instance, session_present
from tests.fixtures.mosquitto import MosquittoNode
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt


class Store:
    """Core's store as the adapters ask it (``kept_in_store``): the names it holds, and
    the names asked, in order."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.asked: list[str] = []
        #: called with the name before each answer is returned (a race played there)
        self.answering: Callable[[str, bool], None] = lambda name, there: None

    def __call__(self, name: str) -> bool:
        self.asked.append(name)
        there = name in self.names
        self.answering(name, there)
        return there


def sessions_of(inst: Instance) -> SubscriptionSessions:
    cnode = inst.adapter._cnode
    assert cnode is not None
    return cnode.sessions


def delivering(a: Instance, b: Instance, name: str) -> tuple[Collector, ClusterHandle]:
    """B's handle of subscription ``name``, started, once a message published through A
    reached its consumer; and that consumer."""
    consumer = Collector()
    hb = b.handle(name)
    hb.start(consumer, prefetch=4)
    a.publish(b"one")
    wait_until(lambda: consumer.has(b"one"), 20, what="a delivery through B")
    return consumer, hb


#: the instances' longest reconnect backoff: a session found gone is asked about again
#: after it, and after each failed question (the default, 10 s, made the store-failure
#: test wait 10 s before the store's answer was asked for again)
RETRY = 1.0


@pytest.fixture
def two(mqtt_url: str, tmp_path: Path) -> Iterator[tuple[Instance, Instance, Store]]:
    """Two instances on the session's broker, one store."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    store = Store()
    made = [
        Instance(mqtt_url, tmp_path / f"i{i}", prefix, reconnect_max_delay=RETRY) for i in range(2)
    ]
    for inst in made:
        inst.adapter.kept_in_store(store)
    yield made[0], made[1], store
    for inst in reversed(made):
        inst.adapter.close()


def test_a_session_lost_by_the_broker_is_made_again_while_the_store_holds_it(
    mosquitto_factory: Callable[..., MosquittoNode], tmp_path: Path
) -> None:
    node = mosquitto_factory()
    inst = Instance(node.url, tmp_path / "i0", f"c{uuid.uuid4().hex[:8]}")
    try:
        inst.adapter.kept_in_store(Store("s1"))
        consumer = Collector()
        h = inst.handle("s1")
        h.start(consumer, prefetch=4)
        inst.publish(b"before")
        wait_until(lambda: consumer.has(b"before"), 20, what="a delivery before the loss")
        node.restart_empty()
        bodies = iter(b"after-%d" % i for i in range(100_000))

        def delivered_after() -> bool:
            with contextlib.suppress(AdapterError):  # the publisher is not back yet
                inst.publish(next(bodies))
            return any(b.startswith(b"after-") for b in consumer.bodies())

        wait_until(delivered_after, 30, what="a delivery of a message published after the loss")
        assert h.remade == 1 and h.unrecorded == 0
        assert inst.adapter.stats()["sessions_remade"] == 1
        assert sessions_of(inst).recorded(h.client_id) == h.filters
    finally:
        inst.adapter.close()


def test_a_delete_through_another_instance_is_not_undone(
    two: tuple[Instance, Instance, Store], mqtt_url: str
) -> None:
    """Core's order: the store's record, then the session, then its record.  B, which
    delivers and has not followed the deletion, finds the session gone, its record gone
    and the store without it: not made again."""
    a, b, store = two
    store.names.add("s4")
    _, hb = delivering(a, b, "s4")
    store.names.discard("s4")
    a.adapter.delete_subscription("s4")
    wait_until(lambda: hb.unrecorded >= 1, 20, what="B's restart finding no record, no store")
    assert hb.sessions_lost == 1 and hb.remade == 0
    assert "s4" in store.asked
    assert sessions_of(a).recorded(hb.client_id) is None
    assert not session_present(mqtt_url, hb.client_id)
    assert not hb.connected
    hb.stop()  # core follows the Unsubscribe


@pytest.mark.parametrize("answer", [1, 2], ids=["before-connect", "after-record"])
def test_a_delete_right_after_the_store_said_it_exists_leaves_nothing(
    two: tuple[Instance, Instance, Store], mqtt_url: str, answer: int
) -> None:
    """The race the order of ``made_again`` closes.  B finds the session and its record
    gone (lost by the broker: the store still holds the subscription) and asks the
    store twice: before it connects (``answer`` 1), and after its CONNECT made the
    session again and it wrote the record again (``answer`` 2).  The store answers
    "there", and a delete through A comes right after that answer (the store first,
    then the session, then the record), before B subscribed.  Nothing stays behind, and
    B does not make it again: the delete's end and clear come after B's CONNECT and
    record (were the record written after the answer, the delete's clear could come
    first and the record, naming a deleted subscription, stay)."""
    a, b, store = two
    store.names.add("s5")
    _, hb = delivering(a, b, "s5")
    answers: list[bool] = []
    raced = threading.Event()

    def delete_after_answer(name: str, there: bool) -> None:
        answers.append(there)
        if len(answers) == answer:
            assert there
            raced.set()
            store.names.discard(name)
            a.adapter.delete_subscription(name)

    store.answering = delete_after_answer
    # the broker loses the session and its record (as a delete would, but the store
    # keeps the subscription)
    sessions_of(a).delete(hb.client_id)
    wait_until(raced.is_set, 20, what=f"B's answer {answer} from the store")
    wait_until(lambda: hb.unrecorded >= 1, 30, what="B finding no record and no store")
    # (after answer 2 B counted the session made again, and its SUBSCRIBE met the cut)
    assert hb.remade == answer - 1
    assert sessions_of(a).recorded(hb.client_id) is None
    assert not session_present(mqtt_url, hb.client_id)
    assert not hb.connected
    hb.stop()


def test_a_store_that_cannot_answer_makes_nothing_until_it_does(
    two: tuple[Instance, Instance, Store], mqtt_url: str
) -> None:
    """A failing store means "not known now": the session is not made again (nothing
    left behind) until the store answers that it holds the subscription."""
    a, b, store = two
    store.names.add("s6")
    consumer, hb = delivering(a, b, "s6")
    failing = threading.Event()
    failing.set()

    def fail(name: str, there: bool) -> None:
        if failing.is_set():
            raise RuntimeError("the store is down")

    store.answering = fail
    sessions_of(a).delete(hb.client_id)  # the broker loses it
    wait_until(lambda: hb.unrecorded >= 1, 20, what="B not making it while the store fails")
    assert hb.remade == 0
    failing.clear()
    wait_until(lambda: hb.remade == 1 and hb.connected, 60, what="B making it again")
    a.publish(SENTINEL := b"<after/>")
    wait_until(lambda: consumer.has(SENTINEL), 20, what="a delivery after it was made again")


def test_without_the_store_a_lost_session_is_taken_as_deleted(
    mqtt_url: str, tmp_path: Path
) -> None:
    """An adapter core never told ``kept_in_store`` (a third party's core) keeps the
    former rule: a session gone with its record is not made again."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    a = Instance(mqtt_url, tmp_path / "a", prefix)
    b = Instance(mqtt_url, tmp_path / "b", prefix)
    try:
        _, hb = delivering(a, b, "s7")
        sessions_of(a).delete(hb.client_id)
        wait_until(lambda: hb.unrecorded >= 1, 20, what="B's restart finding no record")
        assert hb.remade == 0 and not session_present(mqtt_url, hb.client_id)
        hb.stop()
    finally:
        b.adapter.close()
        a.adapter.close()
