"""The MQTT 5 connection of one subscription session (cluster mode), on the hub's thread.

:class:`~.sub_protocol.SessionProtocol` is the connection's state machine, without I/O
(:mod:`.sub_protocol`).

:class:`SessionClient` drives it on a socket: the TCP connection (and the TLS handshake)
is made by the caller's thread, then the :class:`~.hub.Hub` serves it (:meth:`serve`):
it reads everything the socket holds, hands the PUBLISH packets of one read to the
handler in one call, and writes what is queued.  Other threads queue packets (PUBACKs,
SUBSCRIBE) holding ``io_lock``, which the hub holds while it serves the client, and then
wake the hub.  A packet the broker should not have sent closes the connection with the
matching DISCONNECT reason code and one log line; nothing the broker sends ends the hub's
thread.

It never reconnects: the owner (:mod:`.sub_session`) hears of every end of the
connection (``Handler.closed``) and decides.

**A clean close hands every queued packet over** (:meth:`SessionClient.close`): the
owner hears ``closed`` at once and nothing more is queued or handed out, but the socket
stays with the hub, which writes what is queued (the last PUBACKs, then the DISCONNECT),
shuts the sending side down and reads (and drops) what still arrives until the broker
closes its side, at most :data:`~.hub.DRAIN_TIMEOUT` seconds; only then is the socket
closed.  Closing it at once lost PUBACKs: a socket closed with unread data, or one that
receives data once closed, sends a TCP reset, which drops what it still had to send, and
the broker, its connection reset, never processes what it had not read yet (the last
PUBACKs and the DISCONNECT), so it sent those messages again to the session's next
connection.  A new connection with the same client
id waits for the previous one's close (:meth:`~.hub.Hub.await_drained`): a take-over
would drop what the broker had not read of it just the same.  The broker's Receive Maximum is not
enforced on arrivals: Mosquitto 2.0.11 sends more than it once PUBACKs flow
(docs/scale-out.md "MQTT in cluster mode"), and :mod:`.sub_session` holds the excess.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from wsnmom.core.adapter import AdapterUnavailable

from .config import MqttSettings
from .hub import DRAIN_TIMEOUT, Hub
from .link import refusal
from .reason_codes import reason_name
from .sub_codec import (
    Connack,
    Disconnect,
    Publish,
    SubAck,
    Violation,
    encode_connect,
    encode_disconnect,
    encode_puback,
    split,
)
from .sub_protocol import SessionProtocol

__all__ = ["Handler", "SessionClient"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: bytes asked of the socket per ``recv``, and reads per pass at most (the hub's other
#: sessions wait meanwhile)
_CHUNK = 65536
_READS = 16


class Handler(Protocol):
    """What a :class:`SessionClient` tells its owner, on the hub's thread with ``io_lock``
    held (never block)."""

    def connected(self, connack: Connack) -> None: ...

    def published(self, messages: list[Publish]) -> None: ...

    def acknowledged(self, ack: SubAck) -> None: ...

    def closed(self, why: str) -> None: ...


def tls_context(settings: MqttSettings) -> ssl.SSLContext:
    """The TLS context of ``mqtts://`` (as the adapter's paho connections configure it:
    the broker's certificate checked against ``ca_certs`` or the system's, its host
    name unless ``tls_insecure``, a client certificate when ``certfile``)."""
    context = ssl.create_default_context(cafile=settings.ca_certs)
    if settings.certfile:
        context.load_cert_chain(settings.certfile, settings.keyfile)
    context.check_hostname = not settings.tls_insecure
    return context


class SessionClient:
    """One connection of a subscription session (see the module docstring).
    ``persistent``: clean start false and the settings' session expiry; otherwise clean
    start and expiry 0."""

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        handler: Handler,
        hub: Hub,
        *,
        persistent: bool,
        receive_maximum: int,
        label: str,
    ) -> None:
        self.settings = settings
        self.client_id = client_id
        self.label = label
        self._handler = handler
        self._hub = hub
        self._persistent = persistent
        self._receive_maximum = receive_maximum
        #: held by the hub while it serves this client, and by whoever queues a packet
        self.io_lock = threading.RLock()
        self._cv = threading.Condition(self.io_lock)
        self._proto = SessionProtocol(settings.keepalive, time.monotonic())
        self._sock: socket.socket | None = None
        self._inbuf = bytearray()
        self._connack: Connack | None = None
        #: why the connection ended (None: not ended)
        self._ended: str | None = None
        #: a clean close under way (the hub serves it until then, and sets the event
        #: once the socket is closed), and whether the sending side was shut down
        self._drain: tuple[float, threading.Event] | None = None
        self._shut = False

    # -- owner's side (any thread) -----------------------------------------------------------
    def start(self, timeout: float) -> bool:
        """Connect and wait for the CONNACK; whether the broker had the session.
        AdapterUnavailable when the broker cannot be reached or does not answer in time,
        or :meth:`close` came meanwhile; the adapter's refusal errors for a refusal."""
        s = self.settings
        self._hub.await_drained(self.client_id)
        try:
            sock = socket.create_connection((s.host, s.port), timeout=timeout)
            if s.tls:
                sock = tls_context(s).wrap_socket(sock, server_hostname=s.host)
        except (OSError, ValueError) as exc:
            raise AdapterUnavailable(
                f"cannot connect to the MQTT broker {s.host}:{s.port}: {exc}"
            ) from exc
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        with self.io_lock:
            if self._ended is not None:
                sock.close()
                raise AdapterUnavailable(f"{self.label}: closed while it connected")
            self._sock = sock
            self._proto.queue(
                encode_connect(
                    self.client_id,
                    clean_start=not self._persistent,
                    keepalive=s.keepalive,
                    session_expiry=s.session_expiry if self._persistent else 0,
                    receive_maximum=self._receive_maximum,
                    username=s.username,
                    password=s.password,
                )
            )
        self._hub.add(self)
        with self._cv:
            self._cv.wait_for(lambda: self._connack is not None or self._ended is not None, timeout)
            connack, ended = self._connack, self._ended
        if connack is not None and connack.reason < 0x80:
            return connack.session_present
        self.close()
        if connack is not None:
            raise refusal(connack.reason, reason_name(connack.reason), s)
        if ended is not None:
            raise AdapterUnavailable(f"{self.label}: {ended} before the CONNACK")
        raise AdapterUnavailable(
            f"the MQTT broker {s.host}:{s.port} did not accept a connection within {timeout:g}s"
        )

    def subscribe(self, filters: Sequence[str], options: int) -> int:
        """Queue a SUBSCRIBE (``io_lock`` held by the caller, then :meth:`wake`)."""
        return self._proto.subscribe(filters, options)

    def unsubscribe(self, filters: Sequence[str]) -> int:
        """Queue an UNSUBSCRIBE (``io_lock`` held by the caller, then :meth:`wake`)."""
        return self._proto.unsubscribe(filters)

    def ack(self, packet_id: int) -> None:
        """Queue a PUBACK (``io_lock`` held by the caller, then :meth:`wake`)."""
        self._proto.queue(encode_puback(packet_id))

    def wake(self) -> None:
        """Have the hub write what was queued."""
        self._hub.wake(self)

    @property
    def open(self) -> bool:
        """Whether the connection is up (no I/O)."""
        return self._ended is None and self._sock is not None

    def close(self, session_expiry: int | None = None) -> None:
        """Send DISCONNECT (``session_expiry`` 0: the broker drops the session) and close;
        idempotent, never waits for the broker.  The handler hears ``closed`` at once; an
        open connection is handed to the hub to write what is queued first (see the
        module docstring)."""
        with self.io_lock:
            drain = (
                self._ended is None
                and self._sock is not None
                and self._proto.state == "open"
                and self._hub.serving
            )
            if self._ended is None and self._proto.state == "open":
                self._proto.queue(encode_disconnect(0, session_expiry))
            if drain:
                # the DISCONNECT leaves now, not at the hub's next pass: the broker stops
                # sending to this connection as early as before the drain existed
                with contextlib.suppress(OSError, ssl.SSLError):
                    self._write()
                deadline = time.monotonic() + DRAIN_TIMEOUT
                self._drain = (deadline, self._hub.draining(self.client_id))
            elif self._ended is None and self._sock is not None:
                with contextlib.suppress(OSError, ssl.SSLError):
                    self._write()  # no hub thread any more: as much as the socket takes
            self._end("closed by the gateway", keep_socket=drain)
        if drain:
            self.wake()

    def await_closed(self, timeout: float = DRAIN_TIMEOUT) -> bool:
        """Wait until a clean close handed everything over and closed the socket (and
        every other connection of the client id closing), up to ``timeout`` seconds."""
        return self._hub.await_drained(self.client_id, timeout)

    # -- the hub's side ----------------------------------------------------------------------
    def socket(self) -> socket.socket | None:
        """The socket the hub watches (None once closed)."""
        return self._sock

    def want_write(self) -> bool:
        """Whether bytes wait to be written."""
        return bool(self._proto.out)

    def buffered(self) -> bool:
        """Whether TLS holds bytes already read from the socket (the hub serves them)."""
        sock = self._sock
        try:
            return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
        except (OSError, ValueError):  # closed meanwhile by another thread
            return False

    def serve(self, readable: bool, writable: bool) -> bool:
        """One pass of the hub: read, keep alive, write; whether the connection lives."""
        with self.io_lock:
            if self._drain is not None:
                return self._draining()
            if self._sock is None or self._ended is not None:
                return False
            try:
                if readable:
                    self._read()
                dead = self._proto.due(time.monotonic())
                if dead is not None:
                    self._end(dead, log_it=True)
                    return False
                if self._proto.out:
                    self._write()
            except Violation as exc:
                log.warning(
                    "%s: the MQTT broker broke the protocol (%s): closing the connection with %s",
                    self.label,
                    exc,
                    reason_name(exc.reason),
                )
                self._proto.out.clear()
                self._proto.out += encode_disconnect(exc.reason)
                with contextlib.suppress(OSError, ssl.SSLError):
                    self._write()
                self._end(f"protocol violation: {exc}")
            except (OSError, ssl.SSLError) as exc:
                self._end(f"connection lost ({exc})", log_it=True)
            except Exception as exc:  # a bug (here or in a callback): this session only
                log.exception("%s: serving the connection failed", self.label)
                self._end(f"closed after an internal error ({exc!r})")
            if self._proto.state == "closed" and self._ended is None:
                self._end("the broker refused or closed the session")
            return self._ended is None

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        for _ in range(_READS):
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not data:
                self._deliver()
                raise ConnectionResetError("the broker closed the connection")
            self._inbuf += data
            if len(data) < _CHUNK and not isinstance(sock, ssl.SSLSocket):
                break  # drained (TLS hands out one record per call)
        self._deliver()

    def _deliver(self) -> None:
        """Decode what was read and tell the handler: the PUBLISH packets in one call."""
        packets, used = split(self._inbuf)
        if not packets:
            return
        del self._inbuf[:used]
        arrived: list[Publish] = []
        for packet in self._proto.receive(packets):
            if isinstance(packet, Publish):
                arrived.append(packet)
                continue
            if arrived:
                self._handler.published(arrived)
                arrived = []
            if isinstance(packet, Connack):
                self._connack = packet
                self._cv.notify_all()
                if packet.reason < 0x80:
                    self._handler.connected(packet)
            elif isinstance(packet, SubAck):
                self._handler.acknowledged(packet)
            elif isinstance(packet, Disconnect):
                self._end(
                    f"the broker disconnected: {reason_name(packet.reason)}"
                    + (f", {packet.reason_string}" if packet.reason_string else ""),
                    log_it=True,
                )
                return
        if arrived:
            self._handler.published(arrived)

    def _write(self) -> None:
        sock = self._sock
        out = self._proto.out
        if sock is None or not out:
            return
        sent = False
        while out:
            try:
                n = sock.send(out)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            del out[:n]
            sent = True
        if sent:
            self._proto.sent(time.monotonic())

    def _draining(self) -> bool:
        """A pass of a clean close: write what is queued, then shut the sending side
        down, and read (dropping it) until the broker closes or the deadline; whether
        the hub serves the socket on (``io_lock`` held)."""
        sock, drain = self._sock, self._drain
        assert sock is not None and drain is not None
        deadline, done = drain
        over = time.monotonic() >= deadline
        try:
            self._write()
            if not self._proto.out and not self._shut:
                sock.shutdown(socket.SHUT_WR)  # TLS: unwrapped, the rest is read raw
                self._shut = True
            for _ in range(_READS):
                try:
                    data = sock.recv(_CHUNK)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                if not data:
                    over = True  # the broker read everything and closed its side
                    break
        except (OSError, ssl.SSLError, ValueError):
            over = True
        if not over:
            return True
        self._drain, self._sock = None, None
        with contextlib.suppress(OSError):
            sock.close()
        self._hub.drained(self.client_id, done)
        return False

    def _end(self, why: str, *, log_it: bool = False, keep_socket: bool = False) -> None:
        """Close the socket (unless ``keep_socket``: a clean close, the hub closes it)
        and tell the handler, once (``io_lock`` held)."""
        if self._ended is not None:
            return
        self._ended = why
        self._proto.state = "closed"
        if not keep_socket:
            sock, self._sock = self._sock, None
            if sock is not None:
                self._hub.remove(self)
                with contextlib.suppress(OSError):
                    sock.close()
        if log_it:
            log.warning("%s: %s", self.label, why)
        self._cv.notify_all()
        self._handler.closed(why)
