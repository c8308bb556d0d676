"""Acks and nacks of a :class:`~._link.Link`'s deliveries made on other threads, written
by its I/O thread in batches (see :meth:`Settles.settle`): the link's half that settles,
and what it needs of the link (:class:`LinkCore`, a Protocol).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from ._channel import Channel
from ._fast import FastConnection
from ._wire import settle_frame

#: seconds the loop waits for more settlements once a flush wrote several, before
#: writing them (see :meth:`Settles.settle`)
SETTLE_LINGER = 0.002
#: seconds within which the settlements of messages a ``basic.get`` handed out are
#: expected (GetMessages acks after its answer's write), collected without a loop
#: wake-up of their own (see :meth:`Settles.expect_settles`)
SETTLE_HOLD = 0.01


class LinkCore(Protocol):
    """What :class:`Settles` needs of the link it is mixed into: the I/O thread's loop,
    the connection, whether it is closing, and whether the caller is on that thread."""

    loop: asyncio.AbstractEventLoop
    connection: FastConnection | None
    _closing: bool

    @property
    def on_loop_thread(self) -> bool:
        """True when called from the link's I/O thread."""
        ...


class Settles(LinkCore):
    """The settling half of :class:`~._link.Link` (a mixin: the link provides what
    :class:`LinkCore` declares; the type checker refuses to make one that does not)."""

    def _init_settles(self) -> None:
        #: acks/nacks from other threads, written by the loop in one go (see settle)
        self._settles: list[tuple[Channel, int, bool, bool]] = []
        self._settle_lock = threading.Lock()
        #: a flush of _settles is scheduled (a wake-up asked for, or the linger timer)
        self._settle_armed = False
        #: a wake-up for a flush was asked for (the flush may be a timer's otherwise)
        self._settle_woken = False
        #: settlements from other threads, loop wake-ups they asked for, and flushes
        #: that wrote some (counters for tests and the close log line)
        self.settles_queued = 0
        self.settle_wakeups = 0
        self.settle_flushes = 0

    def settle(self, channel: Channel, delivery_tag: int, ack: bool, requeue: bool) -> None:
        """Ack (or nack) a delivery of ``channel``, from any thread.

        Settlements from other threads are collected and written by the loop in one
        socket write per flush, instead of one loop wake-up (a write to the loop's
        self-pipe, which also gives the GIL away) and one pika frame object per message.
        A settlement with no flush scheduled wakes the loop, which writes it at once.
        When a flush wrote more than one, settlements were coming faster than the loop
        was woken for them: the loop then keeps a timer of ``SETTLE_LINGER`` instead, and
        the settlements made meanwhile ask for no wake-up; they are written together when
        it fires (re-armed while each flush still writes several), except a nack, which
        wakes the loop unless a wake-up is pending already.  So a lone ack is
        written at once, and a stream of them costs the loop one wake-up per
        ``SETTLE_LINGER`` rather than one each.  Pending settlements of a channel are
        written before it is closed (:meth:`flush_settles`).
        """
        if self.on_loop_thread:
            self._settle_now([(channel, delivery_tag, ack, requeue)])
            return
        with self._settle_lock:
            self._settles.append((channel, delivery_tag, ack, requeue))
            self.settles_queued += 1
            # a flush is already scheduled; a nack waits for none but a wake-up (what
            # it gives back must be in the queue before a later get, on another
            # channel maybe, asks for it)
            if self._settle_armed and (ack or self._settle_woken):
                return
            self._settle_armed = True
            self._settle_woken = True
            self.settle_wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._flush_settles)
        except RuntimeError:  # the loop is closed: the connection is gone
            with self._settle_lock:
                self._settle_armed = False

    def expect_settles(self) -> None:
        """Loop thread: a get just handed messages out to another thread, which settles
        them soon (GetMessages: once its answer is written).  Schedule a flush in
        ``SETTLE_HOLD`` unless one is scheduled: a settlement made before it fires asks
        for no wake-up (a self-pipe write on the settling thread and a loop turn of its
        own, per answer) and is written by that flush, or sooner by any flush (the next
        get writes what is pending first).  One that comes later wakes the loop as
        usual; meanwhile other threads' acks on this connection may wait as long."""
        with self._settle_lock:
            if self._settle_armed or self._closing:
                return
            self._settle_armed = True
        self.loop.call_later(SETTLE_HOLD, self._flush_settles)

    def _flush_settles(self) -> None:
        """Loop thread: write what was settled; linger when it was several."""
        with self._settle_lock:
            items, self._settles = self._settles, []
            linger = len(items) > 1 and not self._closing
            self._settle_armed = linger
            self._settle_woken = False
        if items:
            self.settle_flushes += 1
            self._settle_now(items)
        if linger:
            self.loop.call_later(SETTLE_LINGER, self._flush_settles)

    def flush_settles(self) -> None:
        """Loop thread: write the pending settlements now (before a channel closes, so
        that acks already given are not undone by the close's requeue); a scheduled
        flush stays scheduled and finds less to do."""
        with self._settle_lock:
            items, self._settles = self._settles, []
        if items:
            self.settle_flushes += 1
            self._settle_now(items)

    def _settle_now(self, items: list[tuple[Channel, int, bool, bool]]) -> None:
        conn = self.connection
        # A delivery tag is only valid on its channel; once that channel is gone the
        # broker has already requeued the message (it will be redelivered).
        frames = [
            settle_frame(ch.pika.channel_number, tag, ack, requeue)
            for ch, tag, ack, requeue in items
            if ch.is_open and ch.pika.connection is conn
        ]
        if frames and conn is not None and conn.is_open:
            conn.write_frames(b"".join(frames))
