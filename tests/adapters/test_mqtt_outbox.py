"""The MQTT adapter's dead-letter outbox (``adapters/mqtt/outbox.py``) against a Mosquitto
of the test's own: while the broker is away the sender backs off (the delay doubles, shown
in the adapter's stats) and starts afresh once a batch went through; a dead letter the
broker refuses for good while its destination's box was deleted is kept (stranded,
counted) and reaches the box when it is opened again, not logged and lost.

The subscription whose limit drops is on an internal topic: the queue store takes its
messages with the broker away, so the dead letter is made while publishing fails."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.core.adapter import (
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.fixtures.mosquitto import MosquittoNode
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

#: the queue store takes these without the broker (an internal namespace)
SOURCE = Topic(f"{INTERNAL_NAMESPACE_PREFIX}test-outbox", ("t",))


class Setup:
    """An adapter on ``node``, a box for dead-letter topic ``grave`` and a subscription
    ``sub`` that keeps one message and drops the older ones there."""

    def __init__(self, node: MosquittoNode, prefix: str, grave: Topic, data_dir: Path) -> None:
        self.grave = grave
        self.adapter = MqttAdapter(
            node.url,
            {
                "data_dir": str(data_dir),
                "topic_prefix": prefix,
                "session_expiry": 300,
                "reconnect_max_delay": 0.5,
                # a plain subscription: the box's shared one does not outlive the broker
                # restart of the first test on Mosquitto 2.0.11 (noticed, not this test's)
                "dead_letter_share": "",
            },
        )
        self.adapter.open()
        self.box_spec = SubscriptionSpec("box", (PathPattern(grave.namespace, grave.path),))
        self.box = self.adapter.subscription(self.box_spec)
        self.adapter.subscription(
            SubscriptionSpec(
                "sub",
                (PathPattern(SOURCE.namespace, SOURCE.path),),
                QueueLimits(max_messages=1),
                grave,
            )
        )

    def drop(self, *bodies: bytes) -> None:
        """Publish ``bodies`` and one more: ``sub``'s limit drops ``bodies``."""
        self.adapter.publish_many(
            [OutboundMessage(SOURCE, b, uuid.uuid4().hex) for b in (*bodies, b"kept")]
        )

    def stats(self) -> Any:
        return self.adapter.stats()


@pytest.fixture
def setup(
    mosquitto_factory: Callable[..., MosquittoNode], tmp_path: Path
) -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []

    def make(*, refuse: bool = False) -> Setup:
        prefix = f"o{uuid.uuid4().hex[:8]}"
        grave = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dead-letters", (f"d{uuid.uuid4().hex[:8]}",))
        name = MqttMapping({}, prefix, dead_letters=True).name(grave)
        # the gateway may read the destination but, with ``refuse``, not write it
        acl = f"topic {'read' if refuse else 'readwrite'} {name}\n" if refuse else None
        node = mosquitto_factory(acl=acl)
        s = Setup(node, prefix, grave, tmp_path / uuid.uuid4().hex[:8])
        s.node = node  # type: ignore[attr-defined]
        made.append(s)
        return s

    yield make
    for s in reversed(made):
        s.adapter.close()


def _letters(box: SubscriptionHandle, n: int) -> list[Any]:
    got: list[Any] = []

    def more() -> bool:
        got.extend(box.pull(10))
        return len(got) >= n

    wait_until(more, 30, what=f"{n} dead letter(s) in the box")
    return got


def test_the_outbox_backs_off_while_the_broker_is_away_and_starts_afresh(
    setup: Callable[..., Setup],
) -> None:
    s = setup()
    node: MosquittoNode = s.node  # type: ignore[attr-defined]
    assert s.stats()["outbox_retry_delay"] == 0
    node.stop()
    s.drop(b"first")
    # attempts fail at 0 s, 1 s, 3 s, ...: the delay has doubled twice
    wait_until(lambda: s.stats()["outbox_retry_delay"] >= 4, 30, what="the delay doubled")
    failed = s.stats()
    assert failed["outbox_failures"] >= 3
    assert failed["outbox_retry_delay"] == 2 ** (failed["outbox_failures"] - 1)
    node.start()
    [letter] = _letters(s.box, 1)
    assert letter.body == b"first" and letter.headers[HEADER_DROPPED_REASON] == "overflow"
    wait_until(lambda: s.stats()["dead_letters_sent"] == 1, 10, what="the letter confirmed")
    after = s.stats()
    assert (after["outbox_failures"], after["outbox_retry_delay"]) == (0, 0)


def test_a_refused_letter_whose_box_was_deleted_is_kept_until_the_box_is_back(
    setup: Callable[..., Setup],
) -> None:
    """The broker's ACL refuses the destination for good, and its box is gone: the
    parked letter has no queue to go to.  It is kept (stranded, in the stats) and moved
    into the box as soon as the box is opened again."""
    s = setup(refuse=True)
    s.adapter.delete_subscription("box")
    s.drop(b"first", b"second")
    wait_until(lambda: s.stats()["dead_letters_parked"] == 2, 30, what="the letters parked")
    assert s.stats()["dead_letters_stranded"] == 2
    box = s.adapter.subscription(s.box_spec)
    letters = _letters(box, 2)
    assert [m.body for m in letters] == [b"first", b"second"]
    assert {m.headers[HEADER_DROPPED_FROM] for m in letters} == {"sub"}
    assert s.stats()["dead_letters_stranded"] == 0
