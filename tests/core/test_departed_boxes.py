"""Departed instances (``core.departed``): the leader's orphan sweep retires the
dead-letter boxes an instance that left the cluster kept on MQTT, two instances on one
PostgreSQL store and the real Mosquitto.  The dead letters Mosquitto had queued for the
departed box reach the leader's box, once each, and later ones all do."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from wsnmom.core.adapter import OutboundMessage
from wsnmom.core.dead_letter_records import H_ID, box_name, destination_topic

from tests.adapters.test_mqtt_cluster import session_present
from tests.core.conftest import Broker
from tests.core.test_orphans import _mqtt_url
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt


def _letters(name: str, bodies: list[bytes]) -> list[OutboundMessage]:
    return [
        OutboundMessage(
            topic=destination_topic(name),
            body=body,
            message_id=uuid.uuid4().hex,
            headers={H_ID: uuid.uuid4().hex},
        )
        for body in bodies
    ]


def test_the_leaders_sweep_retires_a_departed_instances_box(
    postgres_store_url: str, make_broker: Callable[..., Broker], mqtt_url: str
) -> None:
    """B leaves the cluster (its row in the instance table goes): its box stays in the
    ``$share`` group and takes a share of the next dead letters until the leader's sweep
    retires it; then every letter is in A's box, and the departed box's session and
    record are gone.  A sweep by the other instance retires nothing."""
    url = _mqtt_url(mqtt_url, uuid.uuid4().hex[:10])
    # two instance ids (one process would give both the same)
    a = make_broker(adapter_url=url, store_url=postgres_store_url, cluster__instance_id="a")
    b = make_broker(adapter_url=url, store_url=postgres_store_url, cluster__instance_id="b")
    services = [x.service for x in (a, b) if x.service is not None]
    wait_until(lambda: any(s.cluster.leads() for s in services), 30, what="a leader")
    leader, other = (a, b) if services[0].cluster.leads() else (b, a)
    assert leader.service is not None and other.service is not None
    name = f"dl{uuid.uuid4().hex[:6]}"
    kept = leader.service._ctx.dead_letters.box(name)
    other.service._ctx.dead_letters.box(name)
    assert other.service.orphans.sweep() == []  # not the leader
    assert leader.service.orphans.sweep() == []  # both live
    gone = other.adapter._require_cluster().sessions.client_id(box_name(name))
    other.stop()
    bodies = [b"l%d" % i for i in range(8)]
    leader.service._ctx.dead_letters.sink(_letters(name, bodies))
    # round robin: some of them wait in the departed box's session
    wait_until(lambda: len(kept.letters()) >= 1, 20, what="the leader's share")
    assert leader.service.orphans.sweep() == [gone]
    wait_until(lambda: len(kept.letters()) == len(bodies), 20, what="every dead letter")
    later = [b"n%d" % i for i in range(6)]
    leader.service._ctx.dead_letters.sink(_letters(name, later))
    wait_until(lambda: len(kept.letters()) == 14, 20, what="every later dead letter")
    assert sorted(x.body for x in kept.letters()) == sorted(bodies + later)
    assert not session_present(mqtt_url, gone)
    sessions = leader.adapter._require_cluster().sessions
    assert sessions.recorded(gone) is None
