"""Raw confluent-kafka baselines of the Kafka benchmark (``bench.middleware.Kafka``): what
the broker does for the delivery and fan-out scenarios without the gateway."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench import raw_ingress
from bench.util import timed_threads


def _from_the_start(bootstrap: str, topic: str) -> Any:
    """A consumer of ``topic``'s partition 0 from its first record (a group of its own,
    no commits, fetches answered within 20 ms)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 20,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    return c


def _setter(event: threading.Event) -> Callable[[Any, Any], None]:
    """A delivery callback that sets ``event``."""
    return lambda error, message: event.set()


def _counter(
    count: int, event: threading.Event, errors: list[BaseException]
) -> Callable[[Any, Any], None]:
    """A delivery callback that sets ``event`` at the ``count``-th report (reports come
    from one poll thread) and records failures in ``errors``."""
    left = [count]

    def report(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(RuntimeError(str(error)))
        left[0] -= 1
        if left[0] == 0:
            event.set()

    return report


def _topic(bootstrap: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    return name


def roundtrip(bootstrap: str, count: int, body: bytes, publishers: int) -> dict[str, float]:
    """``publishers`` threads sharing one idempotent producer (acks=all), each waiting
    for the delivery report of every message before the next (as the gateway's request
    threads share its producer and confirm each Notify), and one consumer reading the
    topic from its start.

    One producer, not one per thread: tansu 0.6 makes records of concurrent producers
    (several connections) visible out of offset order, so a consumer at the tail skips
    a record now and then (it is there when read again later); a single producer
    connection is served in order."""
    from confluent_kafka import Producer

    topic = _topic(bootstrap)
    received = [0]
    errors: list[BaseException] = []
    done = threading.Event()
    ready = threading.Event()

    def consumer() -> None:
        try:
            c = _from_the_start(bootstrap, topic)
            ready.set()
            deadline = time.monotonic() + 120
            while received[0] < count and time.monotonic() < deadline:
                received[0] += sum(1 for m in c.consume(500, 0.1) if m.error() is None)
            c.close()
        except BaseException as exc:
            errors.append(exc)
            ready.set()
        finally:
            done.set()

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
        }
    )

    def publisher(k: int) -> None:
        try:
            headers = [("content-type", b"application/xml")]
            for _ in range(k, count, publishers):
                confirmed = threading.Event()
                producer.produce(topic, body, headers=headers, on_delivery=_setter(confirmed))
                while not confirmed.is_set():
                    producer.poll(0.01)
        except BaseException as exc:
            errors.append(exc)

    cthread = threading.Thread(target=consumer)
    cthread.start()
    ready.wait(30)
    # each publisher waits for its records' reports: nothing is left to flush once joined
    _, elapsed = timed_threads(publisher, publishers, done)
    cthread.join(5)
    if errors:
        raise RuntimeError(f"raw confluent-kafka round trip failed: {errors[0]!r}")
    if received[0] < count:
        raise RuntimeError(f"raw Kafka round trip: only {received[0]}/{count} consumed")
    return {"seconds": elapsed, "msgs_per_s": count / elapsed}


def fanout(bootstrap: str, size: int) -> float:
    """One record produced (acks=all), read once, and ``size`` durable positions moved
    past it: one consumer-group offset commit per subscription, all in flight at once
    (what the gateway's cursors cost Kafka, without the gateway)."""
    from confluent_kafka import (
        Consumer,
        ConsumerGroupTopicPartitions,
        Producer,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient

    topic = _topic(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-fan"})
    prefix = f"bench-fan-{uuid.uuid4().hex[:8]}."
    try:
        started = time.perf_counter()
        producer.produce(topic, b"<x/>")
        producer.flush(10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        record = None
        while record is None or record.error() is not None:
            record = consumer.poll(5)
            if record is None:
                raise RuntimeError("raw Kafka fan-out: the record did not arrive")
        futures = [
            future
            for i in range(size)
            for future in admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(f"{prefix}{i}", [TopicPartition(topic, 0, 1)])]
            ).values()
        ]
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - started
        groups = [f"{prefix}{i}" for i in range(size)]
        for start in range(0, size, 500):
            for future in admin.delete_consumer_groups(groups[start : start + 500]).values():
                future.result()
        return elapsed
    finally:
        consumer.close()


def latency(
    bootstrap: str, rate: float, seconds: float, body: bytes, threads: int = 16
) -> dict[str, float]:
    """The delivery scenario's latency measurement without the gateway: ``threads``
    threads share one producer configured like the adapter's (idempotent, ``acks=all``,
    ``linger.ms`` 5), each producing at its share of ``rate`` per second and waiting for
    the delivery report (as a Notify waits; one thread serves the reports, as the
    adapter's poll thread does), while one consumer configured like the
    adapter's head reader (``fetch.wait.max.ms`` 20; what is queued, else one poll)
    takes them.  Latency: intended produce time to arrival at the consumer, in ms."""
    from confluent_kafka import Producer

    topic = _topic(bootstrap)
    total = int(rate * seconds)
    intended: dict[bytes, float] = {}
    latencies: list[float] = []
    late = [0]
    lock = threading.Lock()
    stop = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        c = _from_the_start(bootstrap, topic)
        ready.set()
        while not stop.is_set():
            got = c.consume(500, 0)
            if not got:
                first = c.poll(0.02)
                got = [first] if first is not None else []
            now = time.monotonic()
            with lock:
                for m in got:
                    if m.error() is None and m.key() in intended:
                        latencies.append((now - intended[m.key()]) * 1000.0)
        c.close()

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    reader = threading.Thread(target=consume)
    reader.start()
    ready.wait(30)
    # warm: the producer has its id and the topic's metadata, the consumer is fetching
    with lock:
        intended[b"warm"] = time.monotonic()
    producer.produce(topic, body, b"warm")
    producer.flush(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if latencies:
                latencies.clear()
                break
        time.sleep(0.01)
    start = time.monotonic() + 0.2

    def publish(k: int) -> None:
        for i in range(k, total, threads):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.01:
                late[0] += 1
            key = b"%d" % i
            with lock:
                intended[key] = due
            confirmed = threading.Event()
            producer.produce(topic, body, key, on_delivery=_setter(confirmed))
            confirmed.wait(30)

    def serve_reports() -> None:  # one thread serves the delivery reports, as the adapter's
        while not stop.is_set():
            producer.poll(0.05)

    poller = threading.Thread(target=serve_reports)
    poller.start()
    publishers = [threading.Thread(target=publish, args=(k,)) for k in range(threads)]
    for t in publishers:
        t.start()
    for t in publishers:
        t.join()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if len(latencies) >= total:
                break
        time.sleep(0.05)
    stop.set()
    reader.join(10)
    poller.join(10)
    producer.flush(10)
    ordered = sorted(latencies)
    if not ordered:
        raise RuntimeError("raw Kafka latency: nothing arrived")

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]

    return {"p50_ms": pct(50), "p99_ms": pct(99), "received": len(ordered), "late": late[0]}


def ingress(
    bootstrap: str, bodies: list[bytes], seconds: float, threads: int = 16, linger_ms: int = 5
) -> dict[str, float]:
    """The ingress scenario's Notifies without the gateway: ``threads`` threads (the
    gateway's request threads) share one producer configured like the adapter's
    (idempotent, ``acks=all``, ``linger.ms`` 5) and one thread serving its delivery
    reports (the adapter's poll thread); each thread produces ``bodies`` (one Notify's
    messages) and waits for all their reports, again and again for ``seconds``
    (``bench.raw_ingress.run``).  Returns ``{"rps": Notifies/s, "msgs_per_s": ...}``."""
    from confluent_kafka import Producer

    topic = _topic(bootstrap)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
        }
    )
    stop = threading.Event()
    headers = [("content-type", "application/xml")]

    def serve_reports() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    def notify() -> None:
        confirmed = threading.Event()
        errors: list[BaseException] = []
        report = _counter(len(bodies), confirmed, errors)
        for body in bodies:
            producer.produce(topic, body, headers=headers, on_delivery=report)
        if not confirmed.wait(30):
            raise RuntimeError("raw Kafka ingress: no delivery report in 30 s")
        if errors:
            raise errors[0]

    poller = threading.Thread(target=serve_reports)
    poller.start()
    try:
        # warm: producer id and topic metadata
        producer.produce(topic, bodies[0])
        producer.flush(30)
        return raw_ingress.run(notify, len(bodies), seconds, threads, "confluent-kafka")
    finally:
        stop.set()
        poller.join(10)
        producer.flush(10)
