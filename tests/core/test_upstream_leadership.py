"""The upstream relay's leader-only work fenced by the leadership epoch
(``wsnmom.upstreams``): a leader deposed while its Subscribe at an upstream producer is in
flight does not record its consumer key over the new leader's, and unsubscribes what it
made."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core.config import UpstreamSettings
from wsnmom.core.store_url import open_store

from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.upstreams import UpstreamRelay

from .conftest import Broker


class DeposingProducer(ConsumerServer):
    """A producer that answers Subscribe and Unsubscribe; the first Subscribe runs
    :attr:`during_subscribe` before it answers."""

    during_subscribe: Callable[[], None] | None = None

    def _handle(self, handler: Any, data: bytes) -> None:
        if b"Subscribe>" in data and b"Unsubscribe" not in data:
            hook, self.during_subscribe = self.during_subscribe, None
            if hook is not None:
                hook()
        super()._handle(handler, data)


def test_a_leader_deposed_during_its_upstream_subscribe_leaves_the_new_leader_s_key(
    postgres_store_url: str, make_broker: Callable[..., Broker], caplog: pytest.LogCaptureFixture
) -> None:
    """On a PostgreSQL store: while the leader's Subscribe at the upstream producer is in
    flight, its lock's connection ends, another instance takes the leadership and records
    the key of its own subscription.  The deposed leader's write of its key is refused
    (before, it replaced the new leader's, and every other instance then refused the new
    subscription's Notify): it logs one line and unsubscribes what it made."""
    service = make_broker(store_url=postgres_store_url).service
    assert service is not None and service.cluster.leads()
    other = open_store(postgres_store_url, instance_id="successor")
    successor = other.coordination("successor")
    producer = DeposingProducer()

    def depose() -> None:
        with other.transaction() as conn:  # type: ignore[attr-defined]
            conn.execute(
                # this database's only: the server may serve other tests, whose first
                # instance is named as this one (``make_broker``: b0)
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                (f"{service.instance_id}/leader",),
            )
        wait_until(successor.lead, 30, what="the other instance taking the leadership")
        newer = successor.epoch()
        assert newer is not None
        other.set_meta("upstream.plant.key", "plant.successor", epoch=newer)

    spec = UpstreamSettings(
        name="plant", url=producer.address("/producer"), lifetime=timedelta(minutes=5)
    )
    relay = UpstreamRelay(
        [spec],
        service.store,
        service,
        "http://127.0.0.1:9",
        epoch=service.cluster.leader_epoch,
    )
    producer.during_subscribe = depose
    try:
        with caplog.at_level(logging.WARNING, logger="wsnmom.upstreams"):
            relay.reconcile()  # the leader's epoch, read as the pass begins, then deposed
        made = "/publisher-subscriptions/1"
        assert producer.control == [("Subscribe", "/producer"), ("Unsubscribe", made)]
        assert other.get_meta("upstream.plant.key") == "plant.successor"
        (state,) = relay.states()
        assert state["state"] == "standby" and state["subscription"] is None, state
        refused = [r for r in caplog.records if "no longer leads" in r.getMessage()]
        assert len(refused) == 1 and made in refused[0].getMessage(), refused
    finally:
        relay.stop()
        producer.close()
        successor.leave()
        other.close()
