"""HTTPS connections read ahead of the server's worker threads, within the
``[connections]`` limits and deadlines (``wsnmom.connections``).

cheroot, the HTTPS server, serves a connection on one of its ``threads`` worker threads
from the moment it accepts it: the TLS handshake and the reading of each request happen
there, with blocking reads.  Left alone, ``threads`` clients that connect and then send
slowly would hold every worker and no one else would be answered.  :class:`Ingress` gives
HTTPS what waitress' event loop gives HTTP:

* one thread with a selector does every TLS handshake and reads every request, its head
  and its body, without blocking, into the connection's inbox (:class:`Inbox`: memory,
  a temporary file beyond 512 KiB) until the framing ``wsnmom.connections`` follows says
  the request is complete; only then does a worker get the connection, and it reads the
  request from the inbox without waiting on the network;
* a keep-alive connection comes back to the ingress after each answer, so waiting for the
  next request holds no worker either;
* the ``[connections]`` guard admits connections (``limit``, ``per_client``, ``reserve``:
  a verified client certificate vouches for a reserved place; a refused TLS connection is
  closed without an answer) and cuts those past a deadline (the handshake
  is part of the first request's ``header_timeout``); a request whose head asks for
  ``100 Continue`` gets it from the ingress, so that its body arrives before a worker is
  involved.

A request larger than ``max_request_bytes`` (plus its head) goes to a worker as soon as
that much arrived, which answers 413 without reading the rest.  What a worker still waits
on is the client reading its answer (bounded by the socket timeout).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from wsnmom.connections import Tracked
from wsnmom.http_framing import APP, BODY

__all__ = ["CLOSED", "READY", "GuardedTlsConnection", "Inbox", "Ingress"]

log = logging.getLogger("wsnmom.server")

#: bytes of a request held in memory before the inbox spills to a temporary file
SPOOL = 512 * 1024
#: the interim answer to ``Expect: 100-continue``
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

#: :meth:`GuardedTlsConnection.pump` outcomes
READY = "ready"  # a complete request (or as much as a worker may take) is in the inbox
CLOSED = "closed"  # the client went away, or the handshake failed
_WANT_READ = selectors.EVENT_READ
_WANT_WRITE = selectors.EVENT_WRITE


class Inbox:
    """Bytes received ahead of the application, read back in order: in memory, spilled
    to a temporary file beyond :data:`SPOOL` bytes."""

    __slots__ = ("_file", "_read", "_written")

    def __init__(self) -> None:
        self._file: Any = None  # a SpooledTemporaryFile, created on the first bytes
        self._read = 0
        self._written = 0

    def __len__(self) -> int:
        return self._written - self._read

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL)  # noqa: SIM115
        self._file.seek(self._written)
        self._file.write(data)
        self._written += len(data)

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the oldest bytes; 0 when the inbox is empty."""
        if self._read == self._written:
            return 0
        view = memoryview(buffer).cast("B")
        self._file.seek(self._read)
        n: int = self._file.readinto(view[: min(len(view), self._written - self._read)])
        self._read += n
        if self._read == self._written:  # drained: start over (and give memory back)
            self.close()
        return n

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._read = self._written = 0


class GuardedTlsConnection(Tracked, ssl.SSLSocket):
    """An admitted TLS connection (``SSLContext.sslsocket_class``): reads come from its
    inbox first, then from the network; :meth:`pump` fills the inbox without blocking."""

    inbox: Inbox
    handshaken: bool

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        inbox: Inbox | None = self.__dict__.get("inbox")
        if inbox:
            view = memoryview(buffer).cast("B")
            return inbox.readinto(view[:nbytes] if nbytes else view)
        n: int = super().recv_into(buffer, nbytes, flags)
        return n

    def recv(self, bufsize: int = 1024, flags: int = 0) -> bytes:
        inbox: Inbox | None = self.__dict__.get("inbox")
        if inbox:
            buffer = bytearray(bufsize)
            return bytes(buffer[: inbox.readinto(buffer)])
        return super().recv(bufsize, flags)

    # the ingress marks the answer as sent when the worker gives the connection back
    # (Ingress.add): cheroot writes one answer in several sends, and a request pipelined
    # behind it must not be taken for answered by the second
    def send(self, data: Any, flags: int = 0) -> int:
        return ssl.SSLSocket.send(self, data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        ssl.SSLSocket.sendall(self, data, flags)

    def pump(self, limit: int) -> str | int:
        """Handshake and read what is there, without blocking: :data:`READY` once the
        request is complete or ``limit`` bytes wait, :data:`CLOSED`, or the selector event
        to wait for."""
        framing = self.framing
        if framing.phase == APP:
            return READY  # complete already (a pipelined request read with the previous)
        if "inbox" not in self.__dict__:
            self.inbox, self.handshaken = Inbox(), False
        self.setblocking(False)
        try:
            if not self.handshaken:
                self.do_handshake()
                self.handshaken = True
                if framing.screen is not None and self.getpeercert():
                    framing.screen = None  # a verified client certificate vouches

            while True:
                data = ssl.SSLSocket.recv(self, 65536)  # not through the inbox
                if not data:
                    return CLOSED
                self.inbox.write(data)
                was = framing.phase
                framing.received(data, time.monotonic())
                if framing.refused:  # a head the reserve does not admit
                    self.turn_away()
                    return CLOSED
                if framing.error:  # no HTTP/1.1 the server is sure to read alike
                    self.reject(self._answer)
                    return CLOSED
                if framing.phase == BODY and was != BODY and framing.expect_continue:
                    self._continue()
                if framing.phase == APP or len(self.inbox) > limit:
                    self._drain()
                    if framing.refused:  # a pipelined head the reserve does not admit
                        self.turn_away(answer=False)
                        return CLOSED
                    if framing.error:  # a pipelined request read two ways
                        self.reject(self._answer)
                        return CLOSED
                    return READY
        except ssl.SSLWantReadError:
            return _WANT_READ
        except ssl.SSLWantWriteError:
            return _WANT_WRITE
        except OSError as exc:  # ssl.SSLError included: a failed handshake, a reset
            log.debug("https: connection from %s: %s", self.guard_client, exc)
            return CLOSED

    def _drain(self) -> None:
        """Move what TLS decrypted already into the inbox, so that nothing waits where
        no selector sees it."""
        while self.pending():
            data = ssl.SSLSocket.recv(self, self.pending())
            if not data:
                return
            self.inbox.write(data)
            self.framing.received(data, time.monotonic())

    def _continue(self) -> None:
        self._answer(_CONTINUE)

    def _answer(self, data: bytes) -> None:
        """Send a short answer from the ingress (it fits the socket buffer at once)."""
        self.settimeout(1.0)
        try:
            ssl.SSLSocket.sendall(self, data)
        finally:
            self.setblocking(False)

    def close(self) -> None:
        inbox = self.__dict__.get("inbox")
        if inbox is not None:
            inbox.close()
        super().close()


class Ingress:
    """The thread that handshakes and reads HTTPS requests until they are complete (see
    the module docstring).  ``deliver`` hands a connection with a complete request to a
    worker; ``discard`` closes one.  ``limit`` bounds what one request may buffer;
    ``timeout`` is the socket timeout a connection gets back for its worker.

    Connections come from the accepting thread (:meth:`accept`) and from workers after an
    answer (:meth:`add`, which first reads what is there on the worker's thread: a
    pipelined request goes straight back to a worker).  The selector is changed under a
    lock from any of them; only the ingress thread waits on it."""

    def __init__(
        self,
        deliver: Callable[[Any], None],
        discard: Callable[[Any], None],
        *,
        limit: int,
        timeout: float,
    ) -> None:
        self._deliver = deliver
        self._discard = discard
        self._limit = limit
        self._timeout = timeout
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="wsnmom-https-ingress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close every connection it holds."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            held = [key.data for key in self._selector.get_map().values() if key.data]
            self._selector.close()
        for conn in held:
            self._close(conn)
        self._wake_r.close()
        self._wake_w.close()

    def accept(self, conn: Any) -> None:
        """A new connection (the accepting thread): its handshake and first request, once
        the client sends."""
        if not self._watch(conn, _WANT_READ, registered=False):
            self._close(conn)

    def add(self, conn: Any) -> None:
        """A kept-alive connection back from its worker (the worker's thread), its answer
        written: its next request."""
        framing = getattr(conn.socket, "framing", None)
        if framing is not None:
            framing.sent(time.monotonic())
        self._pump(conn, registered=False)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(timeout=1.0)
            except (OSError, ValueError):  # closed under the selector, or stopping
                if self._stop.is_set():
                    return
                self._forget_closed()
                continue
            for key, _ in events:
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._pump(key.data, registered=True)

    def _pump(self, conn: Any, *, registered: bool) -> None:
        sock = conn.socket
        try:
            state = sock.pump(self._limit)
        except Exception:
            log.exception("https: reading a request failed")
            state = CLOSED
        if state not in (READY, CLOSED):
            if not self._watch(conn, state, registered=registered):
                self._close(conn)
            return
        if registered:
            with self._lock, contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
        if state == READY:
            try:
                sock.settimeout(self._timeout)
            except OSError:
                state = CLOSED
        if state == READY:
            self._deliver(conn)
        else:
            self._close(conn)

    def _watch(self, conn: Any, events: Any, *, registered: bool) -> bool:
        """Wait for ``events`` on ``conn``; False when that is impossible (closed)."""
        try:
            with self._lock:
                if self._stop.is_set():
                    return False
                if registered:
                    self._selector.modify(conn.socket, events, conn)
                else:
                    self._selector.register(conn.socket, events, conn)
        except (KeyError, ValueError, OSError, RuntimeError):
            return False
        return True

    def _forget_closed(self) -> None:
        with self._lock:
            gone = [
                key
                for key in self._selector.get_map().values()
                if key.data is not None and key.fileobj.fileno() < 0  # type: ignore[union-attr]
            ]
            for key in gone:
                self._selector.unregister(key.fileobj)
        for key in gone:
            self._close(key.data)

    def _close(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            self._discard(conn)
