"""One network thread for many paho clients (cluster mode's subscription sessions), through
paho's API for external event loops, as :mod:`.driver` runs one client.

A :class:`Hub` serves every client added to it in one thread: a ``select`` over their
sockets (and a wake-up socket), then ``loop_read`` / ``loop_write`` / ``loop_misc`` of
each client whose socket is ready, keep-alives at least every ``_TICK`` seconds.  A
client is connected by the caller (``reconnect``, a blocking TCP connect and the CONNECT
queued) and then added; it never reconnects here: once its connection ends (paho calls
its ``on_disconnect``) the hub forgets it.  Calls into a client from other threads
(acknowledgements, SUBSCRIBE) hold the client's ``io_lock``, which the hub holds while it
reads and writes that client, and then :meth:`Hub.wake` it.

So an instance in cluster mode has one network thread for all its subscription sessions
instead of one per session (docs/scale-out.md "MQTT in cluster mode").
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

try:
    import paho.mqtt.client as mqtt
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

from .readiness import ready

__all__ = ["Hub"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: longest wait in ``select``: keep-alives are checked at least this often
_TICK = 1.0


@dataclass(eq=False)
class _Member:
    client: Any
    io_lock: threading.RLock


def _nothing(client: Any, userdata: Any, sock: Any) -> None:
    return None


class Hub:
    """Serves many paho clients in one thread (see the module docstring)."""

    def __init__(self, label: str = "mqtt-hub") -> None:
        self.label = label
        self._lock = threading.Lock()
        self._members: dict[int, _Member] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def prepare(client: Any) -> None:
        """Leave every write of ``client`` to the hub (call before connecting it)."""
        client.on_socket_register_write = _nothing
        client.on_socket_unregister_write = _nothing

    def add(self, client: Any, io_lock: threading.RLock) -> None:
        """Serve ``client`` (connected by the caller) until its connection ends."""
        with self._lock:
            self._members[id(client)] = _Member(client, io_lock)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"wsnmom-{self.label}", daemon=True
                )
                self._thread.start()
        self.wake()

    def remove(self, client: Any) -> None:
        """Stop serving ``client`` (its socket is the caller's to close)."""
        with self._lock:
            self._members.pop(id(client), None)
        self.wake()

    def wake(self) -> None:
        """Have the hub write what was queued."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def __len__(self) -> int:
        return len(self._members)

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (the clients are their owners' to disconnect first)."""
        self._halt.set()
        self.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        for s in (self._wake_r, self._wake_w):
            s.close()

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._halt.is_set():
            with self._lock:
                members = list(self._members.values())
            socks: dict[Any, _Member] = {}
            wlist: list[Any] = []
            timeout = _TICK
            for m in members:
                sock = m.client.socket()
                if sock is None:
                    continue
                socks[sock] = m
                pending = getattr(sock, "pending", None)
                if pending is not None and pending() > 0:
                    timeout = 0.0
                if m.client.want_write():
                    wlist.append(sock)
            try:
                readable, writable = ready([self._wake_r, *socks], wlist, timeout)
            except (OSError, ValueError, TypeError):  # a socket closed under us
                readable, writable = list(socks), []
            if self._wake_r in readable:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            ready_r = set(readable)
            ready_w = set(writable)
            for sock, m in socks.items():
                self._serve(m, sock, sock in ready_r, sock in ready_w)

    def _serve(self, m: _Member, sock: Any, readable: bool, writable: bool) -> None:
        """One pass over one client: read, write, keep alive; forget it once gone."""
        client = m.client
        try:
            with m.io_lock:
                if client.socket() is not sock:
                    return
                rc = mqtt.MQTT_ERR_SUCCESS
                pending = getattr(sock, "pending", None)
                if readable or (pending is not None and pending() > 0):
                    rc = client.loop_read()
                if (
                    rc == mqtt.MQTT_ERR_SUCCESS
                    and client.socket() is not None
                    and (client.want_write() or writable)
                ):
                    rc = client.loop_write()
                if rc == mqtt.MQTT_ERR_SUCCESS and client.socket() is not None:
                    rc = client.loop_misc()
                gone = rc != mqtt.MQTT_ERR_SUCCESS or client.socket() is None
        except Exception:  # a bug must not end the loop of every other session
            log.exception("%s: serving an MQTT client failed", self.label)
            gone = True
        if gone:
            self.remove(client)
