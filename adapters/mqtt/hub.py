"""One network thread for many paho clients (cluster mode's subscription sessions), through
paho's API for external event loops, as :mod:`.driver` runs one client.

A :class:`Hub` serves every client added to it in one thread: a selector (epoll) over their
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
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

try:
    import paho.mqtt.client as mqtt
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

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

    def __init__(self, label: str = "mqtt-hub", *, tls: bool = False) -> None:
        self.label = label
        self.tls = tls
        self._lock = threading.Lock()
        self._members: dict[int, _Member] = {}
        #: clients removed, or with packets queued (or just added), since the thread last
        #: looked
        self._removed: list[Any] = []
        self._dirty: set[int] = set()
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
        member = _Member(client, io_lock)
        with self._lock:
            self._members[id(client)] = member
            self._dirty.add(id(client))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"wsnmom-{self.label}", daemon=True
                )
                self._thread.start()
        self._poke()

    def remove(self, client: Any) -> None:
        """Stop serving ``client`` (its socket is the caller's to close)."""
        with self._lock:
            member = self._members.pop(id(client), None)
            if member is not None:
                self._removed.append(member)
        self._poke()

    def wake(self, client: Any = None) -> None:
        """Have the hub write what was queued for ``client`` (None: look at all).  Only a
        wake that finds nothing waiting pokes the thread: the others join the pass that
        poke starts (the PUBACKs of a settled batch: one wake-up, not one per message)."""
        with self._lock:
            idle = not self._dirty
            if client is None:
                self._dirty.update(self._members)
            else:
                self._dirty.add(id(client))
        if idle:
            self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def __len__(self) -> int:
        return len(self._members)

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (the clients are their owners' to disconnect first)."""
        self._halt.set()
        self._poke()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        for s in (self._wake_r, self._wake_w):
            s.close()

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        #: member -> the socket registered for it, and whether for writing too
        registered: dict[int, tuple[Any, bool]] = {}
        next_misc = time.monotonic() + _TICK
        try:
            while not self._halt.is_set():
                with self._lock:
                    removed, self._removed = self._removed, []
                    dirty = [self._members[k] for k in self._dirty if k in self._members]
                    self._dirty.clear()
                for m in removed:
                    self._unregister(sel, registered, m)
                # clients with something queued, or just added: write (and register)
                pending_tls = False
                for m in dirty:
                    self._sync(sel, registered, m)
                    self._serve(sel, registered, m, readable=False, writable=True)
                if self.tls:  # TLS: bytes already read from the socket may wait
                    for sock, _ in registered.values():
                        pending = getattr(sock, "pending", None)
                        if pending is not None and pending() > 0:
                            pending_tls = True
                            break
                timeout = 0.0 if pending_tls else max(0.0, next_misc - time.monotonic())
                try:
                    events = sel.select(timeout)
                except (OSError, ValueError):  # a socket closed under us
                    events = []
                for ready, mask in events:
                    if ready.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(65536)
                        continue
                    m = ready.data
                    self._serve(
                        sel,
                        registered,
                        m,
                        readable=bool(mask & selectors.EVENT_READ),
                        writable=bool(mask & selectors.EVENT_WRITE),
                    )
                if pending_tls:
                    with self._lock:
                        members = list(self._members.values())
                    for m in members:
                        sock = m.client.socket()
                        pending = getattr(sock, "pending", None)
                        if pending is not None and pending() > 0:
                            self._serve(sel, registered, m, readable=True, writable=False)
                if time.monotonic() >= next_misc:
                    next_misc = time.monotonic() + _TICK
                    with self._lock:
                        members = list(self._members.values())
                    for m in members:  # keep-alives
                        self._serve(sel, registered, m, readable=False, writable=False)
        finally:
            sel.close()

    def _sync(self, sel: Any, registered: dict[int, tuple[Any, bool]], m: _Member) -> None:
        """Register ``m``'s socket (for writing too while it wants to write)."""
        sock = m.client.socket()
        key = id(m.client)
        old = registered.get(key)
        if sock is None:
            self._unregister(sel, registered, m)
            return
        want = bool(m.client.want_write())
        if old is not None and old[0] is sock and old[1] == want:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        try:
            if old is not None and old[0] is sock:
                sel.modify(sock, events, m)
            else:
                if old is not None:
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        sel.unregister(old[0])
                sel.register(sock, events, m)
            registered[key] = (sock, want)
        except (KeyError, ValueError, OSError):
            registered.pop(key, None)

    def _unregister(self, sel: Any, registered: dict[int, tuple[Any, bool]], m: _Member) -> None:
        old = registered.pop(id(m.client), None)
        if old is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                sel.unregister(old[0])

    def _serve(
        self,
        sel: Any,
        registered: dict[int, tuple[Any, bool]],
        m: _Member,
        *,
        readable: bool,
        writable: bool,
    ) -> None:
        """One pass over one client: read, write, keep alive; forget it once gone."""
        client = m.client
        try:
            with m.io_lock:
                sock = client.socket()
                if sock is None:
                    gone = True
                else:
                    rc = mqtt.MQTT_ERR_SUCCESS
                    if readable:
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
                if not gone:
                    self._sync(sel, registered, m)
        except Exception:  # a bug must not end the loop of every other session
            log.exception("%s: serving an MQTT client failed", self.label)
            gone = True
        if gone:
            self._unregister(sel, registered, m)
            with self._lock:
                self._members.pop(id(client), None)
