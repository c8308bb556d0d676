"""One AMQP connection driven by its own I/O thread, with reconnection.

pika connections are not thread-safe, so every :class:`Link` owns an asyncio event loop
running on a dedicated daemon thread and a :class:`pika.adapters.asyncio_connection.
AsyncioConnection` bound to that loop.  Nothing outside the loop thread touches pika
objects: other threads hand coroutines to :meth:`Link.submit` (which waits for the result)
or callables to :meth:`Link.call_soon` (fire and forget, used for acks).

A supervisor task connects, runs the owner's ``on_connected`` coroutine (re-declare
topology, resume consumers), waits for the connection to drop, tells the owner through
``on_disconnected`` and reconnects with exponential backoff until :meth:`Link.close`.

Declarations (queues, bindings, exchanges, purges, deletes) go through a small pool of
channels per connection, :meth:`Link.declaring`: each task holds one channel of it for its
sequence of RPCs, and up to ``declare_channels`` tasks declare at once.  The broker answers
one channel's methods one after another, so with a single shared channel a burst of new
subscriptions waited for each other's round trips (docs/performance.md, F26).

The connection is a :class:`~._fast.FastConnection`; its channels are
:class:`~._channel.Channel` objects (awaitable RPCs, :class:`~._channel.ChannelError` with
the AMQP reply code when the broker closes one); the frames the adapter writes and reads
itself are in :mod:`._wire`.  This module re-exports the names of those modules that
the adapter's tests use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

try:
    import pika
    import pika.exceptions
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc

from pika.channel import Channel as PikaChannel

from ._backlog import Backlog
from ._channel import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    Channel,
    ChannelError,
    Declarer,
    GetReply,
)
from ._fast import FastConnection
from ._settles import SETTLE_HOLD, SETTLE_LINGER, Settles
from ._wire import (
    Delivered,
    FrameReader,
    Properties,
    PublishFrames,
    encode_table,
    settle_frame,
)

__all__ = [
    "NOT_FOUND",
    "PRECONDITION_FAILED",
    "RESOURCE_LOCKED",
    "SETTLE_HOLD",
    "SETTLE_LINGER",
    "Channel",
    "ChannelError",
    "Declarer",
    "Delivered",
    "FastConnection",
    "FrameReader",
    "GetReply",
    "Link",
    "LinkBusy",
    "LinkDown",
    "Properties",
    "PublishFrames",
    "describe",
    "encode_table",
    "settle_frame",
]

log = logging.getLogger("wsnmom.adapters.rabbitmq")

T = TypeVar("T")


def describe(exc: BaseException | None) -> str:
    """A readable one-line description (some pika errors have an empty ``str``)."""
    if exc is None:
        return "closed"
    return str(exc) or type(exc).__name__


class LinkDown(Exception):
    """The link has no open connection (within the time allowed)."""


class LinkBusy(TimeoutError):
    """An operation timed out while its connection stayed up: overload, not an outage."""

    def __init__(self, message: str, *, retry_after: float, waiting: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.waiting = waiting


class Link(Settles):
    """An AMQP connection with its own I/O thread and automatic reconnection."""

    def __init__(
        self,
        name: str,
        parameters: pika.connection.Parameters,
        on_connected: Callable[[Link], Awaitable[None]],
        on_disconnected: Callable[[Link, BaseException | None], None],
        *,
        min_delay: float = 0.2,
        max_delay: float = 5.0,
        connect_timeout: float = 10.0,
        declare_channels: int = 1,
    ) -> None:
        self.name = name
        self.parameters = parameters
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.connect_timeout = connect_timeout
        self.loop = asyncio.new_event_loop()
        self.connection: FastConnection | None = None
        #: increments on every successful connection
        self.generation = 0
        #: last connection error, for messages
        self.last_error: BaseException | None = None
        #: why the last connection ended (None while up, or before a first loss)
        self.lost_reason: BaseException | None = None
        #: connection attempts are failing (logged once per outage)
        self._failing = False
        #: declaration channels used at once (:meth:`declaring`)
        self.declare_channels = max(1, declare_channels)
        self._declare_slots: asyncio.Semaphore | None = None
        #: open declaration channels no task holds (of the current connection)
        self._declare_idle: list[Channel] = []
        self._declaring = 0
        #: most declaration channels held at once since the link started
        self.declare_peak = 0
        self._up = threading.Event()
        self._up_async: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._lost: asyncio.Future[BaseException | None] | None = None
        self._closing = False
        self._connecting: FastConnection | None = None
        self._first_attempt = threading.Event()
        self._init_settles()
        #: operations other threads wait for on this connection (overload estimates)
        self.backlog = Backlog()
        self._thread = threading.Thread(target=self._run, name=f"wsnmom-amqp-{name}", daemon=True)

    # --- lifecycle ------------------------------------------------------------------

    def start(self, wait: float) -> bool:
        """Start the I/O thread; wait up to ``wait`` s for the first connection."""
        self._thread.start()
        self._first_attempt.wait(wait)
        return self._up.is_set()

    def close(self, timeout: float = 10.0) -> None:
        """Close the connection and stop the thread; idempotent.  A link never started
        closes its event loop here (the I/O thread closes it otherwise): its selector
        held a socket pair until garbage collection."""
        if self._thread.ident is None:
            if not self.loop.is_closed():
                self.loop.close()
            return
        if not self._thread.is_alive():
            return
        self._closing = True
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._request_stop)
        self._thread.join(timeout)

    @property
    def is_up(self) -> bool:
        """True while connected and the owner's topology is in place."""
        return self._up.is_set()

    @property
    def on_loop_thread(self) -> bool:
        """True when called from this link's I/O thread."""
        return threading.current_thread() is self._thread

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self.flush_settles()
        if self.settles_queued:
            log.debug(
                "%s: %d acks/nacks from other threads, %d loop wake-ups asked, %d writes",
                self.name,
                self.settles_queued,
                self.settle_wakeups,
                self.settle_flushes,
            )
        for conn in (self.connection, self._connecting):
            if conn is not None and not conn.is_closed and not conn.is_closing:
                with contextlib.suppress(Exception):
                    conn.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._supervise())
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def _supervise(self) -> None:
        self._stop = asyncio.Event()
        self._up_async = asyncio.Event()
        self._declare_slots = asyncio.Semaphore(self.declare_channels)
        delay = self.min_delay
        while not self._closing:
            try:
                conn = await self._connect()
            except Exception as exc:
                # one line per outage, not one per attempt
                level = logging.DEBUG if self._failing else logging.WARNING
                self._failing = True
                self.last_error = exc
                log.log(
                    level, "%s: cannot connect to RabbitMQ (retrying): %s", self.name, describe(exc)
                )
                self._first_attempt.set()
                await self._pause(delay)
                delay = min(delay * 2, self.max_delay)
                continue
            self.connection = conn
            self.generation += 1
            self._declare_idle = []
            self._lost = self.loop.create_future()
            try:
                await asyncio.wait_for(self._on_connected(self), self.connect_timeout * 3)
            except Exception as exc:
                self.last_error = exc
                log.warning("%s: setting up after connect failed: %s", self.name, describe(exc))
                with contextlib.suppress(Exception):
                    conn.close()
            else:
                if conn.is_open:
                    self.lost_reason = None
                    self._up.set()
                    self._up_async.set()
                    delay = self.min_delay
                    if self.generation > 1 or self._failing:
                        log.info("%s: connected to RabbitMQ again", self.name)
                    self._failing = False
            self._first_attempt.set()
            reason = await self._lost
            self._up.clear()
            self._up_async.clear()
            self.connection = None
            self._declare_idle = []
            self.last_error = self.lost_reason = reason
            try:
                self._on_disconnected(self, reason)
            except Exception:  # pragma: no cover - defensive
                log.exception("%s: disconnect handler failed", self.name)
            if not self._closing:
                log.warning("%s: connection to RabbitMQ lost: %s", self.name, describe(reason))
                await self._pause(delay)
                delay = min(delay * 2, self.max_delay)
        self._first_attempt.set()

    async def _pause(self, delay: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    async def _connect(self) -> FastConnection:
        fut: asyncio.Future[FastConnection] = self.loop.create_future()

        def opened(conn: Any) -> None:
            if not fut.done():
                fut.set_result(conn)

        def failed(_conn: Any, exc: BaseException) -> None:
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

        def closed(_conn: Any, reason: BaseException) -> None:
            lost = self._lost
            if lost is not None and not lost.done():
                lost.set_result(reason)

        conn = FastConnection(
            self.parameters,
            loop=self.loop,
            on_open_callback=opened,
            on_open_error_callback=failed,
            on_close_callback=closed,
        )
        self._connecting = conn
        try:
            return await asyncio.wait_for(fut, self.connect_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        finally:
            self._connecting = None

    # --- use from the loop thread -----------------------------------------------------

    async def ready(self, timeout: float) -> None:
        """Wait until connected (and set up); LinkDown after ``timeout`` seconds."""
        assert self._up_async is not None
        if self._up_async.is_set():
            return
        try:
            await asyncio.wait_for(self._up_async.wait(), timeout)
        except TimeoutError:
            raise LinkDown(f"not connected to RabbitMQ: {describe(self.last_error)}") from None

    async def open_channel(self) -> Channel:
        """Open a new channel on the current connection."""
        conn = self.connection
        if conn is None or not conn.is_open:
            raise LinkDown("not connected to RabbitMQ")
        fut: asyncio.Future[PikaChannel] = self.loop.create_future()

        def opened(ch: PikaChannel) -> None:
            if not fut.done():
                fut.set_result(ch)

        def closed(_ch: PikaChannel, reason: BaseException) -> None:
            # the connection died before the channel opened (pika closes its channels):
            # fail now rather than at the timeout
            if not fut.done():
                fut.set_exception(LinkDown(f"channel not opened: {describe(reason)}"))

        conn.channel(on_open_callback=opened).add_on_close_callback(closed)
        return Channel(self, await asyncio.wait_for(fut, self.connect_timeout))

    def begin_channel(self) -> Channel:
        """A new channel, its ``channel.open`` sent and not waited for: what is written
        on it next follows the open (``Channel.writable``).  A failed open closes it."""
        conn = self.connection
        if conn is None or not conn.is_open:
            raise LinkDown("not connected to RabbitMQ")
        return Channel(self, conn.channel(on_open_callback=lambda _ch: None))

    @contextlib.asynccontextmanager
    async def declaring(self) -> AsyncIterator[Declarer]:
        """Hold one declaration channel for a sequence of RPCs (at most
        ``declare_channels`` tasks at once; the others wait for a channel).  Do not
        enter it again while holding one: with every channel held that would wait
        forever."""
        slots = self._declare_slots
        assert slots is not None, "declaring() before the link started"
        async with slots:
            conn = self.connection
            idle = self._declare_idle
            channel: Channel | None = None
            while idle and channel is None:
                ch = idle.pop()
                if ch.is_open and ch.pika.connection is conn:
                    channel = ch
            declarer = Declarer(self, channel)
            self._declaring += 1
            self.declare_peak = max(self.declare_peak, self._declaring)
            try:
                yield declarer
            finally:
                self._declaring -= 1
                held = declarer.channel_in_use
                if held is not None and held.is_open and held.pika.connection is self.connection:
                    self._declare_idle.append(held)

    # --- use from other threads -------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop thread and wait up to ``timeout`` s for its result."""
        if self.on_loop_thread:
            coro.close()
            raise RuntimeError("blocking adapter call from the adapter's own I/O thread")
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise LinkDown("adapter is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        backlog = self.backlog
        backlog.begin()
        completed = False
        try:
            result = fut.result(timeout)
            completed = True
            return result
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise self.timed_out(timeout) from None
        finally:
            backlog.end(completed=completed)

    def timed_out(self, timeout: float) -> TimeoutError:
        """The error for an operation not answered within ``timeout`` s: ``LinkBusy``
        while the connection is up (the broker or this I/O thread is slow), a plain
        ``TimeoutError`` otherwise.  Call it before the operation leaves the backlog."""
        text = f"RabbitMQ did not answer within {timeout:.1f}s"
        if not self.is_up:
            return TimeoutError(text)
        waiting = self.backlog.waiting
        return LinkBusy(
            f"{text} ({waiting} operation(s) waiting on connection {self.name})",
            retry_after=self.backlog.retry_after(timeout),
            waiting=waiting,
        )

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread soon (no result); ignored once closed."""
        if self.on_loop_thread:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)
