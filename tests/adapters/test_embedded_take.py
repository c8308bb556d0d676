"""Embedded ``take`` (GetMessages): removals join the group-committed acks, a watermark
keeps pending ones from being taken twice, a crash before the commit hands them out
again (never a loss), requeued and expired messages are handled like ``fetch`` does."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.core.adapter import OutboundMessage, QueueLimits, Received, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.clock import EMBEDDED_ENGINE, later

NS = "urn:wsnmom:test:embedded-take"
SPEC = SubscriptionSpec("pp", (PathPattern(NS, ("t",)),))


def msg(body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(NS, ("t",)), body, uuid.uuid4().hex)


def bodies(received: Sequence[Received]) -> list[bytes]:
    return [m.body for m in received]


def test_pending_removals_are_not_taken_twice(adapter: EmbeddedAdapter) -> None:
    h = adapter.subscription(SPEC)
    adapter.publish_many([msg(b"%d" % i) for i in range(6)])
    engine = adapter._require()
    with engine.lock:  # the dispatcher cannot commit the removals meanwhile
        assert bodies(h.take(2)) == [b"0", b"1"]
        assert bodies(h.take(2)) == [b"2", b"3"]
        assert len(engine._pending_acks) == 4
    assert h.depth() == 2  # depth commits the pending removals first
    assert bodies(h.take(5)) == [b"4", b"5"]
    assert h.take(5) == []


def test_requeued_message_below_the_watermark_is_taken_again(adapter: EmbeddedAdapter) -> None:
    h = adapter.subscription(SPEC)
    adapter.publish_many([msg(b"%d" % i) for i in range(4)])
    (first,) = h.pull(1)
    assert bodies(h.take(2)) == [b"1", b"2"]
    first.nack(requeue=True)
    again = h.take(1)
    assert bodies(again) == [b"0"] and again[0].redelivered
    assert bodies(h.take(5)) == [b"3"]


def test_take_never_returns_expired_messages(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the clock moves 10 s on below; 5 s, not 0.3 s, of real time keeps what is published
    # after it fresh until it is taken, on a loaded machine too
    limits = QueueLimits(max_age=timedelta(seconds=5))
    h = adapter.subscription(SubscriptionSpec("aged", SPEC.patterns, limits))
    adapter.publish_many([msg(b"old-1"), msg(b"old-2")])
    later(monkeypatch, EMBEDDED_ENGINE, 10)  # the two are 10 s old now
    adapter.publish(msg(b"new"))
    assert bodies(h.take(5)) == [b"new"]
    assert h.depth() == 0


CHILD = textwrap.dedent(
    """
    import sys, time, uuid
    from wsnmom.adapters.embedded import EmbeddedAdapter
    from wsnmom.core.adapter import OutboundMessage, SubscriptionSpec
    from wsnmom.topic_mapping.model import PathPattern, Topic

    ns, hold = sys.argv[2], sys.argv[3] == "hold"
    a = EmbeddedAdapter("embedded://" + sys.argv[1])
    a.open()
    h = a.subscription(SubscriptionSpec("pp", (PathPattern(ns, ("t",)),)))
    a.publish_many([OutboundMessage(Topic(ns, ("t",)), b"%d" % i, uuid.uuid4().hex)
                    for i in range(10)])
    if hold:
        a._require().lock.acquire()   # the removals stay uncommitted
    taken = h.take(3)
    if not hold:
        assert h.depth() == 7         # commits the removals
    print("ready", [m.body.decode() for m in taken], flush=True)
    time.sleep(60)                    # killed here
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("hold", "left"),
    [("hold", [b"%d" % i for i in range(10)]), ("commit", [b"%d" % i for i in range(3, 10)])],
)
def test_sigkill_after_take_duplicates_or_removes_never_loses(
    store: Path, hold: str, left: list[bytes]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store), NS, hold], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready ['0', '1', '2']"), line
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    a = EmbeddedAdapter(f"embedded://{store}")
    a.open()
    try:
        h = a.subscription(SPEC)
        assert bodies(h.take(100)) == left
    finally:
        a.close()
