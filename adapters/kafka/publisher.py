"""Publishing: one idempotent producer (``acks=all``), its delivery reports served by a
poll thread, and publishes that return only once the broker confirmed every message.

* ``publish_many`` produces every message of a batch first and then waits for all their
  delivery reports (pipelined), so a 100-message Notify costs one round trip, not 100.
* The poll thread (``wsnmom-kafka-poll``) calls ``Producer.poll`` continuously; delivery
  callbacks only record the outcome and wake the waiting publisher (they never produce).
  ``flush`` runs only at ``close``.
* A full local queue (``BufferError``) is waited out within the publish timeout.
* While the cluster is known to be unreachable (``Health``), a publish waits at most
  ``unavailable_grace`` seconds for it and then fails without producing anything, so a
  message the publisher was told had failed is never sent later.
* A publish that is not confirmed within a quarter of ``unavailable_grace`` asks for a
  reachability probe at once; when the cluster has answered nothing since the publish
  began (or is known unreachable) ``unavailable_grace`` seconds after it began, the
  publish fails (PublishUnavailable) and the producer is replaced, so what it still
  queues is never sent.  A broker that stopped while a Notify waited (SIGSTOP, a hung
  machine) held that Notify for the whole publish timeout before (19.1 s measured);
  messages already on the wire may still be written when it comes back.
* A fatal producer error (the idempotent producer's state is lost, e.g. the broker
  forgot the producer id) fails what is outstanding and a new producer takes over.
* Topics the cluster lost (``TopicCheck``, :mod:`.topic_check`): after a lost
  connection (before producing) and for a publish not confirmed within a quarter of
  ``unavailable_grace``, the publisher asks the cluster for the internal topic and the
  publish's topics (DescribeTopics).  Topics it lost are created again at once; without
  the internal topic the cluster lost its state (a memory-only broker restarted empty, a
  cluster re-created), the producer id too, and the producer is replaced.  Before, such a
  publish went to a topic the adapter believed existed: librdkafka holds a record for a
  topic missing from the metadata ``topic.metadata.propagation.max.ms`` (30 s), so it
  timed out (``message.timeout.ms``) and the Notify was refused after 30 s.  What a
  replaced producer purged unsent (``_PURGE_QUEUE``) is produced again on the new one,
  unless a connection was lost since it was produced and the cluster kept its state: a
  record waiting for a retry after a lost connection is purged from the queue too,
  though the broker may have written it (a new producer id would write it twice); it
  fails.
* A replaced producer is polled until it holds nothing (``_retired``), and a publish
  that produced on a producer replaced meanwhile purges what it still queues and
  produces it again (``_produce_all``).  Before, a record produced on the old producer
  just after its purge was written, but its report was never served: the publish
  failed after its whole timeout (a duplicate when retried).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    AdapterUnavailable,
    OutboundMessage,
    PublishFailed,
    PublishReceipt,
)
from wsnmom.topic_mapping.model import Topic

from .clients import HEADER_CONTENT_TYPE, Health, client_hooks
from .config import KafkaSettings
from .mapping import Destination, KafkaMapping
from .reports import Batch
from .topic_check import TopicCheck
from .topics import Topics

__all__ = ["PublishUnavailable", "Publisher"]

log = logging.getLogger("wsnmom.adapters.kafka")

#: called with (destination, message, partition, offset, timestamp ms) for each confirmed
#: message (the current-message cache)
Confirmed = Callable[[Destination, OutboundMessage, int, int, int], None]

#: times a publish produces what a replaced producer purged unsent (``_PURGE_QUEUE``)
_ATTEMPTS = 3
_PURGED = KafkaError._PURGE_QUEUE


class PublishUnavailable(PublishFailed, AdapterUnavailable):
    """A publish could not be confirmed because the cluster is unreachable."""


class Publisher:
    """The adapter's producer (see the module docstring).  Thread-safe."""

    def __init__(
        self,
        settings: KafkaSettings,
        mapping: KafkaMapping,
        topics: Topics,
        health: Health,
        confirmed: Confirmed | None = None,
    ) -> None:
        self._settings = settings
        self._mapping = mapping
        self._topics = topics
        self._health = health
        self._confirmed = confirmed
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._outstanding: set[Batch] = set()
        #: replaced producers the poll thread still polls until each has no message left:
        #: a publish may have produced on one after it was replaced (``_produce_all``)
        self._retired: list[Producer] = []
        self._running = False
        self._thread: threading.Thread | None = None
        #: ``Health.epoch`` when the producer was made (connections lost since: a publish
        #: timeout may be a broker that forgot the producer id)
        self._epoch = 0
        #: when the producer was made (monotonic)
        self._made_at = 0.0
        #: the topics a publish needs, and the look whether the cluster lost them
        self._topic_check = TopicCheck(
            settings,
            mapping,
            topics,
            health,
            self._renew_wiped,
            self._current,
        )
        #: the last producer replaced because the cluster lost its state (its writes too)
        self._wiped: Producer | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def _new_producer(self) -> Producer:
        config: dict[str, Any] = {
            **self._settings.producer(),
            **client_hooks(self._health),
            "allow.auto.create.topics": False,
        }
        original = config["error_cb"]

        def on_error(error: KafkaError) -> None:
            original(error)
            if error.fatal():
                log.error("the Kafka producer failed fatally (%s); replacing it", error.str())
                self._replace(error)

        config["error_cb"] = on_error
        return Producer(config)

    def start(self) -> None:
        """Create the producer and its poll thread."""
        with self._lock:
            if self._running:
                return
            self._producer = self._new_producer()
            self._epoch = self._topic_check.checked_epoch = self._health.epoch
            self._made_at = time.monotonic()
            self._running = True
        self._thread = threading.Thread(
            target=self._poll_loop, name="wsnmom-kafka-poll", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop."""
        with self._lock:
            if not self._running:
                return
            self._running = False
            producer = self._producer
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        if producer is not None:
            remaining = producer.flush(timeout)
            if remaining:
                log.warning("%d message(s) were not confirmed by Kafka before close", remaining)
        with self._lock:
            batches, self._outstanding = self._outstanding, set()
            self._producer = None
            self._retired.clear()
        for batch in batches:
            batch.fail_all(KafkaError(KafkaError._DESTROY, "the adapter closed"))

    def _current(self) -> Producer | None:
        with self._lock:
            return self._producer

    def _poll_loop(self) -> None:
        while True:
            with self._lock:
                if not self._running:
                    return
                producer = self._producer
                retired = tuple(self._retired)
            if producer is None:
                time.sleep(0.05)
                continue
            try:
                producer.poll(0.1)
                for old in retired:
                    old.poll(0)
                    with self._lock:  # a publish adds it again under the lock (_produce_all)
                        if len(old) == 0 and old in self._retired:
                            self._retired.remove(old)  # every report served
            except Exception:
                log.exception("polling the Kafka producer failed")
                time.sleep(0.1)

    def _replace(self, error: KafkaError) -> None:
        """A fatal error: fail every outstanding batch and start a fresh producer."""
        with self._lock:
            if not self._running:
                return
            batches, self._outstanding = self._outstanding, set()
            if self._producer is not None:
                self._retired.append(self._producer)
            self._producer = self._new_producer()
            self._epoch = self._health.epoch
            self._made_at = time.monotonic()
        for batch in batches:
            batch.fail_all(error)

    def renew(
        self, why: str, only: Producer | None = None, made_before: float | None = None
    ) -> None:
        """Start a fresh producer (a new producer id) and drop what the old one still
        holds: what it had sent fails, what it had not sent yet is produced again by
        its publishes (``_ATTEMPTS``).  For a broker that forgot the producer id (a
        memory-only broker restarted): librdkafka then retries with a locally bumped
        epoch the broker does not know either, until the message times out.  With
        ``only``: unless another publish replaced that producer already; with
        ``made_before`` (monotonic): only if the producer was made before then."""
        with self._lock:
            if not self._running or self._producer is None:
                return
            if only is not None and self._producer is not only:
                return
            if made_before is not None and self._made_at > made_before:
                log.debug("not replacing the Kafka producer (%s): it is newer", why)
                return
            old = self._producer
            self._retired.append(old)
            self._producer = self._new_producer()
            self._epoch = self._health.epoch
            self._made_at = time.monotonic()
        log.warning("replacing the Kafka producer: %s", why)
        try:
            old.purge(in_queue=True, in_flight=True)
            old.poll(0)  # the purged messages' delivery callbacks fail their publishes
        except Exception:
            log.debug("purging the old Kafka producer failed", exc_info=True)

    def _renew_wiped(self, why: str, producer: Producer | None) -> None:
        """``renew(only=producer)`` for a cluster that lost its state (``TopicCheck``):
        what ``producer`` wrote is gone, so its purged records are produced again."""
        self._wiped = producer
        self.renew(why, only=producer)

    # -- publishing -------------------------------------------------------------------------
    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt]:
        """Produce ``messages`` and wait for every delivery report (see the module
        docstring); PublishFailed when one is refused or not confirmed in time."""
        started = time.monotonic()
        deadline = started + timeout
        destinations = [self._mapping.destination(m.topic) for m in messages]
        grace = min(timeout, self._settings.unavailable_grace)
        if not self._health.wait_available(grace):
            # nothing is produced: a message queued now would be sent when the cluster
            # answers again, after the publisher was told it failed (a duplicate on retry)
            raise PublishUnavailable(
                f"the Kafka cluster is unreachable (waited {grace:.1f}s for it)"
            )
        logs = {d.log: d for d in destinations}
        topic_check, answering = self._topic_check, partial(self._answering, started)
        if self._health.epoch != topic_check.checked_epoch:
            # a connection was lost since the last look: the cluster may have come back
            # without its topics and the producer id (a memory-only broker restarted)
            topic_check.check(logs, None, grace)
        topic_check.ensure(logs, deadline, grace, answering)
        batch = Batch(len(messages))
        with self._lock:
            producer = self._producer
            if producer is None or not self._running:
                raise PublishUnavailable("the Kafka adapter is not open")
            self._outstanding.add(batch)
        try:
            pending: Sequence[int] = range(len(messages))
            check = partial(topic_check.while_waiting, logs, started, deadline, grace, answering)
            epoch = self._health.epoch  # a connection lost after: maybe written (docstring)
            for _ in range(_ATTEMPTS):
                self._produce_all(producer, batch, pending, messages, destinations, deadline)
                if not self._wait(batch, started, deadline, check):
                    error = self._timeout_error(len(messages), batch, started)
                    if self._epoch != self._health.epoch or not self._answering(started):
                        self.renew(
                            "a publish was not confirmed and the cluster does not answer",
                            producer,
                        )
                    raise error
                pending = self._purged(batch)
                with self._lock:
                    current = self._producer
                if not pending or current in (None, producer) or time.monotonic() >= deadline:
                    break
                if self._health.epoch != epoch and self._wiped is not producer:
                    break  # maybe sent, then back in the queue: they fail (module docstring)
                # the producer was replaced before it sent them: the new one sends them
                producer, epoch = current, self._health.epoch
                batch.rearm(pending)
        finally:
            with self._lock:
                self._outstanding.discard(batch)
        return self._receipts(messages, destinations, batch)

    @staticmethod
    def _purged(batch: Batch) -> list[int]:
        """Indices of ``batch`` purged unsent from a producer that was replaced."""
        return [i for i, e in enumerate(batch.errors) if e is not None and e.code() == _PURGED]

    def _produce_all(
        self,
        producer: Producer,
        batch: Batch,
        pending: Sequence[int],
        messages: Sequence[OutboundMessage],
        destinations: list[Destination],
        deadline: float,
    ) -> None:
        """``_produce`` each of ``pending``; when ``producer`` was replaced meanwhile
        (``renew`` after this publish took it: its purge may have come before these
        records), purge what it still queues, so the publish produces it again on the
        new one; what it sent is reported through the poll thread (``_retired``)."""
        for index in pending:
            self._produce(producer, batch, index, messages[index], destinations[index], deadline)
        with self._lock:
            replaced = self._producer is not producer
            if replaced and self._running and producer not in self._retired:
                # dropped as empty before these records: polled again until they report
                self._retired.append(producer)
        if replaced:
            try:
                producer.purge(in_queue=True, in_flight=False)
                producer.poll(0)
            except Exception:
                log.debug("purging a replaced Kafka producer failed", exc_info=True)

    def _produce(
        self,
        producer: Producer,
        batch: Batch,
        index: int,
        message: OutboundMessage,
        dest: Destination,
        deadline: float,
    ) -> None:
        # str values: confluent-kafka encodes them as UTF-8 in C
        headers: list[tuple[str, str | bytes | None]] = [*message.headers.items()]
        if HEADER_MESSAGE_ID not in message.headers:
            headers.append((HEADER_MESSAGE_ID, message.message_id))
        headers.append((HEADER_CONTENT_TYPE, message.content_type))
        on_delivery = batch.reporter(index)

        while True:
            try:
                producer.produce(
                    dest.log, message.body, dest.key, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:
                # the local queue is full: the poll thread drains it as reports arrive
                if time.monotonic() >= deadline:
                    raise PublishFailed("the Kafka producer queue stayed full") from None
                time.sleep(0.005)
            except KafkaException as exc:
                raise PublishFailed(f"Kafka refused the message: {exc}") from exc

    def _answering(self, started: float) -> bool:
        """False once ``unavailable_grace`` passed since ``started`` while the cluster is
        known unreachable or answered no probe since then (``Health``); asks for a probe
        at once the first time a quarter of the grace has passed."""
        grace = self._settings.unavailable_grace
        waited = time.monotonic() - started
        if waited >= grace / 4 and not self._health.answered_since(started):
            self._health.poke()
        if waited < grace:
            return True
        return self._health.available and self._health.answered_since(started)

    def _wait(
        self, batch: Batch, started: float, deadline: float, check: Callable[[], None]
    ) -> bool:
        """Wait for every report of ``batch`` until ``deadline``; False when they did not
        all come, or when the cluster stopped answering (``_answering``).  Calls ``check``
        once when a quarter of ``unavailable_grace`` passed (``TopicCheck.while_waiting``)."""
        grace = self._settings.unavailable_grace
        if batch.wait(min(started + grace / 4, deadline) - time.monotonic()):
            return True
        checked = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._answering(started):
                return False
            if not checked:
                checked = True
                check()
                continue
            if batch.wait(min(remaining, 0.05)):
                return True

    def _timeout_error(self, count: int, batch: Batch, started: float) -> PublishFailed:
        waiting = batch.remaining
        text = f"Kafka did not confirm {waiting} of {count} message(s) in time"
        if not self._health.available or not self._health.answered_since(started):
            return PublishUnavailable(text + " (the cluster does not answer)")
        return PublishFailed(text)

    def _receipts(
        self, messages: Sequence[OutboundMessage], destinations: list[Destination], batch: Batch
    ) -> list[PublishReceipt]:
        failed = [(i, e) for i, e in enumerate(batch.errors) if e is not None]
        if failed:
            index, error = failed[0]
            if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                self._topics.forget(destinations[index].log)
            unanswered = (
                KafkaError._MSG_TIMED_OUT,
                KafkaError._PURGE_QUEUE,
                KafkaError._PURGE_INFLIGHT,
            )
            cls = PublishUnavailable if error.code() in unanswered else PublishFailed
            raise cls(f"Kafka refused {len(failed)} of {len(messages)} message(s): {error.str()}")
        if self._confirmed is not None:
            # the newest message per topic is the last of the batch (a topic's records
            # go to one partition, in produce order)
            seen: set[Topic] = set()
            for i in range(len(messages) - 1, -1, -1):
                message, report = messages[i], batch.reports[i]
                if report is not None and message.topic not in seen:
                    seen.add(message.topic)
                    _, stamp = report.timestamp()
                    partition, offset = report.partition() or 0, report.offset() or 0
                    self._confirmed(destinations[i], message, partition, offset, stamp)
        receipt = PublishReceipt(routed=None)
        return [receipt] * len(messages)
