"""One network thread for the connections of many subscription sessions (cluster mode).

A :class:`Hub` serves every :class:`Member` added to it in one thread: a selector (epoll)
over their sockets (and a wake-up socket), then ``serve`` of each member whose socket is
ready, keep-alives at least every ``_TICK`` seconds.  A member connects itself (a
blocking TCP connect, its CONNECT queued) and is then added; it never reconnects here:
once ``serve`` says its connection ended, the hub forgets it.  Other threads queue
packets on a member (acknowledgements, SUBSCRIBE) holding its ``io_lock``, which it holds
while the hub serves it, and then :meth:`Hub.wake` it.  The members are
:class:`~.sub_client.SessionClient` objects.

So an instance in cluster mode has one network thread for all its subscription sessions
instead of one per session (docs/scale-out.md "MQTT in cluster mode").

A member that closes cleanly stays served while it hands its last packets over (it says
so with :meth:`Hub.draining`, keyed by its client id): a new connection with that key
waits for it (:meth:`Hub.await_drained`), and :meth:`Hub.close` waits for every one, at
most :data:`DRAIN_TIMEOUT` seconds each.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from typing import Any, Protocol

__all__ = ["Hub", "Member"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: longest wait in ``select``: keep-alives are checked at least this often
_TICK = 1.0
#: seconds a member that closes cleanly is served at most to hand its last packets over
#: (see :meth:`Hub.draining`)
DRAIN_TIMEOUT = 5.0


class Member(Protocol):
    """A connection the hub serves."""

    def socket(self) -> socket.socket | None:
        """The socket to watch (None once closed)."""

    def want_write(self) -> bool:
        """Whether bytes wait to be written."""

    def buffered(self) -> bool:
        """Whether bytes already read from the socket wait (TLS)."""

    def serve(self, readable: bool, writable: bool) -> bool:
        """Read, keep alive, write; whether the connection lives on."""


class Hub:
    """Serves many connections in one thread (see the module docstring)."""

    def __init__(self, label: str = "mqtt-hub", *, tls: bool = False) -> None:
        self.label = label
        self.tls = tls
        self._lock = threading.Lock()
        self._members: dict[int, Member] = {}
        #: members removed, or with packets queued (or just added), since the thread last
        #: looked
        self._removed: list[Member] = []
        self._dirty: set[int] = set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        #: key -> the events of its members closing (set once each is closed)
        self._drains: dict[str, set[threading.Event]] = {}

    def add(self, member: Member) -> None:
        """Serve ``member`` (connected by itself) until its connection ends."""
        with self._lock:
            self._members[id(member)] = member
            self._dirty.add(id(member))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"wsnmom-{self.label}", daemon=True
                )
                self._thread.start()
        self._poke()

    def remove(self, member: Member) -> None:
        """Stop serving ``member`` (its socket is its own to close)."""
        with self._lock:
            if self._members.pop(id(member), None) is not None:
                self._removed.append(member)
        self._poke()

    def wake(self, member: Any = None) -> None:
        """Have the hub write what was queued for ``member`` (None: look at all).  Only a
        wake that finds nothing waiting pokes the thread: the others join the pass that
        poke starts (the PUBACKs of a settled batch: one wake-up, not one per message)."""
        with self._lock:
            idle = not self._dirty
            if member is None:
                self._dirty.update(self._members)
            else:
                self._dirty.add(id(member))
        if idle:
            self._poke()

    def draining(self, key: str) -> threading.Event:
        """A member of ``key`` closes and is served until its socket is closed: the
        event to set then (:meth:`await_drained` waits for it)."""
        done = threading.Event()
        with self._lock:
            self._drains.setdefault(key, set()).add(done)
        return done

    def drained(self, key: str, done: threading.Event) -> None:
        """The member of ``key`` given ``done`` is closed."""
        done.set()
        with self._lock:
            events = self._drains.get(key)
            if events is not None:
                events.discard(done)
                if not events:
                    del self._drains[key]

    def await_drained(self, key: str | None, timeout: float = DRAIN_TIMEOUT) -> bool:
        """Wait until the closing members of ``key`` (None: of every key) are closed, up
        to ``timeout`` seconds; whether they all are."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if key is None:
                waits = [e for events in self._drains.values() for e in events]
            else:
                waits = list(self._drains.get(key, ()))
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in waits)

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    @property
    def serving(self) -> bool:
        """Whether the thread serves (not closed): a member closing cleanly needs it."""
        return not self._halt.is_set()

    def __len__(self) -> int:
        return len(self._members)

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (the members are their owners' to close first), once the
        members closing cleanly are closed (at most :data:`DRAIN_TIMEOUT` seconds)."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self.await_drained(None, DRAIN_TIMEOUT + _TICK)
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
                # members with something queued, or just added: write (and register)
                for m in dirty:
                    self._serve(sel, registered, m, readable=False, writable=True)
                buffered = self.tls and any(m.buffered() for m in self._snapshot())
                timeout = 0.0 if buffered else max(0.0, next_misc - time.monotonic())
                try:
                    events = sel.select(timeout)
                except (OSError, ValueError):  # a socket closed under us
                    events = []
                for ready, mask in events:
                    if ready.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(65536)
                        continue
                    self._serve(
                        sel,
                        registered,
                        ready.data,
                        readable=bool(mask & selectors.EVENT_READ),
                        writable=bool(mask & selectors.EVENT_WRITE),
                    )
                if buffered:  # TLS: bytes already read from the socket wait
                    for m in self._snapshot():
                        if m.buffered():
                            self._serve(sel, registered, m, readable=True, writable=False)
                if time.monotonic() >= next_misc:
                    next_misc = time.monotonic() + _TICK
                    for m in self._snapshot():  # keep-alives
                        self._serve(sel, registered, m, readable=False, writable=False)
        finally:
            sel.close()

    def _snapshot(self) -> list[Member]:
        with self._lock:
            return list(self._members.values())

    def _sync(self, sel: Any, registered: dict[int, tuple[Any, bool]], m: Member) -> None:
        """Register ``m``'s socket (for writing too while it wants to write)."""
        sock = m.socket()
        key = id(m)
        old = registered.get(key)
        if sock is None:
            self._unregister(sel, registered, m)
            return
        want = m.want_write()
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

    def _unregister(self, sel: Any, registered: dict[int, tuple[Any, bool]], m: Member) -> None:
        old = registered.pop(id(m), None)
        if old is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                sel.unregister(old[0])

    def _serve(
        self,
        sel: Any,
        registered: dict[int, tuple[Any, bool]],
        m: Member,
        *,
        readable: bool,
        writable: bool,
    ) -> None:
        """One pass over one member; forget it once its connection ended."""
        try:
            alive = m.serve(readable, writable)
        except Exception:  # a bug must not end the loop of every other session
            log.exception("%s: serving an MQTT connection failed", self.label)
            alive = False
        if alive:
            self._sync(sel, registered, m)
            return
        self._unregister(sel, registered, m)
        with self._lock:
            self._members.pop(id(m), None)
