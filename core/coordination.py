"""What gateway instances sharing one store coordinate through it (docs/scale-out.md).

A :class:`Coordination` is the store's side of a cluster: the change log other instances'
writes leave (so each instance's in-memory resources follow the store), the instance
table with heartbeats, shard leases with epochs (which instance delivers which push
subscriptions), and the leadership that runs periodic work once, with its epoch (the
fencing token of the leader's writes).  The store gives it
(``Store.coordination``): :class:`SingleInstance` for a store only one instance opens
(SQLite), where this instance leads and holds every shard at no cost; the PostgreSQL
store gives ``core.coordination_postgres.PostgresCoordination``.

:func:`shard_of` is the one rule that maps a subscription to its shard.
"""

from __future__ import annotations

import heapq
import os
import secrets
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from wsnmom.core import errors

if TYPE_CHECKING:
    from wsnmom.core.position_fence import PositionTable

__all__ = [
    "INSTANCE_HEADER",
    "NONCE_LIMIT",
    "SINGLE_EPOCH",
    "Change",
    "Coordination",
    "InstanceInfo",
    "InstanceRefused",
    "Leases",
    "SingleInstance",
    "instance_id",
    "new_instance_id",
    "shard_of",
]

#: the HTTP header naming the instance that sent a Notify or answered a request
INSTANCE_HEADER = "WSNMOM-Instance"
#: the most live nonces :class:`SingleInstance` remembers (beyond: "try again")
NONCE_LIMIT = 65536
#: the leadership epoch of an instance alone on its store (nobody can take it over)
SINGLE_EPOCH = 1

_PROCESS_ID: str | None = None


def new_instance_id() -> str:
    """``<hostname>-<pid>-<random>``: this process's instance id when none is configured
    (one per process, so every part of one gateway names the same instance)."""
    global _PROCESS_ID
    if _PROCESS_ID is None:
        host = socket.gethostname().split(".", 1)[0][:32] or "host"
        _PROCESS_ID = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
    return _PROCESS_ID


def instance_id(configured: str) -> str:
    """This instance's id: ``cluster.instance_id`` when set, else :func:`new_instance_id`."""
    return configured or new_instance_id()


def shard_of(resource_id: str, shards: int) -> int:
    """The shard of a subscription id (CRC-32, stable across processes and versions)."""
    return zlib.crc32(resource_id.encode()) % shards


class InstanceRefused(Exception):
    """This instance may not join (a single-instance adapter already has a live instance
    on the store)."""


@dataclass(frozen=True, slots=True)
class Change:
    """A resource another instance wrote: ``kind`` is "subscription", "pull_point" or
    "registration"."""

    kind: str
    id: str


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One instance as the ``instances`` table shows it."""

    id: str
    address: str
    version: str
    #: seconds since its last heartbeat (by the store's clock)
    heartbeat_age: float
    #: shards it holds a lease on, with their epochs
    shards: tuple[tuple[int, int], ...] = ()
    #: seconds until the first of its leases expires unless renewed (None: it holds none)
    lease_left: float | None = None


@dataclass(frozen=True, slots=True)
class Leases:
    """The shards this instance holds after a heartbeat: shard -> epoch; ``released``
    are shards it is to stop delivering and then hand back (above its fair share)."""

    held: dict[int, int]
    released: tuple[int, ...] = ()
    #: shards taken from another instance whose lease had expired (a failover, not a
    #: hand-over: a clean stop or a release leaves a shard without owner)
    taken_over: tuple[int, ...] = ()


class Coordination(Protocol):
    """The store's side of a cluster (see the module docstring)."""

    #: True when other instances may share the store (changes and leases matter)
    shared: bool

    def cursor(self) -> int:
        """The change log's position now (before a restore, so nothing is missed)."""
        ...

    def changes(self, cursor: int) -> tuple[int, list[Change]]:
        """Changes other instances made after ``cursor``, and the cursor to ask with next."""
        ...

    def wait(self, timeout: float) -> None:
        """Return when a change may have been made (a wake-up), or after ``timeout``."""
        ...

    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        """Record this instance; :class:`InstanceRefused` when ``single_instance`` and
        another instance is live on the store."""
        ...

    def heartbeat(self, shards: int, lease: float) -> Leases:
        """Renew this instance's heartbeat and leases, take free shards up to its fair
        share; the shards held now."""
        ...

    def release(self, shards: Sequence[int]) -> None:
        """Hand ``shards`` back (this instance stopped delivering them)."""
        ...

    def lead(self) -> bool:
        """Whether this instance holds the leadership (taken when free)."""
        ...

    def epoch(self) -> int | None:
        """The epoch of the leadership this instance holds, None when it does not lead:
        the fencing token of the leader's writes (each instance that takes the
        leadership gets a higher one, and the store refuses a write made under an older
        one, ``Store.save_registration_demand``).  No I/O: what the last :meth:`lead`
        found."""
        ...

    def instances(self) -> list[InstanceInfo]:
        """The instances on the store, newest heartbeat first."""
        ...

    def leave(self) -> None:
        """Give up leases, leadership and the instance row (a clean stop)."""
        ...

    def secret(self) -> str:
        """The cluster's shared secret: made once in the store by the first instance that
        asks, the same for every instance (it signs requests one instance forwards to
        another)."""
        ...

    def first_use(self, nonce: str, expires_at: float) -> bool:
        """Record the nonce of a forwarded request, kept until ``expires_at`` (Unix
        seconds); False when it was recorded before (the request is a replay).  In a
        cluster every instance sees what any recorded (the store).  Raises when it
        cannot record it (the store does not answer, too many live nonces): the caller
        answers "try again"."""
        ...

    def positions(self) -> PositionTable | None:
        """The store's table of delivery positions fenced by shard epochs
        (``core.position_fence``), None when the store has none (a store only one
        instance opens: nobody else can take a shard there)."""
        ...


class SingleInstance:
    """The coordination of a store one instance opens: it leads and holds every shard;
    nobody else writes, so there are no changes to follow."""

    shared = False

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._address = ""
        self._version = ""
        self._secret = secrets.token_hex(32)
        #: live nonces and their expiries, and the same as a heap by expiry (swept from
        #: its head), under a lock: request threads record nonces at once
        self._nonces: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []
        self._nonce_lock = threading.Lock()

    def cursor(self) -> int:
        return 0

    def changes(self, cursor: int) -> tuple[int, list[Change]]:
        return cursor, []

    def wait(self, timeout: float) -> None:
        return None

    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        self._address, self._version = address, version

    def heartbeat(self, shards: int, lease: float) -> Leases:
        return Leases({s: 1 for s in range(shards)})

    def release(self, shards: Sequence[int]) -> None:
        return None

    def lead(self) -> bool:
        return True

    def epoch(self) -> int | None:
        return SINGLE_EPOCH

    def instances(self) -> list[InstanceInfo]:
        return [InstanceInfo(self.instance_id, self._address, self._version, 0.0)]

    def leave(self) -> None:
        return None

    def positions(self) -> PositionTable | None:
        return None

    def secret(self) -> str:
        return self._secret

    def first_use(self, nonce: str, expires_at: float) -> bool:
        """As :meth:`Coordination.first_use`, in memory: at most :data:`NONCE_LIMIT`
        live nonces (beyond: ``ResourceUnavailable``, never a set without bound).

        :raises errors.ResourceUnavailable: as many live nonces as the limit
        """
        now = time.time()
        with self._nonce_lock:
            expiries = self._expiries
            while expiries and expiries[0][0] < now:
                _, gone = heapq.heappop(expiries)
                del self._nonces[gone]
            if nonce in self._nonces:
                return False
            if len(self._nonces) >= NONCE_LIMIT:
                raise errors.ResourceUnavailable(
                    f"{NONCE_LIMIT} forwarded requests within their validity; retry later"
                )
            self._nonces[nonce] = expires_at
            heapq.heappush(expiries, (expires_at, nonce))
            return True
