"""The sockets of the connection guard (:mod:`wsnmom.connections`): the listening socket whose
``accept`` asks the guard to admit each connection, and the admitted connection that reads
the HTTP/1.1 framing of what it receives before the server does and ends itself when told.

:class:`GuardedListener` answers a refused connection ``503 Service Unavailable`` with
``Retry-After`` (or, on a TLS port, only closes it), evicts the reserved connection the
guard frees for a newcomer, and wraps the connections it admits as
:class:`GuardedConnection` sockets.  :class:`Tracked`, the part of an admitted connection
mixed into a plain socket (:class:`GuardedConnection`) or a TLS socket
(``wsnmom.tls_ingress``), feeds what it receives to its :class:`~wsnmom.http_framing.Framing`
and the moments it answers, reports its close to the guard, and ends the connection: a
request head the reserve does not admit (503), a framing that is malformed or could be read
two ways (400, the server never sees its bytes), an eviction, or a deadline the guard's
reaper saw pass (a TCP shutdown, also under TLS).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wsnmom.http_framing import APP, Framing

if TYPE_CHECKING:
    from wsnmom.connections import ConnectionGuard

__all__ = ["RESERVED", "GuardedConnection", "GuardedListener", "Tracked"]

#: why a request on a reserved place is refused
RESERVED = (
    "the gateway's connections are taken (connections.limit); its last places "
    "(connections.reserve) serve only /healthz, /readyz and authenticated requests; "
    "try again later"
)

_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)

_REJECTION = b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
_REASONS = {
    400: b"Bad Request",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    505: b"HTTP Version Not Supported",
}


def _interim(data: Any) -> bool:
    """Whether ``data`` starts an interim ``100 Continue`` (not the answer)."""
    return bytes(data[:13]) == b"HTTP/1.1 100 "


class Tracked:
    """What an admitted connection reports to its guard: the bytes it receives (through
    ``recv``/``recv_into``), the moments it answers, its close.  Mixed into a plain socket
    (:class:`GuardedConnection`) or a TLS socket (``wsnmom.tls_ingress``)."""

    framing: Framing
    guard: ConnectionGuard | None
    guard_client: str
    guard_reason: str

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data: bytes = super().recv(bufsize, flags)  # type: ignore[misc]
        framing = self.framing
        framing.received(data, time.monotonic())
        if framing.refused or framing.error:
            self.refuse()
            return b""  # the server sees the client go: nothing of the request is served
        return data

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        # a plain socket reads the whole buffer for nbytes 0, a TLS socket for None
        size = nbytes or memoryview(buffer).nbytes
        n: int = super().recv_into(buffer, size, flags)  # type: ignore[misc]
        if n:
            framing = self.framing
            framing.received(bytes(memoryview(buffer)[:n]), time.monotonic())
            if framing.refused or framing.error:
                self.refuse()
                return 0
        return n

    def refuse(self) -> None:
        """End a connection whose bytes the framing refused (before the server sees
        them): a request head the reserve does not admit (503), or bytes that are no
        HTTP/1.1 both parsers read alike (``Framing.error``)."""
        if self.framing.refused:
            self.turn_away(answer=not self.framing.behind)
        else:
            self.reject()

    def reject(self, send: Callable[[bytes], Any] | None = None) -> None:
        """Close a connection whose framing is malformed or ambiguous: answer ``400`` (or
        the status the framing gives) when no answer of the server's can be on its way,
        else only close.  ``send`` writes the answer, from a thread that knows the
        server writes nothing meanwhile (HTTPS: the ingress); by default the answer goes
        on this plain socket only before its first answer."""
        guard = getattr(self, "guard", None)
        if self.guard_reason:
            return
        self.guard_reason = "framing"
        framing = self.framing
        if guard is not None:
            guard._rejected(self, framing.error)
        plain = isinstance(self, GuardedConnection)  # no TLS record to write otherwise
        if framing.phase != APP and (send is not None or (plain and not framing.answered)):
            reason = _REASONS.get(framing.status, b"Bad Request")
            text = reason + b"\n\n" + framing.error.encode() + b"\n"  # as waitress words it
            with contextlib.suppress(OSError, ValueError):
                answer = _REJECTION % (framing.status, reason)
                answer += b"Content-Length: %d\r\n\r\n%s" % (len(text), text)
                if send is None:
                    socket.socket.send(self, answer, socket.MSG_DONTWAIT)  # type: ignore[arg-type]
                else:
                    send(answer)
        _discard_input(self)
        self.cut()

    def turn_away(self, *, answer: bool = True) -> None:
        """Answer a request the reserve does not admit 503 (``answer``: False behind a
        request being answered, whose answer the 503 could land in) and end the
        connection."""
        guard = getattr(self, "guard", None)
        if guard is None or self.guard_reason:
            return
        self.guard_reason = "reserve"
        guard._turned_away(self)
        if answer:
            with contextlib.suppress(OSError, ValueError):
                text = RESERVED.encode() + b"\n"
                super().send(_REFUSAL % (len(text), text))  # type: ignore[misc]
        self.cut()

    def send(self, data: Any, flags: int = 0) -> int:
        n: int = super().send(data, flags)  # type: ignore[misc]
        if not _interim(data):
            self.framing.sent(time.monotonic())
        return n

    def sendall(self, data: Any, flags: int = 0) -> None:
        super().sendall(data, flags)  # type: ignore[misc]
        if not _interim(data):
            self.framing.sent(time.monotonic())

    def close(self) -> None:
        guard, self.guard = getattr(self, "guard", None), None
        super().close()  # type: ignore[misc]
        if guard is not None:
            guard._forget(self)

    def evict(self) -> None:
        """Give this reserved place to a newcomer: answer 503 (on plain HTTP) and end."""
        with contextlib.suppress(OSError, ValueError):
            if isinstance(self, GuardedConnection):
                text = RESERVED.encode() + b"\n"
                socket.socket.send(self, _REFUSAL % (len(text), text), socket.MSG_DONTWAIT)
        self.cut()

    def cut(self) -> None:
        """End the connection under whoever reads or writes it (the reaper's close: a
        plain TCP shutdown, also under TLS, so that a thread blocked on it returns)."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self, socket.SHUT_RDWR)  # type: ignore[arg-type]


def _discard_input(sock: Any) -> None:
    """Read and drop what the client sent already (up to 1 MiB), so that the close after
    an answer does not reset the connection under the answer."""
    with contextlib.suppress(OSError, ValueError):
        for _ in range(16):
            if not socket.socket.recv(sock, 65536, socket.MSG_DONTWAIT):
                return


class GuardedConnection(Tracked, socket.socket):
    """An admitted plain connection."""

    __slots__ = ("framing", "guard", "guard_client", "guard_reason")


class GuardedListener(socket.socket):
    """A listening socket whose ``accept`` applies the connection limits.  A refused
    connection is answered 503 and closed, or only closed on a TLS port (``plain`` False:
    a plain-text answer would be no TLS record)."""

    __slots__ = ("guard", "plain")

    guard: ConnectionGuard
    plain: bool

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            conn, addr = super().accept()  # BlockingIOError when nothing is pending
            admission = self.guard._admit(addr[0])
            if isinstance(admission, str):
                _refuse(conn, admission if self.plain else None)
                continue
            if not isinstance(admission, bool):  # a reserved place, freed from its holder
                admission.evict()
            fd = conn.detach()
            tracked = GuardedConnection(self.family, self.type, self.proto, fileno=fd)
            tracked.setblocking(conn.getblocking())
            self.guard._register(tracked, addr[0], reserved=admission is not False)
            return tracked, addr


def _refuse(conn: socket.socket, reason: str | None) -> None:
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        if reason is not None:
            text = f"{reason}; try again later\n".encode()
            conn.send(_REFUSAL % (len(text), text))
        conn.shutdown(socket.SHUT_WR)
    conn.close()
