"""The store contract, on SQLite and on PostgreSQL alike: round trips of every record,
upserts, deletes, listing order, current messages, reopening, and what an unreachable
server gives (StoreUnavailable: HTTP 503 with a Retry-After, not a 500).  Schema versions,
their upgrades and ``wsnmom store migrate`` are test_store_versions.py."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.delivery_policy import DeliveryChoices
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
    SubscriptionState,
    WireVersion,
)
from wsnmom.core.store import Deposed, IntentGone, Store, StoreError, StoreUnavailable
from wsnmom.core.store_documents import subscription_from_json, subscription_to_json
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.model import Topic

from tests.fixtures.brokers import free_port
from tests.support.waiting import wait_until

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty store of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
    else:
        yield request.getfixturevalue("postgres_store_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


def subscription(sub_id: str, **changes: object) -> Subscription:
    sub = Subscription(
        id=sub_id,
        consumer=EndpointReference("http://127.0.0.1:9/c", (b"<p xmlns='urn:x'>1</p>",), b"<m/>"),
        creation_time=NOW,
        termination_time=NOW + timedelta(hours=1),
        topic=ExpressionSource("urn:dialect", "t:a", {None: "urn:default", "t": "urn:t"}),
        filter_xml=b"<f/>",
        use_raw=False,
        state=SubscriptionState.ACTIVE,
    )
    for name, value in changes.items():
        setattr(sub, name, value)
    return sub


def registration(reg_id: str, **changes: Any) -> PublisherRegistration:
    """A demand-based registration ``reg_id`` ending 5 minutes after ``NOW``, with
    ``changes``."""
    reg = PublisherRegistration(
        reg_id,
        NOW,
        NOW + timedelta(minutes=5),
        EndpointReference("http://127.0.0.1:9/p"),
        (ExpressionSource("urn:dialect", "t:a", {"t": "urn:t"}),),
        demand=True,
    )
    return replace(reg, **changes)


def test_subscriptions_round_trip_upsert_and_delete(store: Store) -> None:
    first = subscription("s1")
    store.put_subscription(first)
    store.put_subscription(subscription("s2", termination_time=None, owner="alice"))
    assert store.get_subscription("s1") == first
    assert store.get_subscription("missing") is None
    paused = subscription("s1", state=SubscriptionState.PAUSED, pull_point_id="pp")
    store.put_subscription(paused)  # replaces
    assert store.get_subscription("s1") == paused
    assert sorted(s.id for s in store.list_subscriptions()) == ["s1", "s2"]
    assert store.get_subscription("s2").owner == "alice"  # type: ignore[union-attr]
    assert store.delete_subscription("s1") and not store.delete_subscription("s1")
    assert [s.id for s in store.list_subscriptions()] == ["s2"]


def test_every_write_of_a_subscription_bumps_its_revision(store: Store) -> None:
    """The revision a cluster's instances follow changes by (``core.follow``): set on the
    record written, read back with it, higher after every write, listed too."""
    first = subscription("s1")
    store.put_subscription(first)
    assert first.revision == 1
    assert store.get_subscription("s1").revision == 1  # type: ignore[union-attr]
    # another instance's copy of the same record, written twice: its revision is the store's
    other = subscription("s1", state=SubscriptionState.PAUSED)
    store.put_subscription(other)
    store.put_subscription(other)
    assert other.revision == 3
    stored = store.get_subscription("s1")
    assert stored is not None and stored.revision == 3 and stored.state is SubscriptionState.PAUSED
    store.put_subscription(first)  # an older copy written again: still a newer revision
    assert first.revision == 4
    assert [s.revision for s in store.list_subscriptions()] == [4]
    store.delete_subscription("s1")
    again = subscription("s1")
    store.put_subscription(again)
    assert again.revision == 1


def test_a_write_on_a_revision_another_writer_moved_on_from_is_refused(store_url: str) -> None:
    """Two instances (two stores on one database) read a subscription at one revision;
    the first conditional write wins, the second writes nothing and says so, and a
    conditional write of a deleted subscription does not bring it back."""
    first, second = open_store(store_url), open_store(store_url)
    try:
        first.put_subscription(subscription("s1"))
        a, b = first.get_subscription("s1"), second.get_subscription("s1")
        assert a is not None and b is not None and a.revision == b.revision == 1
        a.state = SubscriptionState.PAUSED
        assert first.update_subscription(a) and a.revision == 2
        b.termination_time = NOW + timedelta(days=1)
        assert not second.update_subscription(b)
        assert b.revision == 1  # nothing written, the record as read
        stored = second.get_subscription("s1")
        assert stored is not None and stored.revision == 2
        assert stored.state is SubscriptionState.PAUSED
        assert stored.termination_time == NOW + timedelta(hours=1)
        # read again and applied again: written
        stored.termination_time = NOW + timedelta(days=1)
        assert second.update_subscription(stored) and stored.revision == 3
        assert first.delete_subscription("s1")
        assert not first.update_subscription(stored)
        assert first.get_subscription("s1") is None
    finally:
        first.close()
        second.close()


def test_a_subscriptions_delivery_policy_round_trips(store_url: str) -> None:
    """The subscriber's choices (``wsnmom:DeliveryPolicy``) survive a reopened store;
    a subscription stored before delivery policies existed reads as having none."""
    chosen = DeliveryChoices(
        max_attempts=2,
        backoff="linear",
        final_statuses=(404, 410),
        ordering="unordered",
        in_flight=5,
    )
    opened = open_store(store_url)
    try:
        opened.put_subscription(subscription("dp", delivery_policy=chosen))
        opened.put_subscription(subscription("plain"))
    finally:
        opened.close()
    reopened = open_store(store_url)
    try:
        got = reopened.get_subscription("dp")
        assert got is not None and got.delivery_policy == chosen
        assert reopened.get_subscription("plain").delivery_policy is None  # type: ignore[union-attr]
    finally:
        reopened.close()
    doc = subscription_to_json(subscription("old"))
    del doc["delivery_policy"]
    assert subscription_from_json(doc).delivery_policy is None


def test_pull_points_by_id_and_name(store: Store) -> None:
    pp = PullPoint("pp1", NOW, NOW + timedelta(days=1), "queue-a", owner="bob")
    store.put_pull_point(pp)
    store.put_pull_point(PullPoint("pp2", NOW, None))
    assert store.get_pull_point("pp1") == pp
    assert store.find_pull_point("queue-a") == pp
    assert store.find_pull_point("queue-b") is None
    assert [p.id for p in store.list_pull_points()] == ["pp1", "pp2"]
    assert store.delete_pull_point("pp1") and store.get_pull_point("pp1") is None


def test_which_ids_it_holds_in_one_question(store: Store) -> None:
    """``held``: the ids of subscriptions and pull points among those asked, in one query
    (``Adapter.kept_in_store_many``); unknown and deleted ids are not among them."""
    store.put_subscription(subscription("s1"))
    store.put_subscription(subscription("s2"))
    store.put_pull_point(PullPoint("pp1", NOW, None))
    store.delete_subscription("s2")
    assert store.held(["s1", "s2", "pp1", "nobody", "s1"]) == {"s1", "pp1"}
    assert store.held([]) == set()
    many = [f"x{i}" for i in range(12_000)] + ["s1"]  # more than one SQLite statement binds
    assert store.held(many) == {"s1"}


def test_registrations(store: Store) -> None:
    reg = registration("r1", owner="carol")
    store.put_registration(reg)
    assert store.get_registration("r1") == reg
    assert store.list_registrations() == [reg]
    assert store.delete_registration("r1") == reg and store.list_registrations() == []
    assert store.delete_registration("r1") is None


@pytest.fixture
def epoch(store: Store) -> Iterator[int]:
    """The epoch of the leadership an instance took on ``store`` (it leads throughout)."""
    leader = store.coordination("leader")
    assert leader.lead()
    held = leader.epoch()
    assert held is not None
    yield held
    leader.leave()


def test_a_registration_s_termination_and_demand_are_written_apart(
    store: Store, epoch: int
) -> None:
    """SetTerminationTime writes the termination time alone and the demand manager its
    publisher subscription alone (two instances each holding a copy of the other part
    older than the store's never write it back), and the deletion gives the record as
    stored: what the last writer of each part wrote."""
    reg = registration("r2")
    store.put_registration(reg)
    at_publisher = EndpointReference("http://127.0.0.1:9/p/subscriptions/1", (b"<k/>",))
    assert store.save_registration_demand("r2", at_publisher, False, epoch=epoch)
    later = NOW + timedelta(hours=2)
    assert store.renew_registration("r2", later)
    both = replace(reg, termination_time=later, demand_subscription=at_publisher)
    assert store.get_registration("r2") == both
    assert store.save_registration_demand("r2", at_publisher, True, epoch=epoch)
    assert store.list_registrations() == [replace(both, demand_paused=True)]
    assert store.renew_registration("r2", None)
    assert store.get_registration("r2") == replace(both, demand_paused=True, termination_time=None)
    assert store.delete_registration("r2") == replace(
        both, demand_paused=True, termination_time=None
    )
    # gone: nothing is written, and nothing made again
    assert not store.renew_registration("r2", later)
    assert not store.save_registration_demand("r2", None, False, epoch=epoch)
    assert store.get_registration("r2") is None and store.list_registrations() == []


def test_a_leader_s_demand_save_is_fenced_by_its_leadership_epoch(store: Store) -> None:
    """The leader's write of a registration's publisher subscription carries the epoch of
    the leadership it held when it began: written while that epoch is the leadership's.
    On a store several instances share, once another instance took the leadership the
    old epoch's write is refused (Deposed) and writes nothing, the new one's is written.
    A store one instance opens has one leader, whose writes are made."""
    reg = registration("r3")
    store.put_registration(reg)
    first = store.coordination("a")
    assert first.lead()
    epoch = first.epoch()
    assert epoch is not None
    ours = EndpointReference("http://127.0.0.1:9/p/subscriptions/1")
    assert store.save_registration_demand("r3", ours, False, epoch=epoch)
    assert store.get_registration("r3") == replace(reg, demand_subscription=ours)
    if not first.shared:
        return  # one instance: nobody can take the leadership from it
    first.leave()  # its lock's connection ends: the leadership is free
    second = store.coordination("b")
    wait_until(second.lead, 30, what="b taking the leadership")
    newer = second.epoch()
    assert newer is not None and newer > epoch
    theirs = EndpointReference("http://127.0.0.1:9/p/subscriptions/2")
    assert store.save_registration_demand("r3", theirs, False, epoch=newer)
    with pytest.raises(Deposed):
        store.save_registration_demand("r3", ours, True, epoch=epoch)
    assert store.get_registration("r3") == replace(reg, demand_subscription=theirs)
    assert store.delete_registration("r3") is not None
    with pytest.raises(Deposed):  # the fence first: a deposed leader learns it either way
        store.save_registration_demand("r3", ours, True, epoch=epoch)
    assert not store.save_registration_demand("r3", theirs, True, epoch=newer)
    second.leave()


def test_a_leader_s_meta_write_is_fenced_by_its_leadership_epoch(store: Store) -> None:
    """A meta write with an epoch (the upstream relay's consumer key) is made while that
    epoch is the leadership's; once another instance took the leadership, the old
    epoch's write is refused (Deposed) and the value stays the new leader's.  A store one
    instance opens writes it."""
    first = store.coordination("a")
    assert first.lead()
    epoch = first.epoch()
    assert epoch is not None
    store.set_meta("upstream.u.key", "u.ours", epoch=epoch)
    assert store.get_meta("upstream.u.key") == "u.ours"
    if not first.shared:
        return  # one instance: nobody can take the leadership from it
    first.leave()
    second = store.coordination("b")
    wait_until(second.lead, 30, what="b taking the leadership")
    newer = second.epoch()
    assert newer is not None and newer > epoch
    store.set_meta("upstream.u.key", "u.theirs", epoch=newer)
    with pytest.raises(Deposed):
        store.set_meta("upstream.u.key", "u.late", epoch=epoch)
    with pytest.raises(Deposed):  # a key not written before: nothing made either
        store.set_meta("upstream.v.key", "v.late", epoch=epoch)
    assert store.get_meta("upstream.u.key") == "u.theirs"
    assert store.get_meta("upstream.v.key") is None
    second.leave()


def test_current_messages_per_topic(store: Store) -> None:
    first = NotificationMessage("m1", b"<x/>", Topic("urn:t", ("a", "b")), published_at=NOW)
    second = NotificationMessage(
        "m2", "<y>é</y>".encode(), Topic("urn:t", ("a", "b")), content_type="application/xml"
    )
    other = NotificationMessage("m3", b"\x00\xff", Topic("urn:u", ("a",)))
    store.put_current_message(first)
    store.put_current_message(other)
    store.put_current_message(second)  # replaces the first on its topic
    assert store.get_current_message(Topic("urn:t", ("a", "b"))) == second
    assert store.get_current_message(Topic("urn:t", ("a",))) is None
    assert {m.message_id for m in store.list_current_messages()} == {"m2", "m3"}
    with pytest.raises(ValueError):
        store.put_current_message(NotificationMessage("m4", b"<z/>"))


def test_reopened_store_keeps_everything(store_url: str) -> None:
    store = open_store(store_url)
    store.put_subscription(subscription("s1"))
    store.put_pull_point(PullPoint("pp", NOW, None, "n"))
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError):
        store.get_subscription("s1")
    again = open_store(store_url)
    try:
        assert again.get_subscription("s1") == subscription("s1")
        assert again.find_pull_point("n") is not None
        assert again.ping()
    finally:
        again.close()


def test_wire_version_of_a_subscription_is_kept_across_reopening(store_url: str) -> None:
    """A WS-N 1.0 / 1.2-draft subscriber is delivered to in its own format after a
    restart; a record written before wire versions were kept reads as a 1.3 one."""
    store = open_store(store_url)
    try:
        store.put_subscription(subscription("s10", wire_version=WireVersion.WSN_10))
        store.put_subscription(subscription("s12", wire_version=WireVersion.WSN_12_DRAFT))
        store.put_subscription(subscription("s13"))
    finally:
        store.close()
    again = open_store(store_url)
    try:
        versions = {s.id: s.wire_version for s in again.list_subscriptions()}
        assert versions == {
            "s10": WireVersion.WSN_10,
            "s12": WireVersion.WSN_12_DRAFT,
            "s13": WireVersion.WSN_13,
        }
        assert again.get_subscription("s10") == subscription("s10", wire_version=WireVersion.WSN_10)
    finally:
        again.close()
    earlier = subscription_to_json(subscription("old", wire_version=WireVersion.WSN_10))
    del earlier["wire_version"]
    assert subscription_from_json(earlier).wire_version is WireVersion.WSN_13


def test_concurrent_writers_lose_nothing(store: Store) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.put_subscription(subscription(f"s{i}")), range(200)))
    assert len(store.list_subscriptions()) == 200


# -- PostgreSQL only ------------------------------------------------------------------------


def test_postgres_two_conditional_writes_waiting_for_one_row_one_wins(
    postgres_store_url: str,
) -> None:
    """Two writers that read one revision and then wait for the row (a third transaction
    holds it): when it is let go, PostgreSQL checks the revision again on the row the
    first writer committed, so exactly one of the two writes is taken."""
    import psycopg

    stores = [open_store(postgres_store_url) for _ in range(2)]
    try:
        stores[0].put_subscription(subscription("s1"))
        copies = [s.get_subscription("s1") for s in stores]
        assert all(c is not None and c.revision == 1 for c in copies)
        with (
            psycopg.connect(postgres_store_url) as holder,
            psycopg.connect(postgres_store_url, autocommit=True) as watcher,
            concurrent.futures.ThreadPoolExecutor(2) as pool,
        ):
            holder.execute("SELECT 1 FROM subscriptions WHERE id = 's1' FOR UPDATE")
            writes = [
                pool.submit(store.update_subscription, copy)  # type: ignore[arg-type]
                for store, copy in zip(stores, copies, strict=True)
            ]

            def waiting() -> int:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()
                return int(row[0]) if row else 0

            wait_until(lambda: waiting() == 2, timeout=10, what="both writers waiting")
            holder.rollback()
            results = [w.result(timeout=10) for w in writes]
        assert sorted(results) == [False, True]
        stored = stores[0].get_subscription("s1")
        assert stored is not None and stored.revision == 2
    finally:
        for store in stores:
            store.close()


def test_postgres_unreachable_at_open_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        open_store(f"postgresql://wsnmom@127.0.0.1:{free_port()}/postgres")
    assert isinstance(caught.value, errors.ResourceUnavailable)
    assert caught.value.retry_after


def test_postgres_server_gone_mid_use_is_a_503_fault(postgres_store_url: str) -> None:
    """Connections the server drops surface as StoreUnavailable (a ResourceUnavailable
    with retry_after: the frontend's 503), and the store recovers when it answers again."""
    import psycopg

    store = open_store(postgres_store_url)
    try:
        store.put_subscription(subscription("before"))
        database = postgres_store_url.rsplit("/", 1)[1]
        admin_url = postgres_store_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )
        outcomes: list[object] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # a probe a second finds the server again
            try:
                outcomes.append(store.get_subscription("before"))
                break
            except StoreUnavailable as exc:
                outcomes.append(exc)
                time.sleep(0.05)
        assert outcomes[-1] == subscription("before")
        assert all(isinstance(o, StoreUnavailable) or o == subscription("before") for o in outcomes)
        assert store.ping()
    finally:
        store.close()


# -- meta and the adapter a store belongs to -------------------------------------------------


def test_meta_round_trip(store: Store) -> None:
    assert store.get_meta("adapter") is None
    store.set_meta("adapter", "embedded")
    store.set_meta("adapter", "rabbitmq")
    assert store.get_meta("adapter") == "rabbitmq"


def test_a_store_with_resources_is_bound_to_its_adapter(store: Store) -> None:
    from wsnmom.core.store_binding import StoreOfAnotherAdapter, bind_store

    bind_store(store, "embedded")
    bind_store(store, "rabbitmq")  # empty: changes hands
    assert store.get_meta("adapter") == "rabbitmq"
    store.put_pull_point(PullPoint("pp", NOW, None))
    bind_store(store, "rabbitmq")
    with pytest.raises(StoreOfAnotherAdapter) as caught:
        bind_store(store, "kafka")
    assert caught.value.recorded == "rabbitmq" and caught.value.resources == 1
    assert store.get_meta("adapter") == "rabbitmq"
    store.delete_pull_point("pp")
    bind_store(store, "kafka")
    assert store.get_meta("adapter") == "kafka"


def test_upstreams_round_trip_in_the_order_added(store: Store) -> None:
    first = {"name": "cam-1", "url": "http://127.0.0.1:9/onvif", "namespaces": {"tns1": "urn:t"}}
    second = {"name": "broker-b", "url": "http://127.0.0.1:9/wsn/broker", "lifetime": 600.0}
    store.put_upstream("cam-1", first)
    store.put_upstream("broker-b", second)
    store.put_upstream("cam-1", {**first, "topic": "tns1:RuleEngine//."})  # replaced in place
    assert store.list_upstreams() == [{**first, "topic": "tns1:RuleEngine//."}, second]
    assert store.delete_upstream("cam-1") is True
    assert store.delete_upstream("cam-1") is False
    assert store.list_upstreams() == [second]


# -- intents (core.orphans) ----------------------------------------------------------------


def test_a_new_record_replaces_its_intent_in_one_write(store: Store) -> None:
    """``add_subscription``/``add_pull_point`` write the record and remove its intent;
    without an intent (the orphan sweep took it) they write nothing."""
    store.put_intent("s1")
    store.put_intent("pp1")
    assert [name for name, _ in store.list_intents()] == ["s1", "pp1"]
    sub = subscription("s1")
    store.add_subscription(sub)
    assert sub.revision == 1 and store.get_subscription("s1") == sub
    pp = PullPoint("pp1", NOW, NOW + timedelta(hours=1), "named")
    store.add_pull_point(pp)
    assert store.get_pull_point("pp1") == pp and store.find_pull_point("named") == pp
    assert store.list_intents() == []
    with pytest.raises(IntentGone):
        store.add_subscription(subscription("s2"))
    with pytest.raises(IntentGone):
        store.add_pull_point(PullPoint("pp2", NOW, None, "other"))
    assert store.get_subscription("s2") is None and store.get_pull_point("pp2") is None
    assert store.find_pull_point("other") is None


def test_a_record_deleted_with_intent_leaves_the_intent_of_its_durable_subscription(
    store: Store,
) -> None:
    """``delete_subscription``/``delete_pull_point`` with ``intent=True`` remove the record
    and store an intent of its name in the same write (the orphan sweep deletes the durable
    subscription if the middleware's delete never happens); nothing when there was no
    record; without ``intent`` no intent."""
    store.put_subscription(subscription("s1"))
    store.put_pull_point(PullPoint("pp1", NOW, None, "named"))
    store.put_subscription(subscription("s2"))
    assert store.delete_subscription("s1", intent=True) is True
    assert store.delete_pull_point("pp1", intent=True) is True
    assert store.delete_subscription("s2") is True
    assert store.get_subscription("s1") is None and store.get_pull_point("pp1") is None
    assert sorted(name for name, _ in store.list_intents()) == ["pp1", "s1"]
    assert store.delete_subscription("s1", intent=True) is False
    assert store.delete_pull_point("never", intent=True) is False
    assert sorted(name for name, _ in store.list_intents()) == ["pp1", "s1"]


def test_intents_by_age(store: Store) -> None:
    """Listed and removed by their age (the store's clock); a removal conditional on the
    age leaves a younger intent alone."""
    old = datetime.now(UTC) - timedelta(seconds=100)
    store.put_intent("young")
    store.put_intent("old", old)
    assert store.list_intents(50) == [("old", old)]
    assert [name for name, _ in store.list_intents()] == ["old", "young"]
    assert store.delete_intent("young", 50) is False
    assert store.delete_intent("old", 50) is True
    assert store.delete_intent("old") is False
    assert store.delete_intent("young") is True
    assert store.list_intents() == []


def test_the_leader_s_expiry_removes_what_is_still_expired_under_its_epoch(store: Store) -> None:
    """The leader's expiry removes a record only while its stored termination time is
    at or before the sweep's time (a Renew through another instance keeps it), a
    subscription with its intent; on a store several instances share, only while the
    epoch is the leadership's (else Deposed, nothing removed)."""
    first = store.coordination("a")
    assert first.lead()
    epoch = first.epoch()
    assert epoch is not None
    store.put_subscription(subscription("s1"))  # until NOW + 1 h
    assert not store.expire_subscription("s1", NOW, epoch=epoch)
    assert store.get_subscription("s1") is not None
    assert store.expire_subscription("s1", NOW + timedelta(hours=1), epoch=epoch)
    assert store.get_subscription("s1") is None
    assert [name for name, _ in store.list_intents(0.0)] == ["s1"]
    assert not store.expire_subscription("s1", NOW + timedelta(hours=2), epoch=epoch)
    store.put_pull_point(PullPoint("p1", NOW, NOW + timedelta(hours=1)))
    assert not store.expire_pull_point("p1", NOW, epoch=epoch)
    assert store.expire_pull_point("p1", NOW + timedelta(hours=1), epoch=epoch)
    assert store.get_pull_point("p1") is None
    assert sorted(name for name, _ in store.list_intents(0.0)) == ["p1", "s1"]
    reg = registration("r4")
    store.put_registration(reg)
    assert store.expire_registration("r4", NOW, epoch=epoch) is None
    assert store.get_registration("r4") == reg
    assert store.expire_registration("r4", NOW + timedelta(minutes=5), epoch=epoch) == reg
    assert store.get_registration("r4") is None
    assert store.expire_registration("r4", NOW + timedelta(hours=1), epoch=epoch) is None
    if not first.shared:
        return  # one instance: nobody can take the leadership from it
    store.put_subscription(subscription("s2"))
    store.put_registration(reg)
    first.leave()
    second = store.coordination("b")
    wait_until(second.lead, 30, what="b taking the leadership")
    newer = second.epoch()
    assert newer is not None and newer > epoch
    later = NOW + timedelta(hours=2)
    with pytest.raises(Deposed):
        store.expire_subscription("s2", later, epoch=epoch)
    with pytest.raises(Deposed):
        store.expire_registration("r4", later, epoch=epoch)
    store.put_pull_point(PullPoint("p2", NOW, NOW + timedelta(hours=1)))
    with pytest.raises(Deposed):
        store.expire_pull_point("p2", later, epoch=epoch)
    assert store.expire_pull_point("p2", later, epoch=newer)
    assert store.get_subscription("s2") is not None and store.get_registration("r4") == reg
    assert store.expire_subscription("s2", later, epoch=newer)
    assert store.expire_registration("r4", later, epoch=newer) == reg
    second.leave()
