"""Losing shards does not hold up lease renewal (issue 23; docs/scale-out.md, "Delivery
ownership"): ``core.ownership`` queues the closings of a lost shard's deliveries to its
opener threads, the heartbeat goes on renewing the leases while a closing is slow, the
delivery posts nothing meanwhile, and a shard lost and taken again ends with its delivery
open once, whatever the order of its closing and its opening.

The first test is one instance (embedded adapter) on a real PostgreSQL store: a shard is
taken from it by writing another owner into ``wsnmom_shards`` and given back by letting
that lease expire, so its real heartbeat loses and retakes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from wsnmom.core.ownership import Ownership
from wsnmom.core.service import BrokerService

from tests.support.waiting import wait_until

from .conftest import Broker, RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"
#: renewals the heartbeat must make while the lost delivery's close is blocked
RENEWALS = 3


def _set_owner(store_url: str, shard: int, sql: str) -> None:
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(f"UPDATE wsnmom_shards SET {sql} WHERE shard = %s", (shard,))


def _subscribe_apart(service: BrokerService) -> tuple[str, int]:
    """A victim and a control subscription in two different shards; the victim's shard."""
    victim = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    shard = service.cluster.shard(victim)
    for _ in range(50):
        control = service.subscribe(sub_req(CONTROL, topic=simple("t:a"))).id
        if service.cluster.shard(control) != shard:
            return victim, shard
        service.unsubscribe(control)
    raise AssertionError("no subscription id fell in another shard")


def test_a_slow_close_of_a_lost_shard_does_not_hold_up_lease_renewal(
    postgres_store_url: str,
    make_broker: Callable[..., Broker],
    outbound: RecordingOutbound,
) -> None:
    broker = make_broker(
        store_url=postgres_store_url,
        cluster__lease=timedelta(seconds=10),
        cluster__heartbeat=0.2,
    )
    service = broker.service
    assert service is not None
    wait_until(
        lambda: len(service.cluster.held()) == service.settings.cluster.shards,
        30,
        what="every shard held by the one instance",
    )
    victim, shard = _subscribe_apart(service)
    engine = service.engine
    closing, go_on = threading.Event(), threading.Event()
    close_channel = engine.close_channel

    def slow_close(name: str) -> None:
        if name == victim:
            closing.set()
            go_on.wait(60)  # a middleware that takes its time to cancel the consumer
        close_channel(name)

    engine.close_channel = slow_close  # type: ignore[method-assign]
    counts = service.cluster.status
    try:
        # another owner's lease on the victim's shard: the next heartbeat loses it
        _set_owner(postgres_store_url, shard, "owner = 'thief', expires_at = now() + '1 hour'")
        wait_until(closing.is_set, 30, what="the close of the lost shard's delivery begun")
        channel = engine.channel(victim)
        assert channel is not None  # not closed yet
        # the fence: the victim's delivery, not yet closed, posts nothing
        service.notify([note("<m>while lost</m>", simple("t:a"))])
        outbound.wait_messages(CONTROL, 1, timeout=30)  # the sentinel
        renewed = counts().counts.renewals
        wait_until(
            lambda: counts().counts.renewals >= renewed + RENEWALS,
            30,
            what=f"{RENEWALS} lease renewals while a lost delivery's close is blocked",
        )
        assert counts().counts.expired == 1, "only the shard taken was lost"
        assert outbound.payloads_to(VICTIM) == []
        # nor does it count failed attempts (3 would end the subscription meanwhile)
        assert channel.status().failures == 0
        assert [a for a in outbound.attempts if a.address == VICTIM] == []
        # the thief's lease ends: the shard is taken again while its close still waits
        _set_owner(postgres_store_url, shard, "expires_at = now()")
        wait_until(
            lambda: shard in service.cluster.held(),
            30,
            what="the victim's shard taken again",
        )
    finally:
        go_on.set()
    assert service.ownership.settled()
    wait_until(
        lambda: engine.channel(victim) is not None,
        30,
        what="the victim's delivery open again",
    )
    # open once: what waited, then a new message, each delivered once
    service.notify([note("<m>after</m>", simple("t:a"))])
    outbound.wait_messages(CONTROL, 2, timeout=30)
    outbound.wait_messages(VICTIM, 2, timeout=30)
    payloads = outbound.payloads_to(VICTIM)
    assert len(payloads) == 2 and b"while lost" in payloads[0] and b"after" in payloads[1]
    assert counts().counts.expired == 1


def _lost_while(service: BrokerService, ownership: Ownership, held_again: bool) -> None:
    """``lost`` for every shard, the closings made while this instance holds them
    again (``held_again``) or not."""
    delivers: Any = service._ctx.delivers
    service._ctx.delivers = lambda _id: held_again
    try:
        ownership.lost(set(range(service.settings.cluster.shards)))
        assert ownership.settled()
    finally:
        service._ctx.delivers = delivers


def test_a_closing_made_once_the_shard_is_held_again_leaves_the_delivery_open(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    channel = service.engine.channel(sub_id)
    _lost_while(service, ownership, held_again=True)
    ownership.gained(set(range(service.settings.cluster.shards)))  # its opening after
    assert ownership.settled()
    assert service.engine.channel(sub_id) is channel  # neither closed nor opened twice
    service.notify([note("<m>kept</m>", simple("t:a"))])
    outbound.wait_messages(VICTIM, 1)


def test_a_closing_made_while_the_shard_is_lost_closes_and_the_opening_reopens(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    _lost_while(service, ownership, held_again=False)
    assert service.engine.channel(sub_id) is None
    ownership.gained(set(range(service.settings.cluster.shards)))  # held again
    assert ownership.settled()
    assert service.engine.channel(sub_id) is not None
    service.notify([note("<m>reopened</m>", simple("t:a"))])
    outbound.wait_messages(VICTIM, 1)
