"""Abusive HTTP clients for the robustness tests, bounded in count and time and aimed at
loopback only: slow-header ("slowloris") clients and a prober of normal requests."""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import requests

from tests.support.threads import Background

#: what a slow client sends: a plausible request head that never ends
_HEAD = (
    b"POST /wsn/broker HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/soap+xml\r\nContent-Length: 100\r\n"
)
_TRICKLE = b"X-Padding: " + b"a" * 4000

#: The starvation tests' gateways cut a slow client's head after this many seconds, more
#: than a normal request's 5 s timeout.  A normal request starved behind the slow clients
#: (waiting for a connection slot or a worker they hold) waits until their first cut,
#: about ``STARVED_HEADER_TIMEOUT`` less the 1 s the slow clients connect before the
#: normal traffic starts: it times out (a failure) or takes more than ``PROMPT``.  (With
#: a 2 s deadline a starved request took 0-2 s, as near to a normal one on a loaded
#: machine as to bound them apart only at 1 s, which a loaded machine broke.)
STARVED_HEADER_TIMEOUT = 6
#: seconds within which every normal request (or health probe) under attack is
#: answered: a few times a normal one on a machine at load 10, below a starved one's ~5 s
#: (and below the 5 s a probe waits before it counts as failed)
PROMPT = 3.0


@dataclass
class SlowClients(Background):
    """``count`` clients, spread over the loopback ``sources``, that each send a request
    head one byte every ``interval`` seconds and open a new connection whenever the server
    closes theirs.  Runs on one thread (a selector) until :meth:`stop`.  With ``tls``
    each client completes the TLS handshake first, then trickles its head inside TLS."""

    host: str
    port: int
    count: int
    sources: Sequence[str]
    interval: float = 1.0
    tls: ssl.SSLContext | None = None
    connects: int = 0
    closed_by_server: int = 0
    refused_503: int = 0
    #: (when, slot) of clients to connect again (a TLS handshake that failed)
    _retries: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for source in self.sources:
            assert source.startswith("127."), "abuse tests stay on loopback"
        assert self.host.startswith("127.")

    def _open(self, sel: selectors.BaseSelector, slot: int) -> None:
        if self.tls is not None:
            self._open_tls(sel, slot)
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.sources[slot % len(self.sources)], 0))
        sock.setblocking(False)
        err = sock.connect_ex((self.host, self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            return
        self.connects += 1
        # (slot, bytes sent, next send time)
        sel.register(sock, selectors.EVENT_READ, [slot, 0, time.monotonic()])

    def _open_tls(self, sel: selectors.BaseSelector, slot: int) -> None:
        assert self.tls is not None
        source = (self.sources[slot % len(self.sources)], 0)
        try:
            raw = socket.create_connection((self.host, self.port), 5, source_address=source)
            sock = self.tls.wrap_socket(raw, server_hostname=self.host)
        except OSError:  # refused or cut during the handshake: again a little later
            self._retries.append((time.monotonic() + 0.2, slot))
            return
        sock.setblocking(False)
        self.connects += 1
        sel.register(sock, selectors.EVENT_READ, [slot, 0, time.monotonic()])

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for slot in range(self.count):
                self._open(sel, slot)
            while not self._stop.is_set():
                now = time.monotonic()
                for key, _ in sel.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(4096)
                    except ssl.SSLWantReadError:
                        continue  # a TLS record in pieces
                    except OSError:
                        data = b""
                    if data.startswith(b"HTTP/1.1 503"):
                        self.refused_503 += 1
                    if not data or data.startswith(b"HTTP/"):
                        slot = key.data[0]
                        sel.unregister(sock)
                        sock.close()
                        self.closed_by_server += 1
                        self._open(sel, slot)
                due = [slot for when, slot in self._retries if when <= now]
                self._retries = [(when, slot) for when, slot in self._retries if when > now]
                for slot in due:
                    self._open(sel, slot)
                for key in list(sel.get_map().values()):
                    state = key.data
                    if now < state[2]:
                        continue
                    stream = _HEAD + _TRICKLE
                    byte = stream[state[1] % len(stream) : state[1] % len(stream) + 1]
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        sock.send(byte)
                        state[1] += 1
                    except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                        pass
                    except OSError:
                        pass  # closed: the read side notices
                    state[2] = now + self.interval
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()


@dataclass
class NormalTraffic(Background):
    """Sends ``request()`` every ``interval`` seconds on its own thread and records the
    outcome: the latency of each answer with an expected status, failures otherwise."""

    request: Callable[[requests.Session], requests.Response]
    ok_status: tuple[int, ...] = (200, 202)
    interval: float = 0.25
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    JOIN = 15.0

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with requests.Session() as session:  # a new connection each time
                    status = self.request(session).status_code
                if status in self.ok_status:
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failures.append(f"HTTP {status}")
            except requests.RequestException as exc:
                self.failures.append(type(exc).__name__)
            self._stop.wait(self.interval)

    @property
    def answered(self) -> int:
        return len(self.latencies)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)


@dataclass
class SlowBodies(Background):
    """``count`` clients spread over the loopback ``sources``, each announcing a
    ``Content-Length`` of ``length`` bytes and then sending one body byte every
    ``interval`` seconds; a client whose connection the server closes (or refuses) opens a
    new one after ``backoff`` seconds.  One thread (a selector) until :meth:`stop`."""

    host: str
    port: int
    count: int
    sources: Sequence[str]
    length: int = 10_000_000
    interval: float = 1.0
    backoff: float = 0.2
    connects: int = 0
    closed_by_server: int = 0
    refused_503: int = 0

    def __post_init__(self) -> None:
        for source in self.sources:
            assert source.startswith("127."), "abuse tests stay on loopback"
        assert self.host.startswith("127.")

    def _head(self) -> bytes:
        return (
            b"POST /wsn/broker HTTP/1.1\r\nHost: %s\r\nContent-Type: application/soap+xml\r\n"
            b"Content-Length: %d\r\n\r\n" % (self.host.encode(), self.length)
        )

    def _open(self, sel: selectors.BaseSelector, slot: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.sources[slot % len(self.sources)], 0))
            sock.settimeout(2)
            sock.connect((self.host, self.port))
            sock.sendall(self._head())
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self.connects += 1
        sel.register(sock, selectors.EVENT_READ, [slot, time.monotonic() + self.interval])

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        again: list[tuple[float, int]] = [(0.0, slot) for slot in range(self.count)]
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                due = [slot for when, slot in again if when <= now]
                again = [(when, slot) for when, slot in again if when > now]
                for slot in due:
                    self._open(sel, slot)
                    if not any(k.data[0] == slot for k in sel.get_map().values()):
                        again.append((now + self.backoff, slot))
                for key, _ in sel.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if data.startswith(b"HTTP/1.1 503"):
                        self.refused_503 += 1
                    if not data or data.startswith(b"HTTP/"):
                        sel.unregister(sock)
                        sock.close()
                        self.closed_by_server += 1
                        again.append((now + self.backoff, key.data[0]))
                for key in list(sel.get_map().values()):
                    if now >= key.data[1]:
                        with contextlib.suppress(OSError):
                            key.fileobj.send(b"x")  # type: ignore[union-attr]
                        key.data[1] = now + self.interval
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()

    @property
    def held(self) -> int:
        """Connections open now (each in its body, as far as the client knows)."""
        return self.connects - self.closed_by_server
