"""MQTT cluster mode, adapter level: how a session the broker lost is made again asks core's
store (docs/scale-out.md "MQTT in cluster mode"; adapters/mqtt/cluster_remake.py).

* The store is asked once per burst (``Adapter.kept_in_store_many``), off the thread
  that starts the deliveries: a shard gained after the broker lost every session does
  not make one store query per subscription, one after another, on core's thread.
* A question the store cannot answer never ends the session: it is kept with its record
  and its filters (it queues what is published meanwhile) and the store is asked again.

Sessions are lost as a broker restarted without its state loses them: the session ended
and its record cleared (``SubscriptionSessions.delete``), the store (PostgreSQL, asked as
core asks it) keeping the subscription."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest
from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
from wsnmom.adapters.mqtt.cluster_sessions import SubscriptionSessions
from wsnmom.core.store_postgres import PostgresStore

from tests.adapters.test_mqtt_cluster import Collector, Instance, session_present
from tests.core.test_store_conformance import subscription
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

SENTINEL = b"<sentinel/>"


class Store:
    """Core's store as the adapter asks it, on PostgreSQL: ``one(name)`` as core answers
    ``kept_in_store`` (``ClusterParts.stored``) and ``many(names)`` as it answers
    ``kept_in_store_many`` (``Store.held``), each counting its calls; ``answering`` is
    called before each answer of ``one`` (a failure or a wait played there), and
    ``many`` waits while ``open`` is clear (a slow store)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.singular: list[str] = []
        self.plural: list[list[str]] = []
        self.answering: Callable[[int], None] = lambda n: None
        self.open = threading.Event()
        self.open.set()

    def hold(self, *names: str) -> None:
        for name in names:
            self.store.put_subscription(subscription(name))

    def one(self, name: str) -> bool:
        with self.lock:
            self.singular.append(name)
            n = len(self.singular)
        self.answering(n)
        s = self.store
        return s.get_subscription(name) is not None or s.get_pull_point(name) is not None

    def many(self, names: Collection[str]) -> set[str]:
        with self.lock:
            self.plural.append(sorted(names))
        assert self.open.wait(60)
        return self.store.held(names)

    def hold_answers(self, only: int | None = None) -> tuple[threading.Event, threading.Event]:
        """Make each answer of ``one`` (only the ``only``-th, if given) wait until the
        second event is set; the first is set as one waits (the store being asked)."""
        asked, release = threading.Event(), threading.Event()

        def wait(n: int) -> None:
            if only is None or n == only:
                asked.set()
                assert release.wait(30)

        self.answering = wait
        return asked, release


@pytest.fixture
def store(postgres_store_url: str) -> Iterator[Store]:
    pg = PostgresStore(postgres_store_url, instance_id="remake")
    yield Store(pg)
    pg.close()


def sessions_of(inst: Instance) -> SubscriptionSessions:
    cnode = inst.adapter._cnode
    assert cnode is not None
    return cnode.sessions


def lost_on_b(two: tuple[Instance, Instance], store: Store, name: str) -> ClusterHandle:
    """B's handle of the subscription ``name``, held by the store (B asks it per name),
    whose session and record the broker lost."""
    a, b = two
    store.hold(name)
    b.adapter.kept_in_store(store.one)
    hb = b.handle(name)
    sessions_of(a).delete(hb.client_id)
    return hb


@pytest.fixture
def two(mqtt_url: str, tmp_path: Path) -> Iterator[tuple[Instance, Instance]]:
    """Two instances of one cluster on the session's broker."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    made = [Instance(mqtt_url, tmp_path / f"i{i}", prefix) for i in range(2)]
    yield made[0], made[1]
    for inst in reversed(made):
        inst.adapter.close()


def test_a_shard_of_lost_sessions_asks_the_store_once_per_burst_off_the_starting_thread(
    two: tuple[Instance, Instance], store: Store
) -> None:
    """B gains a shard of 20 subscriptions whose sessions and records the broker lost:
    every ``start`` returns while the store has not answered (it waits), the store is
    asked at most twice (the first burst, then all that came while it was answering),
    never once per name, and every subscription delivers once it answered."""
    a, b = two
    names = [f"s{i}" for i in range(20)]
    store.hold(*names)
    b.adapter.kept_in_store(store.one)
    b.adapter.kept_in_store_many(store.many)
    handles = [b.handle(name) for name in names]
    for h in handles:  # the broker loses them all
        sessions_of(a).delete(h.client_id)
    store.open.clear()
    consumers = [Collector() for _ in handles]
    for h, consumer in zip(handles, consumers, strict=True):
        h.start(consumer, prefetch=4)  # core's opening thread: never waits for the store
    assert not any(h.connected for h in handles)
    wait_until(lambda: bool(store.plural), 20, what="the store asked")
    store.open.set()
    wait_until(lambda: all(h.connected for h in handles), 30, what="every session delivering")
    assert store.singular == []
    assert 1 <= len(store.plural) <= 2
    assert sorted(n for batch in store.plural for n in batch) == sorted(names)
    assert all(h.remade == 1 for h in handles)
    a.publish(SENTINEL)
    for consumer in consumers:
        wait_until(lambda c=consumer: c.has(SENTINEL), 20, what="a delivery after the remake")


def test_a_store_that_cannot_answer_during_a_hand_over_ends_no_session(
    two: tuple[Instance, Instance], store: Store
) -> None:
    """A delivers, hands the subscription over (stops); the broker loses its session and
    record; B starts it and its question to the store fails.  The session B made again
    stays, with its record and its filters, so what is published until the store
    answers is delivered once it does (before, B ended the session and cleared the
    record: those messages were lost, and the session made again only after
    ``reconnect_max_delay``)."""
    a, b = two
    store.hold("s1")
    b.adapter.kept_in_store(store.one)
    ha, hb = a.handle("s1"), b.handle("s1")
    ca, cb = Collector(), Collector()
    ha.start(ca, prefetch=4)
    a.publish(b"before")
    wait_until(lambda: ca.has(b"before"), 20, what="a delivery through A")
    ha.stop()  # the hand-over
    sessions_of(a).delete(hb.client_id)  # the broker loses the session and its record
    asked_again = threading.Event()
    release = threading.Event()

    def fail_then_wait(n: int) -> None:
        if n == 1:
            raise RuntimeError("the store is down")
        asked_again.set()
        assert release.wait(30)

    store.answering = fail_then_wait
    hb.start(cb, prefetch=4)
    assert asked_again.wait(30), "B asked the store again"
    # B's session and record stayed, the filters subscribed: what comes now is queued
    assert sessions_of(a).recorded(hb.client_id) == hb.filters
    a.publish(b"while-unanswered")
    release.set()
    wait_until(lambda: cb.has(b"while-unanswered"), 20, what="the message published meanwhile")
    # the session's queued messages may come before the connection is installed (at the
    # broker's SUBACK): wait for that rather than read it at once
    assert hb.await_connection(20)
    assert hb.remade == 1
    assert not ca.has(b"while-unanswered")


def test_a_kept_session_is_ended_once_the_store_says_it_is_gone(
    two: tuple[Instance, Instance], store: Store, mqtt_url: str
) -> None:
    """B's question fails; the store then answers that the subscription is gone (deleted
    through another instance before B's CONNECT): the session B kept is ended and its
    record cleared, and B does not deliver it."""
    a, _ = two
    hb = lost_on_b(two, store, "s2")
    deleted = threading.Event()

    def fail_once(n: int) -> None:
        if n == 1:
            store.store.delete_subscription("s2")  # gone before B asks again
            deleted.set()
            raise RuntimeError("the store is down")

    store.answering = fail_once
    hb.start(Collector(), prefetch=4)
    assert deleted.wait(30)
    wait_until(lambda: hb.unrecorded >= 1, 30, what="B undoing the session it kept")
    assert hb.remade == 0 and not hb.connected
    assert sessions_of(a).recorded(hb.client_id) is None
    assert not session_present(mqtt_url, hb.client_id)
    hb.stop()


def test_without_the_plural_the_store_is_asked_per_name_off_the_starting_thread(
    two: tuple[Instance, Instance], store: Store
) -> None:
    """An adapter told only ``kept_in_store`` (a core of before the plural) asks it per
    name, still on the questions' thread: ``start`` returns before the store answers."""
    hb = lost_on_b(two, store, "s3")
    answering, release = store.hold_answers()
    hb.start(Collector(), prefetch=4)  # returns: the store is asked on another thread
    assert answering.wait(20) and not hb.connected
    release.set()
    wait_until(lambda: hb.connected, 20, what="B delivering once the store answered")
    assert store.singular == ["s3"] and hb.remade == 1


def test_a_stop_while_the_store_is_asked_installs_nothing_and_the_next_start_delivers(
    two: tuple[Instance, Instance], store: Store
) -> None:
    """Core stops the handle (its shard went) while the store is being asked: the answer
    "there" installs nothing; the next start finds the session made again (with its
    record) and delivers."""
    a, _ = two
    hb = lost_on_b(two, store, "s4")
    answering, release = store.hold_answers(only=1)
    consumer = Collector()
    hb.start(consumer, prefetch=4)
    assert answering.wait(20)
    hb.stop()
    release.set()
    wait_until(lambda: hb.remade == 1, 20, what="the answer handled")
    assert not hb.connected
    assert sessions_of(a).recorded(hb.client_id) == hb.filters
    hb.start(consumer, prefetch=4)
    wait_until(lambda: hb.connected, 20, what="the next start delivering")
    a.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="a delivery after the next start")
    assert store.singular == ["s4"]
