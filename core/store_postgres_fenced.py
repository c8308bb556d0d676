"""The PostgreSQL store's writes fenced by the leadership (``core.store_postgres``): those
only the cluster's leader makes (expiries, a registration's demand, the leader's keys in
``wsnmom_meta``; docs/scale-out.md, "The leader's work"), each made only while the epoch
it was begun under is still the current one.

The fence is the leadership row, read in the write's own statement and locked FOR SHARE
until the write commits: a new leader's bump of the epoch waits for the write (and then
reads it), or came first and the write is refused with :class:`~wsnmom.core.store.Deposed`.
One statement, one round trip, and no window between the check and the write.
:class:`FencedWrites` is a base class of
:class:`~wsnmom.core.store_postgres.PostgresStore`, over its pooled connections.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from wsnmom.core.model import EndpointReference, PublisherRegistration
from wsnmom.core.store import Deposed
from wsnmom.core.store_documents import registration_demand_to_json, registration_from_json
from wsnmom.core.store_postgres_pool import PostgresConnections

__all__ = ["FencedWrites"]

#: the leadership fence of a leader's write (``%s``: the epoch it was begun under): the one
#: row while that epoch is current, locked FOR SHARE until the write commits
_FENCE = "fence AS (SELECT epoch FROM wsnmom_leadership WHERE epoch = %s FOR SHARE)"


class FencedWrites(PostgresConnections):
    """The leader's writes of :class:`~wsnmom.core.store.Store`, fenced by its epoch."""

    def _fenced(self, parts: str, result: str, params: tuple[Any, ...], epoch: int) -> Any:
        """``WITH fence, {parts}`` in one statement with ``params``; ``result`` (a
        subquery over ``parts``) read back.  :class:`Deposed` when ``epoch`` is not the
        current one (then ``parts`` wrote nothing: each of them requires the fence)."""
        rows = self._rows(
            f"WITH {_FENCE}, {parts} SELECT (SELECT count(*) FROM fence), ({result})",
            (epoch, *params),
        )
        fenced, value = rows[0]
        if not fenced:
            raise Deposed(epoch)
        return value

    def fence(self, epoch: int) -> None:
        # FOR SHARE: waits for a new leader's bump in progress, then sees it
        if not self._rows(f"WITH {_FENCE} SELECT epoch FROM fence", (epoch,)):
            raise Deposed(epoch)

    def expire_subscription(self, sub_id: str, now: datetime, *, epoch: int) -> bool:
        return self._expire("subscriptions", sub_id, now, epoch)

    def expire_pull_point(self, pp_id: str, now: datetime, *, epoch: int) -> bool:
        return self._expire("pull_points", pp_id, now, epoch)

    def _expire(self, table: str, value: str, now: datetime, epoch: int) -> bool:
        # as the store's _retire (the delete and its intent in one statement), and only
        # while still expired
        removed = self._fenced(
            f"gone AS (DELETE FROM {table} WHERE id = %s "
            "AND termination_time <= %s AND EXISTS (SELECT 1 FROM fence) RETURNING id), "
            "intended AS (INSERT INTO wsnmom_intents (name) SELECT id FROM gone "
            "ON CONFLICT (name) DO UPDATE SET at = EXCLUDED.at RETURNING 1)",
            "SELECT count(*) FROM intended",
            (value, now),
            epoch,
        )
        return bool(removed)

    def expire_registration(
        self, reg_id: str, now: datetime, *, epoch: int
    ) -> PublisherRegistration | None:
        data = self._fenced(
            "gone AS (DELETE FROM registrations WHERE id = %s "
            "AND termination_time <= %s AND EXISTS (SELECT 1 FROM fence) RETURNING data)",
            "SELECT data FROM gone",
            (reg_id, now),
            epoch,
        )
        return registration_from_json(data) if data is not None else None

    def save_registration_demand(
        self, reg_id: str, subscription: EndpointReference | None, paused: bool, *, epoch: int
    ) -> bool:
        # jsonb || jsonb replaces the part's keys and keeps the others
        part = self._jsonb(registration_demand_to_json(subscription, paused))
        saved = self._fenced(
            "saved AS (UPDATE registrations SET data = data || %s "
            "WHERE id = %s AND EXISTS (SELECT 1 FROM fence) RETURNING 1)",
            "SELECT count(*) FROM saved",
            (part, reg_id),
            epoch,
        )
        return bool(saved)

    def _set_meta_fenced(self, key: str, value: str, epoch: int) -> None:
        """``set_meta`` with an epoch: the key written only while it is current."""
        self._fenced(
            "saved AS (INSERT INTO wsnmom_meta (key, value) "
            "SELECT %s::text, %s::text FROM fence "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value RETURNING 1)",
            "SELECT count(*) FROM saved",
            (key, value),
            epoch,
        )
