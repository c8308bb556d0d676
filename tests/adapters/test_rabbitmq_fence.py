"""RabbitMQ's own fence in cluster mode (issue 23 §3, docs/scale-out.md "What fences
what"): a push subscription's queue is a quorum queue with single-active-consumer, so of
two consumers on it (two gateway instances) only one receives, and the other takes over,
in order, once the first one's channel is gone.  Also: which queues get the fence, how the
limits map onto quorum queues, and what happens to classic queues made before."""

from __future__ import annotations

import json
import logging
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.adapters.rabbitmq.declarations import quorum_refusal
from wsnmom.adapters.rabbitmq.options import RabbitMQOptions
from wsnmom.core.adapter import (
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    Overflow,
    QueueLimits,
    Received,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.core.config import Settings
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.rabbitmq_queues import queue_exists
from tests.support.waiting import wait_until
from wsnmom.server import make_adapter as serve_adapter

pytestmark = pytest.mark.rabbitmq

QUORUM = {"queue_type": "quorum"}


def _message(ns: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(ns, ("t",)), body, uuid.uuid4().hex)


class _Consumer:
    """Records what one subscription handle receives; acks unless told to hold."""

    def __init__(self, hold: bool = False) -> None:
        self.got: list[Received] = []
        self.hold = hold
        self._lock = threading.Lock()

    def __call__(self, m: Received) -> None:
        with self._lock:
            self.got.append(m)
        if not self.hold:
            m.ack()

    def bodies(self) -> list[bytes]:
        with self._lock:
            return [m.body for m in self.got]


def _cluster_pair(make_adapter: Callable[..., RabbitMQAdapter]) -> list[RabbitMQAdapter]:
    pair = [make_adapter(**QUORUM), make_adapter(**QUORUM)]
    for a in pair:
        a.shared_by_instances()
    return pair


def _taken_over(
    publisher: RabbitMQAdapter,
    ns: str,
    hb: Any,
    held: Callable[[], object],
    go: Callable[[], object],
) -> _Consumer:
    """The two-consumer set-up: ten published, held by the first consumer (``held``
    returns once it holds them), then B's consumer (``hb``) started and ten more
    published: those wait in the queue and B gets nothing while the first is active;
    ``go`` ends the first consumer and B gets all twenty (returned)."""
    for i in range(10):
        publisher.publish(_message(ns, b"%d" % i))
    held()
    second = _Consumer()
    hb.start(second, prefetch=10)
    for i in range(10, 20):
        publisher.publish(_message(ns, b"%d" % i))
    wait_until(lambda: hb.depth() == 10, 10, what="ten ready behind the first one's ten")
    assert second.bodies() == []
    go()
    wait_until(lambda: len(second.bodies()) >= 20, 15, what="B took over")
    return second


def test_two_consumers_of_one_subscription_queue_only_the_active_one_receives(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any
) -> None:
    """Instance A consumes first and holds what it got (prefetch 10, nothing acked); B's
    consumer on the same queue receives nothing: the ten A cannot take stay ready in the
    queue. When A stops gracefully, B becomes the active consumer and gets all twenty in
    order: A's ten first (redelivered), then the ten that waited.  (Before, the stop
    cancelled A's consumer before closing its channel: RabbitMQ activated B at the cancel
    and B got the ten that waited before A's ten came back, behind them.)"""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    a, b = _cluster_pair(make_adapter)
    spec = SubscriptionSpec(f"f-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    ha, hb = a.subscription(spec), b.subscription(spec)
    # the queue is a quorum queue with single-active-consumer (re-declaring must match)
    native.queue_declare(
        a.queue_name(spec.name),
        durable=True,
        arguments={"x-queue-type": "quorum", "x-single-active-consumer": True},
    )
    first = _Consumer(hold=True)
    ha.start(first, prefetch=10)
    second = _taken_over(
        a,
        ns,
        hb,
        held=lambda: wait_until(
            lambda: first.bodies() == [b"%d" % i for i in range(10)], 10, what="A's ten"
        ),
        go=ha.stop,
    )
    assert second.bodies() == [b"%d" % i for i in range(20)]
    assert [m.redelivered for m in second.got] == [True] * 10 + [False] * 10
    hb.delete()


def test_a_graceful_stop_hands_over_in_order_what_was_acked_held_and_still_arriving(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any
) -> None:
    """The hand-over of a shard, as core does it: A (prefetch 10) acked the first five and
    holds the next ten, and its consumer gets more while it is being stopped (a message arrives for
    the stopped channel: left to the closing channel, not requeued, which on a quorum
    queue would put it behind the later ones).  B gets every message A did not ack,
    each once, in order, then the ones published after the stop."""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    a, b = _cluster_pair(make_adapter)
    spec = SubscriptionSpec(f"o-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    ha, hb = a.subscription(spec), b.subscription(spec)
    got: list[Received] = []
    lock = threading.Lock()

    def first(m: Received) -> None:
        with lock:
            got.append(m)
            if len(got) <= 5:
                m.ack()

    second = _Consumer()
    ha.start(first, prefetch=10)
    hb.start(second, prefetch=10)
    for i in range(15):
        a.publish(_message(ns, b"%d" % i))
    wait_until(lambda: len(got) == 15, 10, what="A's fifteen")
    # A's stop, from another thread, while five more are published: what A's consumer
    # is handed meanwhile must not be requeued behind the later ones
    stopping = threading.Thread(target=ha.stop)
    for i in range(15, 20):
        a.publish(_message(ns, b"%d" % i))
    stopping.start()
    for i in range(20, 30):
        a.publish(_message(ns, b"%d" % i))
    stopping.join(10)
    wait_until(lambda: len(second.bodies()) >= 25, 10, what="B took over")
    assert second.bodies() == [b"%d" % i for i in range(5, 30)]
    hb.delete()


def test_a_subscription_followed_from_another_instance_is_declared_only_to_be_consumed(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """Every instance follows every new subscription, and the one that made it declared
    its queue: a follower (``origin`` "elsewhere") declares nothing until it consumes
    (it holds the shard, now or after a hand-over), then it declares the queue and its
    binding itself (it may be first: the maker's Subscribe may still be under way, or
    have died after its store write).  A subscription read by pull is declared at once:
    any instance may answer a GetMessages."""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    a, b = _cluster_pair(make_adapter)
    pattern = PathPattern(ns, ("t",))
    spec = SubscriptionSpec(f"e-{uuid.uuid4().hex[:12]}", (pattern,), origin="elsewhere")
    hb = b.subscription(spec)
    assert not queue_exists(rabbitmq_url, b.queue_name(spec.name))
    got = _Consumer()
    hb.start(got, prefetch=10)
    assert queue_exists(rabbitmq_url, b.queue_name(spec.name))
    a.publish(_message(ns, b"after the start"))
    wait_until(lambda: got.bodies() == [b"after the start"], 15, what="the delivery")
    pulled = SubscriptionSpec(
        f"p-{uuid.uuid4().hex[:12]}", (pattern,), pulled=True, origin="elsewhere"
    )
    b.subscription(pulled)
    assert queue_exists(rabbitmq_url, b.queue_name(pulled.name))
    hb.delete()
    b.delete_subscription(pulled.name)


_HOLDER = """
import pika, sys
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.basic_qos(prefetch_count=10)
held = []
def on(ch_, m, p, body):
    held.append(body)
    if len(held) == 10:
        print("held", flush=True)
ch.basic_consume(sys.argv[2], on)
ch.start_consuming()
"""


def test_a_dead_consumers_messages_come_back_first_in_order(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """Across a failover after a death (kill -9; a zombie whose connection RabbitMQ
    closed for missed heartbeats), order is kept: the broker returns what the dead
    consumer held before it activates the next one, which gets those first, in order,
    then the later ones."""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    (b,) = _cluster_pair(make_adapter)[:1]
    spec = SubscriptionSpec(f"k-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    hb = b.subscription(spec)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, rabbitmq_url, b.queue_name(spec.name)],
        stdout=subprocess.PIPE,
        text=True,
    )
    stdout = holder.stdout
    assert stdout is not None

    def held() -> None:
        assert stdout.readline().strip() == "held"

    try:
        second = _taken_over(b, ns, hb, held=held, go=lambda: (holder.kill(), holder.wait(10)))
        assert second.bodies() == [b"%d" % i for i in range(20)]
        assert [m.redelivered for m in second.got] == [True] * 10 + [False] * 10
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    hb.delete()


_SAMPLER = """
import json, sys, time
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern
# an operation timeout longer than any test: a call waiting for it never answers
options = {"queue_type": "quorum", "operation_timeout": 3600}
a = RabbitMQAdapter(sys.argv[1] + "?heartbeat=1", options)
a.open()
a.shared_by_instances()
ns, kept, names = sys.argv[2], sys.argv[3], sys.argv[4:]
hs = [a.subscription(SubscriptionSpec(n, (PathPattern(ns, ("t",)),))) for n in names]
for h in hs:
    h.start(lambda m: m.ack())
hs.append(a.subscription(SubscriptionSpec(kept, (PathPattern(ns, ("kept",)),))))
while True:
    print("sleeping", flush=True)
    time.sleep(1.0)
    print("depths", json.dumps(a.depths(hs)), flush=True)
"""


def _lines(stream: Any) -> queue.Queue[str]:
    """The lines of ``stream``, read on a thread of their own (read with a deadline)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_a_depth_query_right_after_a_sigcont_answers(
    rabbitmq_url: str, make_adapter: Callable[..., RabbitMQAdapter]
) -> None:
    """An instance stopped longer than 2 to 3 AMQP heartbeats finds its connections
    closed by RabbitMQ when it continues. A call that opens a channel then (a depth
    query) used to wait for the whole operation timeout for a channel that never opened
    (10 s by default; a shutdown right after a SIGCONT waited 5 s for the thread stuck in
    it). Here the timeout is an hour: the query right after the SIGCONT must answer
    (each depth right, or None where its connection is not back yet), and the next ones
    right. (How long it takes is not asserted here.)"""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    names = [f"q-{uuid.uuid4().hex[:12]}" for _ in range(10)]
    kept = f"q-{uuid.uuid4().hex[:12]}"
    expected = [0] * len(names) + [3]
    child = subprocess.Popen(
        [sys.executable, "-c", _SAMPLER, rabbitmq_url, ns, kept, *names],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = _lines(child.stdout)
    publisher = make_adapter()

    def depths() -> list[int | None]:
        line = lines.get(timeout=60)
        while line == "sleeping":
            line = lines.get(timeout=60)
        assert line.startswith("depths "), line
        return list(json.loads(line.split(" ", 1)[1]))

    try:
        assert depths() == [0] * len(names) + [0]
        for i in range(3):
            publisher.publish(OutboundMessage(Topic(ns, ("kept",)), b"%d" % i, uuid.uuid4().hex))
        while depths() != expected:
            pass
        # stopped while it sleeps between two queries, so that the next one starts after
        # the SIGCONT
        assert lines.get(timeout=60) == "sleeping"
        child.send_signal(signal.SIGSTOP)
        # stopped longer than RabbitMQ waits for a silent connection (2 to 3 heartbeats
        # of 1 s): it closes the child's connections meanwhile
        time.sleep(4)
        child.send_signal(signal.SIGCONT)
        first = depths()
        assert all(d is None or d == e for d, e in zip(first, expected, strict=True)), first
        for _ in range(10):  # until its connection is back
            if depths() == expected:
                break
        else:
            raise AssertionError("the depths are not right again after the SIGCONT")
    finally:
        child.kill()
        child.wait()
        for name in (*names, kept):
            publisher.delete_subscription(name)


def _taken_by_both(a: RabbitMQAdapter, b: RabbitMQAdapter, spec: SubscriptionSpec) -> None:
    """Four messages published to ``spec``'s queue are taken two through each instance,
    in order (with single-active-consumer RabbitMQ would refuse the gets)."""
    ha, hb = a.subscription(spec), b.subscription(spec)
    topic = Topic(spec.patterns[0].namespace, ("t",))
    for i in range(4):
        a.publish(OutboundMessage(topic, b"%d" % i, uuid.uuid4().hex))
    wait_until(lambda: ha.depth() == 4, 10, what="four in the queue")
    taken = [m.body for m in ha.take(2)] + [m.body for m in hb.take(2)]
    assert taken == [b"0", b"1", b"2", b"3"]
    ha.delete()


def test_a_pull_point_queue_has_no_single_active_consumer(
    make_adapter: Callable[..., RabbitMQAdapter],
) -> None:
    """RabbitMQ refuses ``basic.get`` on a queue with single-active-consumer, and any
    instance answers a GetMessages: a pull point's queue (patterns in an internal
    namespace) is taken from by every instance."""
    a, b = _cluster_pair(make_adapter)
    inbox = f"{INTERNAL_NAMESPACE_PREFIX}pull:{uuid.uuid4().hex}"
    spec = SubscriptionSpec(f"p-{uuid.uuid4().hex[:12]}", (PathPattern(inbox, ("t",)),))
    assert not a.declarations.single_active(spec)
    _taken_by_both(a, b, spec)


def test_a_subscription_feeding_a_pull_point_has_no_single_active_consumer(
    make_adapter: Callable[..., RabbitMQAdapter],
) -> None:
    """A subscription whose consumer is a pull point is read by the pull point's
    GetMessages with ``basic.get`` (``SubscriptionSpec.pulled``), through any instance: its
    queue has no single-active-consumer either (RabbitMQ would refuse the get), while a
    push subscription's has."""
    a, b = _cluster_pair(make_adapter)
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    pushed = SubscriptionSpec(f"s-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    assert a.declarations.single_active(pushed)
    spec = SubscriptionSpec(f"f-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),), pulled=True)
    assert not a.declarations.single_active(spec)
    _taken_by_both(a, b, spec)


def test_a_classic_queue_made_before_stays_classic_while_it_holds_messages(
    make_adapter: Callable[..., RabbitMQAdapter],
    native: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A queue's type cannot change in place. A subscription made by a single instance
    (classic queue) that holds messages is kept classic, with a warning naming it, and
    still delivers; one that is empty and unused becomes a quorum queue with
    single-active-consumer when a cluster instance declares it."""
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    single = make_adapter()
    full = SubscriptionSpec(f"c-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    empty = SubscriptionSpec(f"e-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("u",)),))
    single.subscription(full)
    single.subscription(empty)
    single.publish(_message(ns, b"kept"))
    single.close()
    (clustered,) = _cluster_pair(make_adapter)[:1]
    with caplog.at_level(logging.WARNING, logger="wsnmom.adapters.rabbitmq"):
        handle = clustered.subscription(full)
    assert any(
        clustered.queue_name(full.name) in r.getMessage() and "stays classic" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    got = _Consumer()
    handle.start(got)
    wait_until(lambda: got.bodies() == [b"kept"], 10, what="the kept queue delivers")
    converted = clustered.subscription(empty)
    native.queue_declare(
        clustered.queue_name(empty.name),
        durable=True,
        arguments={"x-queue-type": "quorum", "x-single-active-consumer": True},
    )
    handle.delete()
    converted.delete()


def test_limits_on_quorum_queues(make_adapter: Callable[..., RabbitMQAdapter]) -> None:
    """Every ``QueueLimits`` maps onto a quorum queue argument except dropping the newest
    into a dead-letter destination: RabbitMQ 3.10 accepts ``reject-publish-dlx`` on a
    quorum queue but drops the oldest instead, so that subscription gets a classic queue
    (single-active-consumer still fences it); it is declared and enforced."""
    (a,) = _cluster_pair(make_adapter)[:1]
    d = a.declarations
    limited = QueueLimits(max_messages=2, max_bytes=4096, overflow=Overflow.DROP_OLDEST)
    args = d.queue_arguments(limited, ("dl.x", "k"), single_active=True)
    assert args["x-queue-type"] == "quorum" and args["x-overflow"] == "drop-head"
    newest = QueueLimits(max_messages=2, overflow=Overflow.DROP_NEWEST)
    assert d.queue_arguments(newest)["x-overflow"] == "reject-publish"
    assert d.queue_arguments(newest)["x-queue-type"] == "quorum"
    dlx = d.queue_arguments(newest, ("dl.x", "k"), single_active=True)
    assert dlx["x-queue-type"] == "classic" and dlx["x-overflow"] == "reject-publish-dlx"
    assert dlx["x-single-active-consumer"] is True
    # both kinds are declared on the broker, the dead-lettering one enforced: the third
    # message is refused into the dead-letter topic
    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    dead = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dl:{uuid.uuid4().hex}", ("d",))
    box = a.subscription(
        SubscriptionSpec(f"d-{uuid.uuid4().hex[:12]}", (PathPattern(dead.namespace, ("d",)),))
    )
    spec = SubscriptionSpec(f"n-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),), newest, dead)
    handle = a.subscription(spec)
    for i in range(3):
        a.publish(_message(ns, b"%d" % i))
    # (the new classic queue's primer, expired at once, is dead-lettered too: the adapter
    # drops it as it reads the box)
    dead_letters: list[bytes] = []

    def refused_arrived() -> bool:
        dead_letters.extend(m.body for m in box.take(5))
        return b"2" in dead_letters

    wait_until(refused_arrived, 10, what="the refused message dead-lettered")
    assert dead_letters == [b"2"]
    assert handle.depth() == 2
    handle.delete()
    box.delete()


def test_quorum_refuses_arguments_it_cannot_take() -> None:
    """``queue_arguments`` a quorum queue refuses are refused at start, naming them."""
    bad = RabbitMQOptions.parse({"queue_type": "quorum", "queue_arguments": {"x-max-priority": 5}})
    assert "x-max-priority" in (quorum_refusal(bad) or "")
    with pytest.raises(AdapterOptionError, match="x-queue-mode"):
        RabbitMQAdapter("amqp://h/%2F", {**QUORUM, "queue_arguments": {"x-queue-mode": "lazy"}})
    with pytest.raises(AdapterOptionError, match="reject-publish-dlx"):
        RabbitMQAdapter(
            "amqp://h/%2F", {**QUORUM, "queue_arguments": {"x-overflow": "reject-publish-dlx"}}
        )
    assert quorum_refusal(RabbitMQOptions.parse({"queue_arguments": {"x-max-priority": 5}})) is None


def test_cluster_mode_defaults() -> None:
    """On a shared store ``wsnmom serve`` makes subscription queues quorum queues and
    uses a 3 s heartbeat (what the operator names wins); push queues get
    single-active-consumer once core says the middleware is shared."""
    pg = "postgresql://wsnmom@127.0.0.1:1/wsnmom"
    adapter = serve_adapter(Settings(adapter_url="amqp://g:g@127.0.0.1:1/%2F", store_url=pg))
    assert isinstance(adapter, RabbitMQAdapter)
    assert adapter.opts.queue_type == "quorum" and adapter.parameters.heartbeat == 3
    spec = SubscriptionSpec("s", (PathPattern("urn:x", ("t",)),))
    assert not adapter.declarations.single_active(spec)
    adapter.shared_by_instances()
    assert adapter.declarations.single_active(spec)
    told = serve_adapter(
        Settings(
            adapter_url="amqp://g:g@127.0.0.1:1/%2F?heartbeat=1&queue_type=classic", store_url=pg
        )
    )
    assert isinstance(told, RabbitMQAdapter)
    assert told.opts.queue_type == "classic" and told.parameters.heartbeat == 1
    off = RabbitMQAdapter("amqp://h/%2F", {"single_active_consumer": False})
    off.shared_by_instances()
    assert not off.declarations.single_active(spec)
    single = serve_adapter(
        Settings(adapter_url="amqp://g:g@127.0.0.1:1/%2F", store_url="sqlite:////tmp/x.db")
    )
    assert isinstance(single, RabbitMQAdapter)
    assert single.opts.queue_type == "classic" and single.parameters.heartbeat == 30


def test_a_consumer_that_could_not_start_is_not_started_by_a_reconnect(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any
) -> None:
    """A start that fails (here: the queue was replaced behind the adapter's back by an
    exclusive queue of another connection, so the consume is refused, RESOURCE_LOCKED)
    leaves the handle not consuming: core tries again later, and the connection's resume
    after a reconnect must not start a consumer whose deliveries would reach a stopped
    channel (on a single-active-consumer queue it would also keep the deliverer's
    consumer waiting).  That queue gone, a start declares the queue again (its consume
    found none) and consumes."""
    from wsnmom.core.adapter import AdapterError

    ns = f"urn:test:fence:{uuid.uuid4().hex}"
    (a,) = _cluster_pair(make_adapter)[:1]
    spec = SubscriptionSpec(f"n-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    handle = a.subscription(spec)
    queue = a.queue_name(spec.name)
    native.queue_delete(queue)
    native.queue_declare(queue, exclusive=True)
    got = _Consumer()
    with pytest.raises(AdapterError):
        handle.start(got, prefetch=10)
    assert not handle.consuming  # type: ignore[attr-defined]
    native.queue_delete(queue)
    a.subscription(spec)
    handle.start(got, prefetch=10)
    a.publish(_message(ns, b"after"))
    wait_until(lambda: got.bodies() == [b"after"], 10, what="the message after the start")
    handle.delete()
