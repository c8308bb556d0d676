"""The ``adapters.logbase`` backend over confluent-kafka (``LogBackend``): it makes the head
reader and the catch-up readers (``readers.py``) and the position store (``positions.py``),
and answers ``may_carry`` from the topic mapping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka.admin import AdminClient
from wsnmom.adapters.logbase.backend import LogRecord
from wsnmom.topic_mapping.model import PathPattern

from .clients import Health, client_hooks
from .closing import Closing
from .config import KafkaSettings
from .mapping import KafkaMapping
from .positions import KafkaPositionStore
from .readers import KafkaHeadReader, KafkaReader
from .topics import Topics

__all__ = ["KafkaBackend"]


class KafkaBackend:
    """``LogBackend`` over one Kafka cluster."""

    def __init__(
        self,
        settings: KafkaSettings,
        mapping: KafkaMapping,
        admin: AdminClient,
        topics: Topics,
        health: Health,
        observe: Callable[[LogRecord], None] | None = None,
    ) -> None:
        self.settings = settings
        self.mapping = mapping
        self.admin = admin
        self.topics = topics
        self.health = health
        #: sees every record the head reads (the current-message cache)
        self.observe = observe
        self._head: KafkaHeadReader | None = None
        self._readers = 0
        #: called when a followed topic started again below its old end (re-created,
        #: or the broker restarted empty), with when its old incarnation was last seen
        #: (monotonic): the publisher renews a producer id older than that
        self.on_reset: Callable[[float], None] | None = None
        #: when the head reader last polled (monotonic; 0: never)
        self.head_polled = 0.0
        #: the adapter's close, once begun (adapters/kafka/closing.py)
        self.closing = Closing()

    @property
    def following(self) -> bool:
        """Whether the head reader is reading now (polled within the last second)."""
        return self._head is not None and time.monotonic() - self.head_polled < 1.0

    def head_reader(self) -> KafkaHeadReader:
        """A new head reader (the engine keeps one)."""
        self._head = KafkaHeadReader(self)
        return self._head

    def reader(self) -> KafkaReader:
        """A new catch-up reader."""
        self._readers += 1
        return KafkaReader(self, f"{self.settings.head_group}.reader")

    def position_store(self) -> KafkaPositionStore:
        """The cursor groups."""
        return KafkaPositionStore(self.new_admin, self.settings, self.health, self.closing)

    def new_admin(self) -> AdminClient:
        """An admin client configured like the adapter's."""
        return AdminClient(
            {
                **self.settings.admin(),
                **client_hooks(self.health, side=True),
                "allow.auto.create.topics": False,
            }
        )

    def may_carry(self, log: str, patterns: tuple[PathPattern, ...] | None) -> bool:
        """See ``KafkaMapping.may_carry``."""
        return self.mapping.may_carry(log, patterns)

    def topic_created(self) -> None:
        """The adapter created a topic: the head looks for it at once."""
        head = self._head
        if head is not None:
            head.discover_soon()
