"""The Kafka topics the adapter knows of: a cached listing of the cluster's topics, the
topic creation policy, and topic ids (which change when a topic is deleted and created
again, or when a memory-only broker restarts empty).

``Topics.ensure`` runs before the first publish to a topic: with ``topic_policy =
"create"`` a missing topic is created with the configured partitions, replication factor
and topic configuration; with ``"existing"`` a missing topic raises
``core.adapter.TopicUnavailable``, which core answers with TopicNotSupportedFault.  The
producer never lets the broker create topics implicitly
(``allow.auto.create.topics`` false), so every topic has the configured shape.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from wsnmom.core.adapter import AdapterError, AdapterUnavailable, TopicUnavailable

from .config import KafkaSettings

__all__ = ["Topics"]

log = logging.getLogger("wsnmom.adapters.kafka")


class Topics:
    """Cached knowledge of the cluster's topics.  Thread-safe."""

    def __init__(self, admin: AdminClient, settings: KafkaSettings) -> None:
        self._admin = admin
        self._settings = settings
        self._lock = threading.Lock()
        #: topic name -> partition count, from the last listing
        self._partitions: dict[str, int] = {}
        self._listed_at = 0.0
        #: topic name -> when the cluster last said it has it (``missing``, ``_create``)
        self._verified: dict[str, float] = {}
        #: serialises creation per topic name
        self._creating: dict[str, threading.Lock] = {}
        #: called after this process created a topic (the head reader looks for it)
        self.on_created: Callable[[], None] | None = None

    # -- listing ----------------------------------------------------------------------------
    def refresh(self, timeout: float = 5.0) -> dict[str, int]:
        """List the cluster's topics now (name -> partitions)."""
        try:
            metadata = self._admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise AdapterUnavailable(f"listing Kafka topics failed: {exc}") from exc
        listing = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and topic.partitions
        }
        with self._lock:
            self._partitions = listing
            self._listed_at = time.monotonic()
        return dict(listing)

    def listing(self, max_age: float) -> dict[str, int]:
        """The cached listing, refreshed when older than ``max_age`` seconds."""
        with self._lock:
            if time.monotonic() - self._listed_at <= max_age:
                return dict(self._partitions)
        return self.refresh()

    def partitions(self, name: str) -> int:
        """Partitions of ``name`` by the last listing (0 when unknown)."""
        with self._lock:
            return self._partitions.get(name, 0)

    def forget(self, name: str) -> None:
        """``name`` turned out to be missing (the broker said so): check again next time."""
        with self._lock:
            self._partitions.pop(name, None)

    def missing(self, names: Iterable[str], timeout: float, since: float | None = None) -> set[str]:
        """Which of ``names`` the cluster says it does not have (one DescribeTopics
        request), forgotten from the listing; AdapterUnavailable when the answer for one
        of them does not come within ``timeout`` seconds.  With ``since`` (monotonic),
        names found or created after then are not asked for again."""
        with self._lock:
            names = sorted(
                n for n in set(names) if since is None or self._verified.get(n, 0.0) <= since
            )
        if not names:
            return set()
        asked = time.monotonic()
        futures = self._admin.describe_topics(
            TopicCollection(names), request_timeout=max(timeout, 0.1)
        )
        gone: set[str] = set()
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise AdapterUnavailable(f"describing Kafka topic {name!r}: {exc}") from exc
                gone.add(name)
        with self._lock:
            for name in names:
                if name in gone:
                    self._partitions.pop(name, None)
                    self._verified.pop(name, None)
                else:
                    self._verified[name] = asked
        return gone

    def topic_ids(self, names: Iterable[str], timeout: float = 5.0) -> dict[str, str]:
        """The topic id of each existing topic of ``names`` (missing ones are left out)."""
        names = list(names)
        if not names:
            return {}
        out: dict[str, str] = {}
        futures = self._admin.describe_topics(TopicCollection(names), request_timeout=timeout)
        for name, future in futures.items():
            try:
                out[name] = str(future.result().topic_id)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    log.debug("describing topic %s failed: %s", name, exc)
        return out

    # -- creation ---------------------------------------------------------------------------
    def ensure(
        self,
        name: str,
        *,
        partitions: int | None = None,
        internal: bool = False,
        timeout: float = 10.0,
        listing_timeout: float = 5.0,
        answering: Callable[[], bool] | None = None,
    ) -> None:
        """Make sure topic ``name`` exists before publishing to it (see the module
        docstring); ``internal`` topics are created whatever the policy.  Waits at most
        ``listing_timeout`` seconds for the listing and ``timeout`` in all, and raises
        AdapterUnavailable as soon as ``answering`` says the cluster stopped answering."""
        with self._lock:
            if name in self._partitions:
                return
            lock = self._creating.setdefault(name, threading.Lock())
        with lock:
            if name in self.refresh(timeout=min(listing_timeout, timeout)):
                return
            if self._settings.topic_policy != "create" and not internal:
                raise TopicUnavailable(
                    f"the Kafka topic {name!r} does not exist and this gateway does not "
                    "create topics (topic_policy = existing)"
                )
            self._create(name, partitions or self._settings.partitions, timeout, answering)

    def _create(
        self,
        name: str,
        partitions: int,
        timeout: float = 10.0,
        answering: Callable[[], bool] | None = None,
    ) -> None:
        settings = self._settings
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=settings.replication_factor,
            config=dict(settings.topic_config),
        )
        future = self._admin.create_topics([topic], request_timeout=max(timeout, 0.1))[name]
        try:
            while answering is not None and not future.done():
                if not answering():
                    raise AdapterUnavailable(f"creating Kafka topic {name!r}: no answer")
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    future.result(timeout=0.05)
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                if error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT):
                    raise AdapterUnavailable(f"creating Kafka topic {name!r}: {error}") from exc
                raise AdapterError(f"creating Kafka topic {name!r} failed: {error}") from exc
        else:
            log.info("created Kafka topic %s (%d partitions)", name, partitions)
        with self._lock:
            self._partitions[name] = max(self._partitions.get(name, 0), partitions)
            self._verified[name] = time.monotonic()
        if self.on_created is not None:
            self.on_created()
