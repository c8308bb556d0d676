"""Connection limits and read deadlines for the HTTP server (``[connections]`` settings).

waitress reads requests in one event loop and hands complete requests to its worker
threads, so slow clients do not hold threads; but it stops accepting at a fixed number of
open connections (100 by default) and a client that sends its headers a byte at a time
keeps its connection for ever.  Two hundred such clients took the gateway offline.

:class:`ConnectionGuard` works at the socket level, through waitress's documented
``sockets=`` argument: the listening sockets are :class:`GuardedListener` objects whose
``accept`` admits a connection only within

* ``limit`` open connections in all, and
* ``per_client`` open connections per client address (peers in ``trusted_proxies`` are
  exempt: a reverse proxy carries many clients),

answering the others ``503 Service Unavailable`` with ``Retry-After`` and closing them.
The last ``reserve`` places of ``limit`` are kept for the liveness and readiness probes
and for authenticated clients: a connection admitted there must show, in its request
head, a probe or credentials its ``vouch`` check accepts, or it is answered 503 and
closed as soon as its head is complete; and while its head is still arriving (or it sits
idle between requests) a newcomer may take its place (eviction), so slow heads cannot
hold the reserve either.
Admitted connections are :class:`GuardedConnection` sockets (:mod:`wsnmom.connection_sockets`,
with the listener; imported from here too) that read the HTTP/1.1 framing of what they
receive before the server does (:class:`Framing`, on h11: request line and headers, then
the body by ``Content-Length`` or chunked encoding; a framing that is malformed or could be
read two ways is answered 400 and closed, and the server never sees its bytes), so a reaper
thread can close a connection whose

* request line and headers take longer than ``header_timeout`` from the request's first
  byte (for a new connection, from when it was accepted),
* body takes longer than ``body_timeout`` after the headers, or arrives slower than
  ``min_body_rate`` bytes per second once ``body_grace`` seconds have passed, or
* sits with no request and no bytes either way for ``idle_timeout``.

While the application works on a complete request no deadline runs.  Closing is a
``shutdown()`` of the socket, which waitress's loop sees as the peer going away.  Counts go
to ``/metrics`` (``wsnmom_connections_*``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from wsnmom.connection_sockets import RESERVED, GuardedConnection, GuardedListener, Tracked
from wsnmom.core import metrics
from wsnmom.http_framing import BODY, HEADERS, WAITING, Framing

__all__ = [
    "RESERVED",
    "ConnectionGuard",
    "ConnectionPolicy",
    "Framing",
    "GuardedConnection",
    "GuardedListener",
    "Tracked",
    "probe_request",
]

log = logging.getLogger("wsnmom.connections")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """The limits and deadlines (see the module docstring); 0 = none."""

    limit: int = 1000
    per_client: int = 64
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 30.0
    #: client networks without a per-client limit (trusted reverse proxies)
    exempt: tuple[Network, ...] = ()
    #: places of ``limit`` kept for probes and authenticated clients
    reserve: int = 0
    #: bytes per second a body must average once ``body_grace`` has passed
    min_body_rate: float = 0.0
    body_grace: float = 5.0

    @classmethod
    def from_settings(cls, settings: Any) -> ConnectionPolicy:
        """From ``settings.connections`` and ``settings.trusted_proxies``; the reserve is
        at most half of ``limit``."""
        c = settings.connections
        return cls(
            limit=c.limit,
            per_client=c.per_client,
            header_timeout=c.header_timeout,
            body_timeout=c.body_timeout,
            idle_timeout=c.idle_timeout,
            exempt=tuple(_networks(settings.trusted_proxies)),
            reserve=min(c.reserve, c.limit // 2),
            min_body_rate=c.min_body_rate,
            body_grace=c.body_grace,
        )


def _networks(entries: Iterable[str]) -> list[Network]:
    out: list[Network] = []
    for entry in entries:
        if entry.strip() == "*":
            out.extend([ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")])
            continue
        with contextlib.suppress(ValueError):
            out.append(ipaddress.ip_network(entry.strip(), strict=False))
    return out


#: request lines a reserved place always admits (the probes; query strings allowed)
_PROBES = tuple(
    f"{method} /{path}{end}".encode()
    for method in ("GET", "HEAD")
    for path in ("healthz", "readyz")
    for end in (" ", "?")
)


def probe_request(head: bytes) -> bool:
    """Whether the request ``head`` is a liveness or readiness probe."""
    return head.startswith(_PROBES)


@dataclass
class ConnectionGuard:
    """Admits connections and closes those past their deadline (module docstring)."""

    policy: ConnectionPolicy
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: dict[int, Tracked] = field(default_factory=dict)
    _per_client: dict[str, int] = field(default_factory=dict)
    #: the admission check of a request head on a reserved place (default: probes only)
    vouch: Callable[[bytes], bool] | None = None
    #: connections on reserved places, and connections leaving (evicted, turned away)
    _reserved: dict[int, Tracked] = field(default_factory=dict)
    _leaving: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    #: refusals and closes since the last summary in the log, by reason
    _unreported: dict[str, int] = field(default_factory=dict)
    _reported_at: float = field(default_factory=time.monotonic)

    #: seconds between two summaries of refusals and closes in the log
    REPORT_INTERVAL = 10.0

    def wrap(self, sock: socket.socket, *, tls: bool = False) -> GuardedListener:
        """``sock`` (bound, maybe listening) as a guarded listening socket; ``tls``: its
        connections speak TLS (refusals are closed without an answer)."""
        timeout = sock.gettimeout()
        listener = GuardedListener(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.settimeout(timeout)
        listener.guard = self
        listener.plain = not tls
        return listener

    def adopt(self, old: Tracked, new: Tracked) -> None:
        """``new`` replaces the admitted connection ``old`` (the TLS socket wrapped around
        it, which took over its file descriptor): same client, same framing."""
        new.framing, new.guard_client, new.guard_reason = (
            old.framing,
            old.guard_client,
            old.guard_reason,
        )
        new.guard, old.guard = self, None  # closing ``old`` no longer forgets anything
        with self._lock:
            if self._open.pop(id(old), None) is not None:
                self._open[id(new)] = new
            if self._reserved.pop(id(old), None) is not None:
                self._reserved[id(new)] = new
            if id(old) in self._leaving:
                self._leaving.discard(id(old))
                self._leaving.add(id(new))

    def start(self) -> None:
        """Start the reaper thread."""
        self._thread = threading.Thread(target=self._reap, name="wsnmom-connections", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the reaper thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    # -- admission -------------------------------------------------------------------------
    def _admit(self, client: str) -> str | Tracked | bool:
        """A refusal (its reason), or an admission: False for an ordinary place, True
        for a free reserved place, or the reserved connection to evict for one."""
        policy = self.policy
        with self._lock:
            if (
                policy.per_client
                and self._per_client.get(client, 0) >= policy.per_client
                and not self._exempt(client)
            ):
                metrics.CONNECTIONS_REFUSED.labels(reason="per_client").inc()
                self._count("refused: connections.per_client")
                return f"{client} has {policy.per_client} connections open (connections.per_client)"
            if not policy.limit:
                return False
            ordinary = len(self._open) - len(self._reserved) - len(self._leaving)
            if ordinary < policy.limit - policy.reserve:
                return False
            if len(self._reserved) < policy.reserve:
                return True
            victim = self._victim()
            if victim is not None:
                self._reserved.pop(id(victim), None)
                self._leaving.add(id(victim))
                victim.guard_reason = "evicted"
                metrics.CONNECTIONS_CLOSED.labels(reason="evicted").inc()
                self._count("closed: evicted from connections.reserve")
                return victim
            metrics.CONNECTIONS_REFUSED.labels(reason="limit").inc()
            self._count("refused: connections.limit")
            return f"the gateway has {policy.limit} connections open (connections.limit)"

    def _victim(self) -> Tracked | None:
        """The reserved connection a newcomer may replace (hold the lock): the one whose
        head has been arriving longest, else the one idle longest; None when every
        reserved place serves a request."""
        best: Tracked | None = None
        for conn in self._reserved.values():
            framing = conn.framing
            if framing.phase not in (HEADERS, WAITING) or conn.guard_reason:
                continue
            if best is None or (framing.phase, framing.since) < (
                best.framing.phase,
                best.framing.since,
            ):
                best = conn  # "headers" sorts before "waiting"
        return best

    def _turned_away(self, conn: Tracked) -> None:
        """``conn``'s request head failed the reserve's check."""
        with self._lock:
            if self._reserved.pop(id(conn), None) is not None:
                self._leaving.add(id(conn))
            self._count("refused: connections.reserve")
        metrics.CONNECTIONS_REFUSED.labels(reason="reserve").inc()

    def _rejected(self, conn: Tracked, why: str) -> None:
        """``conn``'s bytes had a malformed or ambiguous framing."""
        metrics.CONNECTIONS_CLOSED.labels(reason="framing").inc()
        with self._lock:
            self._count("closed: malformed HTTP framing")
        log.debug("closing a connection from %s: %s", conn.guard_client, why)

    def _screen(self, head: bytes) -> bool:
        vouch = self.vouch
        return probe_request(head) or (vouch is not None and vouch(head))

    def _count(self, what: str) -> None:
        """Note one refusal or close for the next summary (hold the lock)."""
        self._unreported[what] = self._unreported.get(what, 0) + 1

    def _report(self, now: float) -> None:
        """Log what was refused or closed since the last summary (one line per interval,
        however many connections an attack makes)."""
        with self._lock:
            if now - self._reported_at < self.REPORT_INTERVAL and not self._stop.is_set():
                return
            counts, self._unreported = self._unreported, {}
            self._reported_at = now
        if counts:
            log.warning(
                "connections in the last %.0f s: %s",
                self.REPORT_INTERVAL,
                ", ".join(f"{n} {what}" for what, n in sorted(counts.items())),
            )

    def _exempt(self, client: str) -> bool:
        if not self.policy.exempt:
            return False
        try:
            ip = ipaddress.ip_address(client.split("%", 1)[0])
        except ValueError:
            return False
        return any(ip.version == net.version and ip in net for net in self.policy.exempt)

    def _register(self, conn: Tracked, client: str, reserved: bool = False) -> None:
        conn.framing = Framing(time.monotonic())
        conn.guard = self
        conn.guard_client = client
        conn.guard_reason = ""
        if reserved:
            conn.framing.screen = self._screen
        with self._lock:
            if reserved:
                self._reserved[id(conn)] = conn
            self._open[id(conn)] = conn
            self._per_client[client] = self._per_client.get(client, 0) + 1
            metrics.CONNECTIONS_OPEN.set(len(self._open))

    def _forget(self, conn: Tracked) -> None:
        with self._lock:
            if self._open.pop(id(conn), None) is None:
                return
            self._reserved.pop(id(conn), None)
            self._leaving.discard(id(conn))
            left = self._per_client.get(conn.guard_client, 1) - 1
            if left > 0:
                self._per_client[conn.guard_client] = left
            else:
                self._per_client.pop(conn.guard_client, None)
            metrics.CONNECTIONS_OPEN.set(len(self._open))

    # -- deadlines -------------------------------------------------------------------------
    def _deadline(self, framing: Framing) -> tuple[float, str] | None:
        p = self.policy
        phase = framing.phase
        if phase == HEADERS and p.header_timeout:
            return framing.since + p.header_timeout, "header_timeout"
        if phase == BODY and (p.body_timeout or p.min_body_rate):
            deadline = (framing.since + p.body_timeout, "body_timeout")
            if p.min_body_rate:
                slow = framing.since + p.body_grace + framing.body_bytes / p.min_body_rate
                if not p.body_timeout or slow < deadline[0]:
                    deadline = (slow, "min_body_rate")
            return deadline
        if phase == WAITING and p.idle_timeout:
            return framing.since + p.idle_timeout, "idle_timeout"
        return None

    def expired(self, now: float | None = None) -> list[tuple[Tracked, str]]:
        """The connections past their deadline and why."""
        now = time.monotonic() if now is None else now
        with self._lock:
            conns = list(self._open.values())
        out = []
        for conn in conns:
            deadline = self._deadline(conn.framing)
            if deadline is not None and now >= deadline[0]:
                out.append((conn, deadline[1]))
        return out

    def _reap(self) -> None:
        timeouts = [
            t
            for t in (
                self.policy.header_timeout,
                self.policy.body_timeout,
                self.policy.idle_timeout,
                self.policy.body_grace if self.policy.min_body_rate else 0,
            )
            if t
        ]
        tick = min([0.5, *(t / 4 for t in timeouts)])
        while not self._stop.wait(tick):
            for conn, reason in self.expired():
                if conn.guard_reason:
                    continue
                conn.guard_reason = reason
                metrics.CONNECTIONS_CLOSED.labels(reason=reason).inc()
                with self._lock:
                    self._count(f"closed: connections.{reason}")
                log.debug("closing a connection from %s: %s", conn.guard_client, reason)
                conn.cut()
            self._report(time.monotonic())
        self._report(time.monotonic())
