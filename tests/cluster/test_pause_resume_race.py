"""Pause and Resume of one subscription sent to two instances a few milliseconds apart,
as a round-robin load balancer sends them (issue 23 §2): the last one the store took is
what every instance ends up doing.  Before subscriptions had a store revision
(``Subscription.revision``, ``core.follow``) about 1 run in 4 of "pause through B, resume
through A, notify" ended paused: the deliverer's follower had read the Pause from the
store just before the deliverer's own Resume, and applied it after.

Each race test runs many rounds on two instances with one shard (one instance delivers,
the other does not), alternating which instance gets the first request, on RabbitMQ and on
Kafka.  Two more (RabbitMQ) come from the review of the revisions: a Pause the store
refused is undone on the deliverer, and a Renew right after a Pause through the other
instance does not write the subscription active again, and a Pause and a Renew through
the two instances on one revision both hold (conditional writes).  The module's tests on
one middleware share one cluster (``shared_cluster``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import requests

from tests.cluster.conftest import BOTH, INSTANCE, Cluster
from tests.cluster.test_any_instance import n, received, topic
from tests.fixtures.server import ConsumerServer
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from wsnmom.client import WsnClient
from wsnmom.client.errors import ClientError, SoapFault
from wsnmom.client.model import EndpointReference
from wsnmom.client.resources import Subscription
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUNDS = 30
TOPIC = topic("race")


def detail(gateway: Gateway, sub_id: str) -> dict[str, Any]:
    """The subscription as ``gateway``'s admin API shows it."""
    url = f"{gateway.base_url}/wsn/admin/api/subscriptions/{sub_id}"
    answer = requests.get(url, timeout=5)
    answer.raise_for_status()
    return dict(answer.json())


class Pair:
    """One subscription as seen through each of a cluster's two instances."""

    def __init__(self, c: Cluster, sub: Subscription) -> None:
        self.c = c
        self.sub = sub
        self.through = {
            g.port: c.client(g).subscription(
                EndpointReference(
                    c.via(g, sub.reference.address), sub.reference.reference_parameters
                )
            )
            for g in c.gateways
        }

    def on(self, gateway: Gateway) -> Subscription:
        return self.through[gateway.port]

    def settled(self, state: str) -> bool:
        """Both instances hold ``state`` at the same revision, the one the store has
        (each followed the last change), and the deliverer's channel agrees."""
        seen = [detail(g, self.sub.id) for g in self.c.gateways]
        if {d["state"] for d in seen} != {state} or len({d["revision"] for d in seen}) != 1:
            return False
        channels = [d["delivery"] for d in seen if d["delivery"] is not None]
        return all(ch["active"] is (state == "active") for ch in channels)

    def holds(
        self, publisher: WsnClient, consumer: ConsumerServer, control: Subscription, mark: str
    ) -> None:
        """A message ``mark`` published now through ``publisher`` reaches the control
        subscription (the sentinel) and not this one: held."""
        publisher.notify(n(mark), TOPIC)
        wait_until(
            lambda: mark in received(consumer, control.address),
            10,
            what=f"the control subscription's copy of {mark} (the sentinel)",
        )
        assert mark not in received(consumer, self.sub.address), mark


def deliverer_of(c: Cluster, consumer: ConsumerServer, path: str) -> Gateway:
    """The instance that delivered to ``path``."""
    ids = {r.headers[INSTANCE] for r in consumer.notifies() if r.path == path}
    assert len(ids) == 1, ids
    return next(g for g in c.gateways if c.instance_of(g) in ids)


@contextmanager
def refused_writes(c: Cluster, sub_id: str) -> Iterator[None]:
    """While inside: the shared store refuses every update of one subscription's row (a
    trigger), as a PostgreSQL blip refuses a write."""
    import psycopg

    url = c.gateways[0].store_url
    assert url is not None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER test_refuse BEFORE UPDATE ON subscriptions FOR EACH ROW "
            f"WHEN (OLD.id = '{sub_id}') EXECUTE FUNCTION test_refuse()"
        )
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER test_refuse ON subscriptions")
            conn.execute("DROP FUNCTION test_refuse()")


@pytest.fixture
def race(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> Iterator[tuple[Cluster, Pair, Subscription]]:
    """Two instances on one shard (one delivers, the other does not; the module's tests
    share them), a victim subscription (``Pair``) and a control one, both made through
    the first instance and delivered once; both unsubscribed afterwards, so that the
    next test's messages on the same topic reach only its own."""
    c = shared_cluster(2, WSNMOM_CLUSTER__SHARDS="1")
    wa = c.client(c.gateways[0])
    victim = wa.subscribe(consumer.address("/victim"), TOPIC)
    control = wa.subscribe(consumer.address("/control"), TOPIC)
    try:
        wa.notify(n("start"), TOPIC)
        wait_until(
            lambda: (
                "start" in received(consumer, victim.address)
                and "start" in received(consumer, control.address)
            ),
            10,
            what="the first deliveries",
        )
        yield c, Pair(c, victim), control
    finally:
        for sub in (victim, control):
            with contextlib.suppress(ClientError):
                Pair(c, sub).on(c.gateways[0]).unsubscribe()


@pytest.mark.parametrize("middleware", BOTH, indirect=True)
def test_pause_through_one_instance_then_resume_through_the_other_always_delivers(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
    c, pair, _ = race
    a, b = c.gateways
    publisher = c.client(a)
    deliverer = deliverer_of(c, consumer, "/victim")
    for i in range(ROUNDS):
        first, second = (b, a) if i % 2 == 0 else (a, b)
        pair.on(first).pause()
        pair.on(second).resume()
        publisher.notify(n(i), TOPIC)
        wait_until(
            lambda i=i: str(i) in received(consumer, pair.sub.address),  # type: ignore[misc]
            10,
            what=f"round {i}'s message (paused through {first.port}, resumed through "
            f"{second.port}, delivered by {deliverer.port})",
        )
    wait_until(lambda: pair.settled("active"), 5, what="both instances active, one revision")
    # one deliverer throughout (the pauses and resumes moved nothing)
    assert {r.headers[INSTANCE] for r in consumer.notifies()} == {c.instance_of(deliverer)}


@pytest.mark.parametrize("middleware", BOTH, indirect=True)
def test_resume_through_one_instance_then_pause_through_the_other_always_holds(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
    c, pair, control = race
    a, b = c.gateways
    publisher = c.client(a)
    pair.on(a).pause()
    held: list[str] = []
    for i in range(ROUNDS):
        first, second = (b, a) if i % 2 == 0 else (a, b)
        pair.on(first).resume()
        pair.on(second).pause()
        # the outcome every instance must reach: paused, at the store's last revision
        wait_until(
            lambda: pair.settled("paused"),
            5,
            what=f"round {i}: both instances paused at one revision (resumed through "
            f"{first.port}, paused through {second.port})",
        )
        # held (an earlier round's message may come during the next round's moment of
        # being resumed: that one is not held any more)
        pair.holds(publisher, consumer, control, str(i))
        held.append(str(i))
    # what was held arrives after a last resume
    pair.on(b).resume()
    wait_until(
        lambda: set(held) <= set(received(consumer, pair.sub.address)),
        15,
        what="every held message after the last resume",
    )


@pytest.mark.rabbitmq
def test_a_pause_the_store_refused_leaves_the_deliverer_delivering(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
    """Review finding 1: the deliverer stopped its channel and marked the record paused,
    then the store refused the write; the retry and a Resume through the other instance
    were no-ops (equal revisions), and the deliverer never delivered again."""
    c, pair, _ = race
    deliverer = deliverer_of(c, consumer, "/victim")
    other = next(g for g in c.gateways if g is not deliverer)
    publisher = c.client(other)
    with refused_writes(c, pair.sub.id), pytest.raises(SoapFault):
        pair.on(deliverer).pause()
    # undone: still delivering
    publisher.notify(n("refused"), TOPIC)
    wait_until(
        lambda: "refused" in received(consumer, pair.sub.address),
        10,
        what="the message after the refused pause",
    )
    # the retry pauses, a resume through the other instance resumes
    pair.on(deliverer).pause()
    wait_until(lambda: pair.settled("paused"), 5, what="both instances paused")
    pair.on(other).resume()
    publisher.notify(n("resumed"), TOPIC)
    wait_until(
        lambda: "resumed" in received(consumer, pair.sub.address),
        10,
        what="the message after the resume through the other instance",
    )
    wait_until(lambda: pair.settled("active"), 5, what="both instances active, one revision")


@pytest.mark.rabbitmq
def test_a_renew_right_after_a_pause_through_the_other_instance_keeps_it_paused(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
    """Review finding 3: Renew wrote the whole record as the instance held it, so a Renew
    through B before B followed a Pause through A wrote it active again."""
    c, pair, control = race
    a, b = c.gateways
    publisher = c.client(a)
    for i in range(4):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        pair.on(first).pause()
        pair.on(second).renew(timedelta(hours=1))
        wait_until(
            lambda: pair.settled("paused"),
            5,
            what=f"round {i}: both instances paused (paused through {first.port}, renewed "
            f"through {second.port})",
        )
        pair.holds(publisher, consumer, control, str(i))
        pair.on(first).resume()
        wait_until(
            lambda i=i: str(i) in received(consumer, pair.sub.address),  # type: ignore[misc]
            10,
            what=f"round {i}'s message after the resume",
        )


@pytest.mark.rabbitmq
def test_a_pause_and_a_renew_through_two_instances_on_one_revision_both_hold(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
    """A Pause through one instance and a Renew through the other, both reading one
    revision of the subscription before either writes (issue 23): the store takes one
    write, refuses the other (a conditional write on the revision read), and that
    instance reads the record again and applies its change again, so the subscription
    ends paused and renewed.

    The two writes are made to interleave on the real gateways with a row lock: the test
    holds the subscription's row (``SELECT ... FOR UPDATE``), sends both requests, waits
    until PostgreSQL shows both instances' writes waiting for the row (each read the
    record before, a plain read does not wait), then lets go.  Before, both writes were
    taken one after the other and the later one wrote its own copy of the other field
    back."""
    import psycopg

    c, pair, control = race
    a, b = c.gateways
    url = a.store_url
    assert url is not None
    sub_id = pair.sub.id
    with (
        psycopg.connect(url) as holder,
        psycopg.connect(url, autocommit=True) as watcher,
    ):
        holder.execute("SELECT 1 FROM subscriptions WHERE id = %s FOR UPDATE", (sub_id,))
        pausing, paused = in_thread(pair.on(a).pause)
        renewing, renewed = in_thread(lambda: pair.on(b).renew(timedelta(hours=5)))

        def waiting() -> int:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%%subscriptions%%'"
            ).fetchone()
            return int(row[0]) if row else 0

        try:
            wait_until(lambda: waiting() == 2, 20, what="both instances' writes waiting")
        finally:
            holder.rollback()
        pausing.join(20)
        renewing.join(20)
        row = watcher.execute(
            "SELECT data->>'state', termination_time FROM subscriptions WHERE id = %s",
            (sub_id,),
        ).fetchone()
    assert paused == [None], paused
    assert renewed and not isinstance(renewed[0], BaseException), renewed
    assert row is not None
    state, termination = row
    assert state == "paused"  # before: one of the two lost, whichever wrote last
    assert termination == renewed[0]
    wait_until(lambda: pair.settled("paused"), 5, what="both instances paused, one revision")
    # both instances hold the renewed time too
    assert len({detail(g, sub_id)["terminates"] for g in c.gateways}) == 1
    pair.holds(c.client(a), consumer, control, "held")
