"""Persistent broker state: subscriptions, pull points, publisher registrations and the
current message per topic (when the adapter does not keep it).

``Store`` is the small interface core uses, with its errors; ``SqliteStore``
(``core.store_sqlite``) is the default implementation, ``PostgresStore``
(``core.store_postgres``) the one several gateway instances can share.  Records are kept
as JSON documents (``core.store_documents``) next to the columns queries need (id,
termination time, name), the same in both.  Notifications themselves are *not* stored
here: accepted-but-undelivered messages live in the middleware's durable subscriptions.

Store URLs (``core.store_url``): ``sqlite:///relative/path.db``,
``sqlite:////absolute/path.db``, ``sqlite:///:memory:`` (tests),
``postgresql://user:password@host:5432/database``.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from wsnmom.core import errors
from wsnmom.core.coordination import Coordination, SingleInstance
from wsnmom.core.model import (
    EndpointReference,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.topic_mapping.model import Topic

__all__ = ["Deposed", "IntentGone", "Store", "StoreError", "StoreUnavailable"]


class StoreError(Exception):
    """The store cannot be opened or used."""


class StoreUnavailable(StoreError, errors.ResourceUnavailable):
    """The store does not answer (a server store down or out of connections): temporary,
    so an operation that needs it is answered with a Receiver fault and HTTP 503."""

    #: seconds a client should wait before retrying
    RETRY_AFTER = 5.0

    def __init__(self, description: str) -> None:
        errors.ResourceUnavailable.__init__(
            self, f"the store is not reachable: {description}", retry_after=self.RETRY_AFTER
        )


class Deposed(StoreError):
    """A leader's write refused: the leadership epoch it was begun under is not the
    store's any more (another instance took the leadership since)."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"the leadership epoch {epoch} is not the store's any more")
        self.epoch = epoch


class IntentGone(StoreError):
    """A new record was not written: the intent it was to replace is gone (the orphan
    sweep took it for an orphan's, ``core.orphans``, and deleted its durable subscription)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the intent of {name} is gone: the orphan sweep removed it")
        self.name = name


class Store(abc.ABC):
    """What core persists.  Every method is thread-safe."""

    # subscriptions
    @abc.abstractmethod
    def put_subscription(self, sub: Subscription) -> None:
        """Insert or replace; bumps the stored revision and sets ``sub.revision`` to it."""

    @abc.abstractmethod
    def update_subscription(self, sub: Subscription) -> bool:
        """Write ``sub`` only if the stored revision is still ``sub.revision`` (the one
        read): a conditional write, so that a change another writer made after that read
        is never overwritten.  Bumps the stored revision and sets ``sub.revision`` to it;
        False (nothing written) when the subscription changed or was deleted meanwhile."""

    @abc.abstractmethod
    def get_subscription(self, sub_id: str) -> Subscription | None:
        """The subscription, or None."""

    @abc.abstractmethod
    def delete_subscription(self, sub_id: str, *, intent: bool = False) -> bool:
        """Remove; False when it was not there.  ``intent``: in the same write, store an
        intent of ``sub_id`` when a record was removed, so that the orphan sweep deletes
        the durable subscription if this instance dies (or its middleware refuses) before
        it does; the caller removes the intent once the durable subscription is gone."""

    @abc.abstractmethod
    def expire_subscription(self, sub_id: str, now: datetime, *, epoch: int) -> bool:
        """The cluster leader's removal of an expired subscription, as
        ``delete_subscription(intent=True)``, made only while the stored termination time
        is at or before ``now`` (a Renew through another instance since the leader looked
        keeps it) and, on a store several instances share, while ``epoch`` is the
        leadership's, in one write.  False when nothing was removed (renewed, or gone).

        :raises Deposed: ``epoch`` is not the leadership's any more (nothing removed)"""

    @abc.abstractmethod
    def list_subscriptions(self) -> list[Subscription]:
        """Every subscription."""

    # pull points
    @abc.abstractmethod
    def put_pull_point(self, pp: PullPoint) -> None:
        """Insert or replace."""

    # intents: durable subscriptions being made, before their record exists (core.orphans)
    @abc.abstractmethod
    def put_intent(self, name: str, at: datetime | None = None) -> None:
        """Record that the durable subscription ``name`` is about to be made, at ``at``
        (None: now, by the store's clock, which every instance of a cluster shares)."""

    @abc.abstractmethod
    def add_subscription(self, sub: Subscription) -> None:
        """Store a new subscription's record and remove its intent in one write (as
        :meth:`put_subscription`); :class:`IntentGone`, nothing written, when there is no
        intent of its id (the orphan sweep removed it)."""

    @abc.abstractmethod
    def add_pull_point(self, pp: PullPoint) -> None:
        """:meth:`add_subscription` for a new pull point."""

    @abc.abstractmethod
    def delete_intent(self, name: str, older_than: float | None = None) -> bool:
        """Remove the intent ``name`` (only if recorded at least ``older_than`` seconds
        ago); False when none was removed."""

    @abc.abstractmethod
    def list_intents(self, older_than: float = 0.0) -> list[tuple[str, datetime]]:
        """The intents recorded at least ``older_than`` seconds ago, oldest first."""

    @abc.abstractmethod
    def get_pull_point(self, pp_id: str) -> PullPoint | None:
        """The pull point, or None."""

    @abc.abstractmethod
    def find_pull_point(self, name: str) -> PullPoint | None:
        """The pull point created with ``name``, or None."""

    @abc.abstractmethod
    def delete_pull_point(self, pp_id: str, *, intent: bool = False) -> bool:
        """Remove; False when it was not there (``intent``: as for
        :meth:`delete_subscription`)."""

    @abc.abstractmethod
    def expire_pull_point(self, pp_id: str, now: datetime, *, epoch: int) -> bool:
        """The cluster leader's removal of an expired pull point, as
        ``delete_pull_point(intent=True)``, under the conditions of
        :meth:`expire_subscription` (ONVIF's Renew through another instance keeps it).

        :raises Deposed: ``epoch`` is not the leadership's any more (nothing removed)"""

    @abc.abstractmethod
    def list_pull_points(self) -> list[PullPoint]:
        """Every pull point."""

    @abc.abstractmethod
    def held(self, ids: Collection[str]) -> set[str]:
        """Which of ``ids`` the store holds as a subscription or a pull point, in one
        query for them all: the one place that question is answered, for one name
        (``ClusterParts.stored``, ``Adapter.kept_in_store``; the orphan sweep's intents)
        as for many (``Adapter.kept_in_store_many``: a middleware that lost what it kept
        of many subscriptions at once)."""

    # registrations
    @abc.abstractmethod
    def put_registration(self, reg: PublisherRegistration) -> None:
        """Insert or replace."""

    @abc.abstractmethod
    def get_registration(self, reg_id: str) -> PublisherRegistration | None:
        """The registration, or None."""

    @abc.abstractmethod
    def renew_registration(self, reg_id: str, termination_time: datetime | None) -> bool:
        """Write the registration's termination time and nothing else: its publisher
        subscription (which the leader writes, :meth:`save_registration_demand`) stays as
        stored, whatever this instance's copy says.  False (nothing written) when it is
        gone."""

    @abc.abstractmethod
    def save_registration_demand(
        self, reg_id: str, subscription: EndpointReference | None, paused: bool, *, epoch: int
    ) -> bool:
        """Write the registration's subscription at its publisher and whether it is
        paused, and nothing else (a termination time another instance wrote stays).
        False (nothing written, nothing made again) when it is gone.  The leader writes
        this, under the leadership ``epoch`` it held when it began
        (``Coordination.epoch``): a store several instances share writes it only while
        that epoch is still the leadership's, in the same statement, and raises
        :class:`Deposed` (nothing written) otherwise; a store one instance opens has one
        leader, and writes it."""

    @abc.abstractmethod
    def expire_registration(
        self, reg_id: str, now: datetime, *, epoch: int
    ) -> PublisherRegistration | None:
        """The cluster leader's removal of an expired registration, as
        :meth:`delete_registration`, under the conditions of :meth:`expire_subscription`;
        None when nothing was removed (renewed, or gone).

        :raises Deposed: ``epoch`` is not the leadership's any more (nothing removed)"""

    @abc.abstractmethod
    def delete_registration(self, reg_id: str) -> PublisherRegistration | None:
        """Remove; the record as the store held it at its deletion (its subscription at
        the publisher is the one to end, whichever instance wrote it last), None when it
        was not there."""

    @abc.abstractmethod
    def list_registrations(self) -> list[PublisherRegistration]:
        """Every registration."""

    # current messages
    @abc.abstractmethod
    def put_current_message(self, message: NotificationMessage) -> None:
        """Remember ``message`` as the last one on its topic (topic must be set)."""

    @abc.abstractmethod
    def get_current_message(self, topic: Topic) -> NotificationMessage | None:
        """The last message on ``topic``, or None."""

    @abc.abstractmethod
    def list_current_messages(self) -> list[NotificationMessage]:
        """Every stored current message."""

    # the topic set a cluster shares (``core.topic_share``)
    @abc.abstractmethod
    def record_topics(self, topics: Sequence[Topic], within: int | None = None) -> list[Topic]:
        """Record topics an instance admitted to its topic set; one recorded already is
        left as it is (no write, so no change for the other instances to follow).  With
        ``within``, new topics are recorded (in their order) only while fewer than
        ``within`` are, checked and written atomically against other instances recording
        at once; the new topics that did not fit are returned (else nothing)."""

    @abc.abstractmethod
    def list_topics(self) -> list[Topic]:
        """Every recorded topic, in the order they were recorded."""

    # upstreams (``[[upstream]]`` added at run time): JSON documents by name
    @abc.abstractmethod
    def put_upstream(self, name: str, data: dict[str, Any]) -> None:
        """Insert or replace the upstream ``name``."""

    @abc.abstractmethod
    def delete_upstream(self, name: str) -> bool:
        """Remove the upstream ``name``; False when there was none."""

    @abc.abstractmethod
    def list_upstreams(self) -> list[dict[str, Any]]:
        """Every stored upstream, in the order they were added."""

    # facts about the store itself (which adapter its resources belong to, ...)
    @abc.abstractmethod
    def get_meta(self, key: str) -> str | None:
        """The value recorded under ``key``, or None."""

    @abc.abstractmethod
    def set_meta(self, key: str, value: str, *, epoch: int | None = None) -> None:
        """Record ``value`` under ``key`` (replacing).  With ``epoch``, the cluster
        leader's write under the leadership epoch it held when it began its work
        (``Coordination.epoch``): a store several instances share writes it only while
        that epoch is still the leadership's, in the same statement, and raises
        :class:`Deposed` (nothing written) otherwise; a store one instance opens has one
        leader, and ignores it."""

    @abc.abstractmethod
    def fence(self, epoch: int) -> None:
        """Check, right before a cluster leader's action the store cannot make conditional
        (a drop of messages on the middleware), that ``epoch`` is still the leadership's.
        A store one instance opens has one leader: nothing to check.

        :raises Deposed: it is not"""

    def coordination(self, instance_id: str) -> Coordination:
        """How instances sharing this store coordinate; a store one instance opens
        (SQLite) gives :class:`~wsnmom.core.coordination.SingleInstance`."""
        return SingleInstance(instance_id)

    @abc.abstractmethod
    def ping(self) -> bool:
        """True when the store answers."""

    def unavailable_reason(self) -> str | None:
        """After ``ping`` or a use found the store not answering: what failed (the
        server's error), for ``/readyz``.  No I/O; never a credential (core redacts it
        too).  Default: None (``/readyz`` says only that the store does not answer)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store; idempotent."""
