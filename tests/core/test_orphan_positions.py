"""The orphan sweep (``core.orphans``) and the positions core keeps in the store for Kafka
in cluster mode (``core.position_fence``): the rows of a subscription whose delete failed
everywhere (the record deleted, its intent dropped once the adapter took the delete, the
rows' delete failing until the process that queued it stopped) are removed by the leader's
sweep once they stayed without a record for the grace.  Kafka cannot list its durable
subscriptions (no ``own_names``), so before, nothing found such rows: they stayed for good.
A live subscription's rows stay, and it keeps delivering.

On tansu and a PostgreSQL store, one gateway instance in cluster mode (it leads); the
grace is passed by setting the sweep's clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from wsnmom.core.service import BrokerService

from tests.core.conftest import Broker, RecordingOutbound, concrete, note, sub_req
from tests.core.test_orphans import GRACE, Monotonic
from tests.fixtures.server import kafka_gateway_url
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

CONSUMER = "http://127.0.0.1:9/live"
TOPIC = "t:orphans/live"


def kept_names(store_url: str) -> set[str]:
    """The names ``wsnmom_positions`` keeps rows of."""
    with psycopg.connect(store_url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT name FROM wsnmom_positions")}


def test_kept_positions_no_record_names_are_removed_after_the_grace(
    postgres_store_url: str,
    make_broker: Callable[..., Broker],
    kafka_url: str,
    outbound: RecordingOutbound,
) -> None:
    """(``postgres_store_url`` first: its database outlives the broker.)"""
    broker = make_broker(adapter_url=kafka_gateway_url(kafka_url), store_url=postgres_store_url)
    service: BrokerService | None = broker.service
    assert service is not None
    wait_until(service.cluster.leads, 30, what="the instance leading")
    clock = Monotonic()
    service.orphans.clock = clock
    service.orphans.grace = GRACE
    live = service.subscribe(sub_req(CONSUMER, topic=concrete(TOPIC)))
    service.notify([note("<m>0</m>", concrete(TOPIC))])
    outbound.wait_messages(CONSUMER, 1, timeout=30)
    wait_until(lambda: live.id in kept_names(postgres_store_url), 30, what="its position kept")
    # what a delete that failed everywhere leaves: rows no record names
    with psycopg.connect(postgres_store_url) as conn:
        conn.execute(
            "INSERT INTO wsnmom_positions (name, stream, part, position) "
            "VALUES ('orphan1', 'gone', 0, 5), ('orphan1', 'gone', 1, 7)"
        )
    assert service.orphans.sweep() == []  # first found: the grace starts
    assert kept_names(postgres_store_url) == {live.id, "orphan1"}
    clock.value += GRACE
    assert service.orphans.sweep() == ["orphan1"]
    wait_until(
        lambda: kept_names(postgres_store_url) == {live.id},
        30,
        what="the orphan's rows deleted",
    )
    assert service.orphans.sweep() == []
    service.notify([note("<m>1</m>", concrete(TOPIC))])
    got = outbound.wait_messages(CONSUMER, 2, timeout=30)
    assert [d.message.payload for d in got] == [b"<m>0</m>", b"<m>1</m>"]


def test_an_orphan_its_intent_names_is_removed_once_while_its_rows_are_still_listed(
    postgres_store_url: str,
    make_broker: Callable[..., Broker],
    kafka_url: str,
) -> None:
    """A round's intent sweep removes an orphan through the adapter, which deletes its rows
    after answering (Kafka's cursor engine queues the delete): the same round's listing,
    made while the rows are still there, does not remove it a second time.  The listing is
    held to show the rows at that moment; before, the round removed the name twice."""
    broker = make_broker(adapter_url=kafka_gateway_url(kafka_url), store_url=postgres_store_url)
    service: BrokerService | None = broker.service
    assert service is not None
    wait_until(service.cluster.leads, 30, what="the instance leading")
    clock = Monotonic()
    service.orphans.clock = clock
    service.orphans.grace = GRACE
    with psycopg.connect(postgres_store_url) as conn:
        conn.execute(
            "INSERT INTO wsnmom_positions (name, stream, part, position) "
            "VALUES ('orphan2', 'gone', 0, 3)"
        )
    assert service.orphans.sweep() == []  # listed first: the grace starts
    service.store.put_intent("orphan2", datetime.now(UTC) - timedelta(seconds=10 * GRACE))
    kept = service.orphans.kept
    assert kept is not None
    service.orphans.kept = lambda: {*kept(), "orphan2"}  # its rows' delete not made yet
    clock.value += GRACE
    assert service.orphans.sweep() == ["orphan2"]
    service.orphans.kept = kept
    wait_until(lambda: "orphan2" not in kept_names(postgres_store_url), 30, what="its rows gone")
    assert service.store.list_intents() == []
