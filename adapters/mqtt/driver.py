"""A network loop of the adapter's own for one paho client, through paho's public API for
external event loops (``loop_read``, ``loop_write``, ``loop_misc``, ``reconnect``,
``on_socket_register_write``), instead of paho's threaded loop (``loop_start``).

Every paho client of the adapter runs on this loop or on :mod:`.hub`, never on paho's
``loop_start``: paho's loop waits with ``select.select``, which refuses descriptors
numbered 1024 and above, so a gateway process holding more than about a thousand
descriptors (HTTP keep-alive clients, outbound connections) would lose the connection at
its next reconnect; this loop waits with :func:`.readiness.ready` (``poll``).

Why the publisher's link needs it anyway: with ``loop_start`` every message published from
another thread is one hand-off to paho's network thread (a byte on a socket pair wakes its
``select``) and every PUBACK one hand-off back (a condition per message). The driver's
thread instead calls ``after_read()`` on every pass (after reading, or after
:meth:`Driver.wake`): the publisher sends from its own queue there, as many messages as the
broker's window has room for, so a batch of messages costs one wake-up, and the room
PUBACKs make is refilled in the pass that read them.

Only the driver's thread reads and writes the socket, always under :attr:`Driver.io_lock`
(another thread that queues a packet holds it too, then calls ``wake``; with
``wake_on_queue``, as for the session's link, paho's own locks guard its queue and queueing
a packet wakes the thread, as with ``loop_start``). Request threads
never hold a lock across a system call: one that did would keep every other publisher
waiting while it waits for the GIL again (measured: a convoy that cut the throughput of
1-message Notifies with a push subscription to a quarter on a loaded CPU). Reconnects wait
``reconnect_min_delay`` doubled up to ``reconnect_max_delay``.

A pass reads every packet waiting (up to ``_BURST``), not one: paho 2.2's ``loop_read``
ignores its argument and reads as many packets as it has QoS messages in flight, at least
one, so a subscribing connection (nothing of its own in flight) read one packet per pass,
paying a wait for the socket, the wake-up socket and ``loop_misc`` per arrival. The pass
calls ``loop_read`` again while the socket stays readable (a wait of 0 s, or the TLS
buffer's ``pending``).

A stop closes cleanly (:func:`linger`): paho closes its socket the moment it wrote the
DISCONNECT, and a socket closed while the broker still sends (a session's backlog) answers
with a TCP reset, which lost the last PUBACKs (the broker sent those messages again after
the next start: the SQLite queues held them twice).  So ``stop`` keeps a duplicate of the
connection's descriptor (paho's close then ends nothing), shuts its sending side down once
paho wrote the DISCONNECT, and reads until the broker closes its side, at most
:data:`~.hub.DRAIN_TIMEOUT` seconds (as the subscription sessions' hub does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    import paho.mqtt.client as mqtt
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

from .hub import DRAIN_TIMEOUT
from .readiness import ready

__all__ = ["Driver"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: longest wait for the socket: keep-alives are checked at least this often
_TICK = 1.0
#: most packets one pass reads before it writes (PUBACKs, the publisher's refill) again
_BURST = 256


class Driver:
    """Runs one paho client (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        label: str,
        min_delay: float,
        max_delay: float,
        on_connect_fail: Callable[[OSError], None],
        after_read: Callable[[], None] | None = None,
        *,
        wake_on_queue: bool = False,
        reconnect: bool = True,
    ) -> None:
        self.client = client
        self.label = label
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.on_connect_fail = on_connect_fail
        self.after_read = after_read
        self.reconnect = reconnect
        #: held for every call into the client that reads, writes or queues packets
        self.io_lock = threading.RLock()
        self._halt = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: threading.Thread | None = None
        #: no reconnects after a refusal that waiting does not cure, or after ``stop``
        self.give_up = False
        # without these callbacks paho writes a packet in the thread that queues it; with
        # them it leaves the writing to the loop (this thread).  ``wake_on_queue``: a packet
        # queued while nothing waits to be written wakes this thread (as paho's own loop
        # is woken), for users that queue without ``io_lock`` and ``wake``; a packet queued
        # while others wait is seen by the next pass (``want_write`` before every wait)
        client.on_socket_register_write = self._queued if wake_on_queue else _nothing
        client.on_socket_unregister_write = _nothing

    def start(self) -> None:
        """Connect (in the driver's thread) and serve the connection."""
        self._thread = threading.Thread(target=self._run, name=f"wsnmom-{self.label}", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        """Write what is queued (the driver's thread, ``io_lock`` held); ``ready`` waits
        for room in the socket for the rest."""
        if self.client.want_write():
            self.client.loop_write()

    def wake(self) -> None:
        """Make the driver's thread write what is queued and call ``after_read``."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _queued(self, client: Any, userdata: Any, sock: Any) -> None:
        self.wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Send DISCONNECT, close the connection cleanly (:func:`linger`) and end the
        thread; idempotent."""
        self.give_up = True
        held: socket.socket | None = None
        with self.io_lock:
            sock = self.client.socket()
            if sock is not None:
                with contextlib.suppress(OSError, ValueError):
                    held = socket.socket(fileno=os.dup(sock.fileno()))
                with contextlib.suppress(Exception):
                    self.client.disconnect()
                    self.flush()
        self._halt.set()
        self.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self.io_lock:
            sock = self.client.socket()
            if sock is not None:  # pragma: no cover - the DISCONNECT could not be written
                with contextlib.suppress(OSError):
                    sock.close()
        if held is not None:
            linger(held, DRAIN_TIMEOUT if sock is None else 0.0)
        for s in (self._wake_r, self._wake_w):
            s.close()

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        delay = self.min_delay
        while not self._halt.is_set() and not self.give_up:
            if not self._connect():
                if not self.reconnect:
                    return
                self._halt.wait(delay)
                delay = min(delay * 2, self.max_delay)
                continue
            self._serve()
            if not self.reconnect:
                return
            delay = self.min_delay
            self._halt.wait(delay)

    def _connect(self) -> bool:
        try:
            with self.io_lock:
                self.client.reconnect()
                self.flush()
        except OSError as exc:
            log.debug("%s: cannot connect: %s", self.label, exc)
            self.on_connect_fail(exc)
            return False
        return True

    def _serve(self) -> None:
        """Read, keep alive and write until the connection is gone."""
        client = self.client
        while not self._halt.is_set():
            sock = client.socket()
            if sock is None:
                return
            pending = getattr(sock, "pending", None)
            timeout = 0.0 if pending is not None and pending() > 0 else _TICK
            wlist = [sock] if client.want_write() else []
            try:
                readable, writable = ready([sock, self._wake_r], wlist, timeout)
            except (OSError, ValueError, TypeError):  # closed under us
                readable, writable = [sock], []
            if self._wake_r in readable:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            with self.io_lock:
                if client.socket() is not sock:
                    return
                rc = mqtt.MQTT_ERR_SUCCESS
                if sock in readable or timeout == 0.0:
                    rc = _read_waiting(client, sock)
                if rc == mqtt.MQTT_ERR_SUCCESS and client.socket() is not None:
                    if self.after_read is not None:
                        self.after_read()
                    if client.want_write() or sock in writable:
                        rc = client.loop_write()
                if rc == mqtt.MQTT_ERR_SUCCESS and client.socket() is not None:
                    rc = client.loop_misc()
                if rc != mqtt.MQTT_ERR_SUCCESS or client.socket() is None:
                    return


def _read_waiting(client: Any, sock: Any) -> Any:
    """``loop_read`` while ``sock`` (the client's socket) has bytes waiting, at most
    ``_BURST`` times (``io_lock`` held); its last result code."""
    rc = client.loop_read()
    for _ in range(_BURST - 1):
        if rc != mqtt.MQTT_ERR_SUCCESS or client.socket() is not sock or not _waiting(sock):
            break
        rc = client.loop_read()
    return rc


def _waiting(sock: Any) -> bool:
    """Whether ``sock`` can be read without waiting (its TLS buffer, or the kernel's)."""
    pending = getattr(sock, "pending", None)
    if pending is not None and pending() > 0:
        return True
    try:
        readable, _ = ready([sock], [], 0.0)
    except (OSError, ValueError, TypeError):  # closed under us: loop_read reports it
        return True
    return bool(readable)


def _nothing(client: Any, userdata: Any, sock: Any) -> None:
    return None


def linger(sock: socket.socket, timeout: float) -> None:
    """Close a connection whose last packets were written: shut its sending side down,
    read (and drop) until the peer closes its side or ``timeout`` seconds passed, then
    close.  The peer so reads everything sent before the close (a socket closed while
    data still arrives sends a TCP reset instead)."""
    deadline = time.monotonic() + timeout
    try:
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                break
    except OSError:
        pass
    finally:
        sock.close()
