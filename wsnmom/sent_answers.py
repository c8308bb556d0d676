"""Answers settled once their bytes left this host (waitress, and cheroot for HTTPS): a
GetMessages or PullMessages answer whose client went away mid-answer comes again.

waitress's write of a response returns once the body is in the connection's output
buffer; its main loop sends the rest as the client reads.  A client that goes away (a
timeout, a crash, a load balancer's cut) is seldom reported to the application: the
public ``environ["waitress.client_disconnected"]`` only says that the main loop closed the
connection, which it notices on its next send or read, and it reads nothing from a
connection while the connection's request runs.  So settling an answer when its write
returned (``soap_frontend.settled_answers``) settled it for every client that went away:
the messages were lost for it.

:class:`SentAnswersChannel` (waitress's channel class, installed by ``wsnmom.parking``)
puts :data:`~wsnmom.soap_frontend.settled_answers.ANSWER_SENT` in the environ: the body
calls it with the answer's settlements once the write returned, and the answer is judged
on the connection itself:

* **sent**, settled: waitress's output buffer of the connection is empty and the kernel
  has transmitted every byte of its send queue (``SIOCOUTQNSD`` 0) on an established
  connection; or the client closed its side (``CLOSE_WAIT``) after acknowledging every
  byte (``SIOCOUTQ`` 0);
* **not sent**, given back: the connection was reset (the client closed with the answer
  unread: the kernel's state is ``CLOSE``) or closed before its output was sent (waitress
  drops what its buffer holds), or it stayed unsent for :data:`GIVE_UP` seconds;
* else **pending**: waitress is still sending, the client's window is full, or a client
  that closed has not acknowledged the answer yet.

Most answers are sent by the time their write returns and are settled in the worker
thread that wrote them (two socket calls).  A pending answer is checked every
:data:`TICK` seconds by one thread (``wsnmom-sent-answers``) until it is sent or not; a
connection waitress closes meanwhile is judged at its close, and a pending one is kept
open (a duplicate of the socket) until the kernel tells.  Settling and giving back run on
that thread, never on waitress's main loop.

The HTTPS server (cheroot, ``wsnmom.tls_parking``) writes with a blocking ``sendall``
through a buffered file: once it flushed, every byte is in the kernel's send queue, and
:func:`settle_once_sent` judges the answer the same way on the connection's socket (the
kernel counts TLS records like any bytes).  On loopback with a client that reads nothing,
``sendall`` of answers up to 256 KB returned with the bytes still queued: settled there,
they were lost for a client that went away.

Not caught: bytes still on the wire when the client goes (about one round trip), and bytes
the client's kernel accepted that the client never read (it closed right after they
arrived).  A socket that is not TCP, or a platform without these socket calls, settles
when the write returned, as before.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from waitress.channel import HTTPChannel

from wsnmom.soap_frontend.settled_answers import Settlements

__all__ = ["GIVE_UP", "TICK", "SentAnswersChannel", "sent_state", "settle_once_sent"]

log = logging.getLogger("wsnmom.server")

#: seconds between two checks of the pending answers
TICK = 0.005
#: seconds after which an answer still not sent is given back
GIVE_UP = 120.0

SENT, UNSENT, PENDING = "sent", "unsent", "pending"

# Linux: bytes of the send queue not yet acknowledged (man 7 tcp: SIOCOUTQ), not yet
# transmitted (SIOCOUTQNSD), and the states of ``tcpi_state``
_SIOCOUTQ = getattr(termios, "TIOCOUTQ", 0x5411)
_SIOCOUTQNSD = 0x894B
_ESTABLISHED, _CLOSE_WAIT = 1, 8
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP = (socket.AF_INET, socket.AF_INET6)


def _queued(fd: int, request: int) -> int:
    out = fcntl.ioctl(fd, request, b"\0\0\0\0")
    value: int = struct.unpack("i", out)[0]
    return value


def sent_state(sock: socket.socket) -> str:
    """Whether what was written to ``sock`` was sent (``"sent"``), will not be
    (``"unsent"``) or not yet (``"pending"``), by the kernel (module docstring)."""
    if _TCP_INFO is None or sock.family not in _TCP:
        return SENT  # nothing to ask: as when the write returned
    try:
        fd = sock.fileno()
        if fd < 0:
            return UNSENT
        state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0]
        if state == _ESTABLISHED:
            return SENT if _queued(fd, _SIOCOUTQNSD) == 0 else PENDING
        if state == _CLOSE_WAIT:  # the client closed: did it take everything first?
            return SENT if _queued(fd, _SIOCOUTQ) == 0 else PENDING
        return UNSENT
    except OSError:
        return UNSENT


class _Watch:
    """The pending answers of every connection, and the one thread that checks them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: a channel's pending answers are checked through the channel
        self._channels: dict[int, SentAnswersChannel] = {}
        #: answers of closed connections: a duplicate of the socket, until when
        self._orphans: list[tuple[socket.socket, Settlements, float]] = []
        #: settle/give back calls to run on this thread
        self._outcomes: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None

    def watch(self, channel: SentAnswersChannel) -> None:
        with self._lock:
            self._channels[id(channel)] = channel
            self._start()
        self._wake.set()

    def forget(self, channel: SentAnswersChannel) -> None:
        with self._lock:
            self._channels.pop(id(channel), None)

    def adopt(self, sock: socket.socket, settlements: Settlements) -> None:
        with self._lock:
            self._orphans.append((sock, settlements, time.monotonic() + GIVE_UP))
            self._start()
        self._wake.set()

    def run_soon(self, outcome: Callable[[], None]) -> None:
        with self._lock:
            self._outcomes.append(outcome)
            self._start()
        self._wake.set()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="wsnmom-sent-answers", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                busy = bool(self._channels or self._orphans or self._outcomes)
            if busy:
                self._wake.wait(TICK)
            else:
                self._wake.wait()
            self._wake.clear()
            self._pass()

    def _pass(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            outcomes, self._outcomes = self._outcomes, []
            orphans, self._orphans = self._orphans, []
        for outcome in outcomes:
            _run_outcome(outcome)
        for channel in channels:
            if channel.check_answers():
                with self._lock:  # unless an answer came meanwhile (then watched again)
                    if channel.settled_all():
                        self._channels.pop(id(channel), None)
        now = time.monotonic()
        kept = []
        for sock, settlements, until in orphans:
            state = sent_state(sock)
            if state == PENDING and now < until:
                kept.append((sock, settlements, until))
                continue
            sock.close()
            _run_outcome(settlements.settle if state == SENT else settlements.give_back)
        if kept:
            with self._lock:
                self._orphans.extend(kept)


def _run_outcome(outcome: Callable[[], None]) -> None:
    try:
        outcome()
    except Exception:  # a settlement logs its own failures: this is a bug
        log.exception("settling an answer failed")


WATCH = _Watch()


def settle_once_sent(sock: socket.socket, settlements: Settlements) -> None:
    """For a server whose write returned once every byte was in the kernel's send queue
    (cheroot, after its flush; ``sock`` may be a TLS socket: the kernel counts the
    encrypted bytes): settle now if they were sent, give back if the connection is gone,
    else watch a duplicate of the socket until the kernel tells (as for a closed
    waitress connection)."""
    state = sent_state(sock)
    if state == PENDING:
        try:
            WATCH.adopt(socket.socket(fileno=os.dup(sock.fileno())), settlements)
            return
        except OSError:
            state = UNSENT
    _run_outcome(settlements.settle if state == SENT else settlements.give_back)


class SentAnswersChannel(HTTPChannel):  # type: ignore[misc]
    """waitress's HTTP channel that settles an answer once its bytes left this host."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._answers_lock = threading.Lock()
        #: answers written, not yet sent, oldest first, and since when
        self._pending: list[tuple[Settlements, float]] = []
        self._gone = False

    def answer_sent(self, settlements: Settlements) -> None:
        """For ``environ[ANSWER_SENT]``: the answer's write returned; settle it once it
        is sent, give it back if it is not (module docstring)."""
        with self._answers_lock:
            state = UNSENT if self._gone else self._state()
            if state == PENDING:
                self._pending.append((settlements, time.monotonic() + GIVE_UP))
        if state == PENDING:
            WATCH.watch(self)
        elif state == SENT:
            settlements.settle()
        else:
            settlements.give_back()

    def _state(self) -> str:
        if not self.connected:
            return UNSENT
        if self.total_outbufs_len:  # waitress is still sending
            return PENDING
        return sent_state(self.socket)

    def check_answers(self) -> bool:
        """Settle or give back the pending answers that are decided (on the watch's
        thread); True when none is left."""
        decided: list[Callable[[], None]] = []
        with self._answers_lock:
            if self._gone:
                return True
            state = self._state()
            now = time.monotonic()
            kept = []
            for settlements, until in self._pending:
                if state == SENT:
                    decided.append(settlements.settle)
                elif state == UNSENT or now >= until:
                    decided.append(settlements.give_back)
                else:
                    kept.append((settlements, until))
            self._pending = kept
        for outcome in decided:
            _run_outcome(outcome)
        return not kept

    def settled_all(self) -> bool:
        """No answer of this connection is pending."""
        with self._answers_lock:
            return self._gone or not self._pending

    def _closing(self) -> None:
        """The connection closes: judge its pending answers now (waitress drops its
        output buffer); a pending one keeps a duplicate of the socket until it is sent
        or not.  Never settles on this thread (the main loop)."""
        with self._answers_lock:
            if self._gone:
                return
            self._gone = True
            pending, self._pending = self._pending, []
            if not pending:
                return
            state = UNSENT if self.total_outbufs_len else sent_state(self.socket)
            kept: list[socket.socket | None] = []
            for _ in pending if state == PENDING else ():
                try:
                    kept.append(socket.socket(fileno=os.dup(self.socket.fileno())))
                except OSError:
                    kept.append(None)
        WATCH.forget(self)
        for i, (settlements, _) in enumerate(pending):
            sock = kept[i] if kept else None
            if sock is not None:
                WATCH.adopt(sock, settlements)
            elif state == SENT:
                WATCH.run_soon(settlements.settle)
            else:
                WATCH.run_soon(settlements.give_back)

    def handle_close(self) -> None:
        self._closing()
        super().handle_close()

    def close(self) -> None:
        self._closing()
        super().close()
