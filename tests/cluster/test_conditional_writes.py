"""A Pause through one instance and a Renew through the other, both reading one revision
of the subscription before either writes (issue 23): the store takes one write, refuses
the other (a conditional write on the revision read), and that instance reads the record
again and applies its change again, so the subscription ends paused and renewed.

The two writes are made to interleave on the real gateways with a row lock: the test
holds the subscription's row (``SELECT ... FOR UPDATE``), sends both requests, waits
until PostgreSQL shows both instances' writes waiting for the row (each read the record
before, a plain read does not wait), then lets go.  Before, both writes were taken one
after the other and the later one wrote its own copy of the other field back.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.cluster.conftest import Cluster
from tests.cluster.test_any_instance import n, received
from tests.cluster.test_pause_resume_race import TOPIC, Pair, detail, race
from tests.fixtures.server import ConsumerServer
from tests.support.threads import in_thread
from tests.support.waiting import wait_until
from wsnmom.client.resources import Subscription

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

__all__ = ["race"]  # the fixture, shared with the race tests


@pytest.mark.rabbitmq
def test_a_pause_and_a_renew_through_two_instances_on_one_revision_both_hold(
    race: tuple[Cluster, Pair, Subscription], consumer: ConsumerServer
) -> None:
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
    # held: the control subscription's copy is the sentinel
    c.client(a).notify(n("held"), TOPIC)
    wait_until(
        lambda: "held" in received(consumer, control.address),
        10,
        what="the control subscription's copy",
    )
    assert "held" not in received(consumer, pair.sub.address)
