"""The topics a Kafka publish needs (:class:`TopicCheck`, used by ``Publisher``,
:mod:`.publisher`): each created when missing before the publish produces
(``Topics.ensure``), and the look whether the cluster lost them.

After a lost connection (before producing) and for a publish not confirmed within a
quarter of ``unavailable_grace``, the publish asks the cluster for the internal topic and
its topics (DescribeTopics).  Topics it lost are created again at once; without the
internal topic the cluster lost its state (a memory-only broker restarted empty, a cluster
re-created), the producer id too, and the publisher replaces the producer.  One look at a
time: a publish that waited for another's asks only for what that one did not find.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Producer
from wsnmom.core.adapter import AdapterError, AdapterUnavailable

from .clients import Health
from .config import KafkaSettings
from .mapping import Destination, KafkaMapping
from .topics import Topics

__all__ = ["TopicCheck"]

log = logging.getLogger("wsnmom.adapters.kafka")


class TopicCheck:
    """The publisher's topics: created when missing, and looked for after a lost
    connection or while a publish waits (module docstring).  Thread-safe."""

    def __init__(
        self,
        settings: KafkaSettings,
        mapping: KafkaMapping,
        topics: Topics,
        health: Health,
        renew: Callable[[str, Producer | None], None],
        producer: Callable[[], Producer | None],
    ) -> None:
        self._settings = settings
        self._mapping = mapping
        self._topics = topics
        self._health = health
        #: replace the producer (``Publisher.renew``) unless the one given was replaced
        self._renew = renew
        #: the publisher's current producer
        self._producer = producer
        #: ``Health.epoch`` when the cluster's topics were last checked (``check``,
        #: written under ``_checking``, which serialises the checks)
        self.checked_epoch = 0
        self._checking = threading.Lock()

    def ensure(
        self,
        logs: dict[str, Destination],
        deadline: float,
        grace: float,
        answering: Callable[[], bool],
    ) -> None:
        """``Topics.ensure`` for each of ``logs`` (created when missing); ``answering``:
        whether the cluster still answers the publish (``Publisher._answering``)."""
        for dest in logs.values():
            internal = dest.log == self._mapping.internal_topic
            self._topics.ensure(
                dest.log,
                partitions=self._settings.internal_partitions if internal else None,
                internal=internal,
                timeout=max(0.0, deadline - time.monotonic()),
                listing_timeout=grace,
                answering=answering,
            )

    def check(self, logs: dict[str, Destination], since: float | None, timeout: float) -> None:
        """Whether the cluster still has the internal topic and ``logs`` (module
        docstring; ``since``: not those found after then); nothing when it does not
        answer within ``timeout`` (the publish's own wait decides then).  One check at a
        time: a publish that waited for another's asks only for what that one did not
        find (``since``), and before producing (``since`` None) not at all once a check
        followed the lost connection.  Concurrent checks each sent their own request:
        98 DescribeTopics for 128 threads publishing to 8 topics while the broker was
        held 1 s, 8 now (load 1.5)."""
        if not self._checking.acquire(timeout=max(timeout, 0.0)):
            return  # another publish's check outlasts this one's wait
        try:
            if since is None and self._health.epoch == self.checked_epoch:
                return  # checked after the lost connection while this one waited
            self._check_now(logs, since, timeout)
        finally:
            self._checking.release()

    def _check_now(self, logs: dict[str, Destination], since: float | None, timeout: float) -> None:
        epoch = self._health.epoch
        producer = self._producer()
        internal = self._mapping.internal_topic
        try:
            gone = self._topics.missing({internal, *logs}, timeout, since=since)
        except AdapterUnavailable as exc:
            log.debug("checking the Kafka topics failed: %s", exc)
            return
        self.checked_epoch = epoch
        if internal not in gone:
            if gone:
                log.warning(
                    "Kafka topic(s) %s are gone from the cluster: creating them again",
                    ", ".join(sorted(gone)),
                )
            return
        try:  # the listing confirms it (and forgets every topic that is gone)
            if internal in self._topics.refresh(timeout=timeout):
                return
        except AdapterError:
            return
        log.warning(
            "the Kafka cluster lost its topics (%s is gone: a memory-only broker restarted "
            "empty, or the cluster was re-created): creating them again as they are "
            "published to, with a new producer id",
            internal,
        )
        self._renew("the cluster lost its topics and the producer id", producer)
        try:
            self._topics.ensure(
                internal,
                partitions=self._settings.internal_partitions,
                internal=True,
                timeout=timeout,
                listing_timeout=timeout,
            )
        except AdapterError as exc:
            log.warning("creating the Kafka topic %s again failed: %s", internal, exc)

    def while_waiting(
        self,
        logs: dict[str, Destination],
        started: float,
        deadline: float,
        grace: float,
        answering: Callable[[], bool],
    ) -> None:
        """``check`` for a publish not yet confirmed, then ``ensure``: librdkafka sends
        what waits for a topic created again as soon as it sees it."""
        left = min(started + grace, deadline) - time.monotonic()
        self.check(logs, started, max(left, 0.1))
        self.ensure(logs, deadline, grace, answering)
