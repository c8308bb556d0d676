"""The leader's sweep fenced by the store (``core.sweep``): a subscription renewed through
another instance while the leader's delete was on its way stays
(``Store.expire_subscription``), and so does every expiry of a leader deposed while it
swept; a deposed leader drops no backlog's excess (``Store.fence``); the orphan sweep
removes no intent a removal wrote anew while it looked (``core.orphans``).  The leader
is held at the right point by a row lock another connection takes (PostgreSQL)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.service import BrokerService
from wsnmom.core.store_documents import pull_point_to_json, subscription_to_json

from tests.support.waiting import wait_until

from .conftest import Broker, FakeClock, note, simple, sub_req

C = "http://127.0.0.1:9/consumer"


@contextmanager
def on_thread(target: Callable[..., object], *args: object) -> Iterator[threading.Thread]:
    """``target(*args)`` on a thread of its own, joined on leaving."""
    thread = threading.Thread(target=target, args=args, name="test-sweep", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(60)
        assert not thread.is_alive(), "the sweep did not finish"


@contextmanager
def held(
    url: str,
    lock: str,
    params: tuple[object, ...],
    sweep: AbstractContextManager[object],
    waits_in: str,
    what: str,
) -> Iterator[psycopg.Connection[Any]]:
    """``lock`` executed in a transaction of a connection of its own (holding the rows it
    locks), then ``sweep`` entered; yields that connection once a backend waits for a
    lock in a statement containing ``waits_in``, and commits it (releasing the rows)
    before the sweep is joined."""
    with (
        psycopg.connect(url, autocommit=True) as watch,
        psycopg.connect(url) as other,
    ):
        other.execute(lock, params)
        with sweep:
            wait_until(lambda: waiting_on(watch, waits_in), 30, what=what)
            yield other
            other.commit()


def deposed_while_sweeping(
    url: str, service: BrokerService, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    """``service``'s sweep held at the leadership row while another instance takes the
    leadership (its epoch bumped, in a transaction that holds the row); the sweep's
    warnings captured."""
    with (
        caplog.at_level(logging.WARNING, logger="wsnmom.core.sweep"),
        held(
            url,
            "SELECT epoch FROM wsnmom_leadership FOR UPDATE",
            (),
            on_thread(service.sweep),
            "wsnmom_leadership",
            what=what,
        ) as other,
    ):
        other.execute("UPDATE wsnmom_leadership SET epoch = epoch + 1")


def waiting_on(conn: psycopg.Connection[Any], statement: str) -> bool:
    """Whether a backend of ``conn``'s database waits for a lock in a statement that
    contains ``statement`` (the server may serve other tests' databases: a wait of
    theirs is not this test's)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE %s",
        (f"%{statement}%",),
    ).fetchone()
    return row is not None and row[0] > 0


def test_the_leader_s_expiry_keeps_what_was_renewed_or_when_it_was_deposed(
    postgres_store_url: str,
    make_broker: Callable[..., Broker],
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a PostgreSQL store, two subscriptions expire for the leader's sweep.

    1. The first is renewed through another instance (its row written in a transaction
       that holds the row) while the leader's delete waits for the row: it stays, in the
       store and on this instance.  Before, the delete removed the renewed subscription.
    2. The leadership passes to another instance (its epoch bumped, in a transaction that
       holds the leadership row) while the leader's delete of the second waits: the
       delete is refused and the sweep logs one line; the subscription stays.  Before,
       the deposed leader's delete went through."""
    service = make_broker(store_url=postgres_store_url).service
    assert service is not None and service.cluster.leads()
    renewed = service.subscribe(sub_req(C)).id
    expired = service.subscribe(sub_req(C)).id
    clock.advance(hours=2)  # past both termination times (the default lifetime: 1 h)
    store = service.store
    record = store.get_subscription(renewed)
    assert record is not None
    record.termination_time = clock() + timedelta(hours=10)
    with held(
        postgres_store_url,
        "SELECT 1 FROM subscriptions WHERE id = %s FOR UPDATE",
        (renewed,),
        on_thread(service.sweep),
        "DELETE FROM subscriptions",
        what="the leader's delete waiting for the renewed subscription's row",
    ) as other:
        other.execute(
            "UPDATE subscriptions SET termination_time = %s, data = %s, "
            "revision = revision + 1 WHERE id = %s",
            (record.termination_time, Jsonb(subscription_to_json(record)), renewed),
        )
    stored = store.get_subscription(renewed)
    assert stored is not None and stored.termination_time == record.termination_time
    assert renewed in service.registry.subscriptions
    assert store.get_subscription(expired) is None  # not renewed

    deposed = service.subscribe(sub_req(C)).id
    clock.advance(hours=2)
    deposed_while_sweeping(
        postgres_store_url, service, caplog, "the leader's delete waiting for the leadership row"
    )
    assert store.get_subscription(deposed) is not None
    assert deposed in service.registry.subscriptions
    refused = [r for r in caplog.records if "no longer leads" in r.getMessage()]
    assert len(refused) == 1, refused


def test_a_leader_deposed_while_it_sweeps_drops_no_backlog_excess(
    postgres_store_url: str, make_broker: Callable[..., Broker], caplog: pytest.LogCaptureFixture
) -> None:
    """The file log (no native limits: core drops the excess of each backlog) on a
    PostgreSQL store: the leadership passes to another instance (its epoch bumped, in a
    transaction that holds the leadership row) while the leader's sweep is about to drop
    the excess of a backlog of 12 over ``max_messages`` 5.  Nothing is dropped: the new
    leader drops it, from the depth it reads.  Before, the deposed leader dropped the
    excess it had measured, on top of its successor's drop."""
    broker = make_broker(
        adapter_url="filelog://{tmp}/log?partitions=1",
        store_url=postgres_store_url,
        limits__max_age=None,
        limits__max_messages=5,
    )
    service = broker.service
    assert service is not None and service.cluster.leads()
    sub = service.subscribe(sub_req(C, topic=simple("t:l")))
    service.pause(sub.id)
    service.notify([note(f"<n>{i}</n>", simple("t:l")) for i in range(12)])
    handle = service.registry.subscriptions[sub.id].handle
    assert handle is not None
    wait_until(lambda: handle.depth() == 12, 30, what="12 messages held")
    deposed_while_sweeping(
        postgres_store_url, service, caplog, "the leader's drop waiting for the leadership row"
    )
    assert handle.depth() == 12
    refused = [r for r in caplog.records if "no longer leads" in r.getMessage()]
    assert len(refused) == 1, refused


def test_the_leader_s_expiry_keeps_a_pull_point_renewed_meanwhile(
    postgres_store_url: str, make_broker: Callable[..., Broker], clock: FakeClock
) -> None:
    """On a PostgreSQL store, a pull point renewed through another instance (ONVIF's
    Renew; its row written in a transaction that holds the row) while the leader's
    delete of it waits for the row stays, with its queue and the subscription feeding it.
    Before, the sweep did not read the store for pull points, destroyed the feeding
    subscription, and deleted the renewed pull point."""
    service = make_broker(store_url=postgres_store_url).service
    assert service is not None and service.cluster.leads()
    pp = service.create_pull_point(CreatePullPointRequest())
    feeding = service.subscribe(
        sub_req(service.pull_point_address(pp.id), initial_termination_time=timedelta(days=5))
    ).id
    store = service.store
    record = store.get_pull_point(pp.id)
    assert record is not None and record.termination_time is not None
    clock.advance(days=2)  # past the pull point's lifetime (the default: a day)
    record.termination_time = clock() + timedelta(days=1)
    with held(
        postgres_store_url,
        "SELECT 1 FROM pull_points WHERE id = %s FOR UPDATE",
        (pp.id,),
        on_thread(service.sweep),
        "DELETE FROM pull_points",
        what="the leader's delete waiting for the renewed pull point's row",
    ) as other:
        other.execute(
            "UPDATE pull_points SET termination_time = %s, data = %s WHERE id = %s",
            (record.termination_time, Jsonb(pull_point_to_json(record)), pp.id),
        )
    stored = store.get_pull_point(pp.id)
    assert stored is not None and stored.termination_time == record.termination_time
    assert pp.id in service.registry.pull_points
    assert feeding in service.registry.subscriptions
    assert store.get_subscription(feeding) is not None


def test_an_intent_written_again_while_the_sweep_waits_for_it_stays(
    postgres_store_url: str, make_broker: Callable[..., Broker]
) -> None:
    """On a PostgreSQL store: the orphan sweep finds a stale intent whose record exists,
    and its removal of that intent waits for the intent's row while the subscription is
    unsubscribed through another instance (its record deleted and its intent written
    anew, in a transaction that holds the row: the removal's, kept until its delete on
    the middleware succeeds).  That intent stays, for the next round if that delete
    fails.  Before, the round removed it whatever its age, and a durable subscription
    whose delete failed stayed for nobody."""
    service = make_broker(store_url=postgres_store_url).service
    assert service is not None and service.cluster.leads()
    sub = service.subscribe(sub_req(C)).id
    store = service.store
    store.put_intent(sub, datetime.now(UTC) - timedelta(hours=1))
    with held(
        postgres_store_url,
        "SELECT 1 FROM wsnmom_intents WHERE name = %s FOR UPDATE",
        (sub,),
        on_thread(service.orphans.sweep_intents, 60.0),
        "DELETE FROM wsnmom_intents",
        what="the sweep's removal waiting for the intent's row",
    ) as other:
        other.execute("DELETE FROM subscriptions WHERE id = %s", (sub,))
        other.execute("UPDATE wsnmom_intents SET at = clock_timestamp() WHERE name = %s", (sub,))
    assert [name for name, _ in store.list_intents()] == [sub]
