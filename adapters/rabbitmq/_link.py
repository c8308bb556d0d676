"""One AMQP connection driven by its own I/O thread, with reconnection.

pika connections are not thread-safe, so every :class:`Link` owns an asyncio event loop
running on a dedicated daemon thread and a :class:`pika.adapters.asyncio_connection.
AsyncioConnection` bound to that loop.  Nothing outside the loop thread touches pika
objects: other threads hand coroutines to :meth:`Link.submit` (which waits for the result)
or callables to :meth:`Link.call_soon` (fire and forget, used for acks).

A supervisor task connects, runs the owner's ``on_connected`` coroutine (re-declare
topology, resume consumers), waits for the connection to drop, tells the owner through
``on_disconnected`` and reconnects with exponential backoff until :meth:`Link.close`.

:class:`Channel` wraps a pika channel so that its synchronous AMQP methods can be awaited.
When the broker closes a channel (a failed passive declare, a precondition failure) every
RPC pending on it raises :class:`ChannelError` with the AMQP reply code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

try:
    import pika
    import pika.exceptions
    from pika import spec
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc

from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel as PikaChannel

log = logging.getLogger("wsnmom.adapters.rabbitmq")

T = TypeVar("T")

#: AMQP reply codes the adapter reacts to
NOT_FOUND = 404
PRECONDITION_FAILED = 406
RESOURCE_LOCKED = 405


class ChannelError(Exception):
    """The broker (or the connection) closed a channel while an operation was pending."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    @classmethod
    def from_reason(cls, reason: BaseException | None) -> ChannelError:
        """Build from the reason pika gives for a channel closure."""
        if isinstance(reason, pika.exceptions.ChannelClosed):
            return cls(reason.reply_code, reason.reply_text)
        return cls(0, str(reason or "channel closed"))


def describe(exc: BaseException | None) -> str:
    """A readable one-line description (some pika errors have an empty ``str``)."""
    if exc is None:
        return "closed"
    return str(exc) or type(exc).__name__


class LinkDown(Exception):
    """The link has no open connection (within the time allowed)."""


class Channel:
    """A pika channel whose RPCs are awaitable.  Use only on the link's loop thread."""

    def __init__(self, link: Link, channel: PikaChannel) -> None:
        self.link = link
        self.pika = channel
        self.close_reason: BaseException | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._get_waiter: asyncio.Future[Any] | None = None
        self._close_listeners: list[Callable[[Channel, BaseException], None]] = []
        channel.add_on_close_callback(self._on_close)
        channel.add_callback(self._on_get_empty, [spec.Basic.GetEmpty], one_shot=False)

    @property
    def is_open(self) -> bool:
        """True while the channel can be used."""
        return self.close_reason is None and self.pika.is_open

    def add_close_listener(self, listener: Callable[[Channel, BaseException], None]) -> None:
        """Call ``listener(channel, reason)`` on the loop thread when the channel closes."""
        self._close_listeners.append(listener)

    def _on_close(self, _channel: PikaChannel, reason: BaseException) -> None:
        self.close_reason = reason
        error = ChannelError.from_reason(reason)
        for fut in list(self._pending):
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        for listener in self._close_listeners:
            try:
                listener(self, reason)
            except Exception:  # pragma: no cover - defensive
                log.exception("channel close listener failed")

    def _future(self) -> asyncio.Future[Any]:
        if not self.is_open:
            raise ChannelError.from_reason(self.close_reason)
        fut: asyncio.Future[Any] = self.link.loop.create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``channel.<method>(..., callback=...)`` and await the reply frame."""
        fut = self._future()

        def done(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        getattr(self.pika, method)(*args, callback=done, **kwargs)
        return await fut

    async def get(self, queue: str) -> tuple[Any, Any, bytes] | None:
        """``basic.get`` with manual ack: (method, properties, body) or None when empty."""
        fut = self._future()
        self._get_waiter = fut

        def got(_ch: PikaChannel, method: Any, properties: Any, body: bytes) -> None:
            if not fut.done():
                fut.set_result((method, properties, body))

        self.pika.basic_get(queue, got, auto_ack=False)
        try:
            result: tuple[Any, Any, bytes] | None = await fut
        finally:
            self._get_waiter = None
        return result

    def _on_get_empty(self, _frame: Any) -> None:
        waiter = self._get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def close(self) -> None:
        """Close the channel (unacked deliveries go back to their queues)."""
        if not self.is_open:
            return
        fut = self.link.loop.create_future()
        self.add_close_listener(lambda _c, _r: fut.done() or fut.set_result(None))
        with contextlib.suppress(Exception):
            self.pika.close()
            await asyncio.wait_for(fut, 5.0)


class Link:
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
    ) -> None:
        self.name = name
        self.parameters = parameters
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.connect_timeout = connect_timeout
        self.loop = asyncio.new_event_loop()
        self.connection: AsyncioConnection | None = None
        #: increments on every successful connection
        self.generation = 0
        #: last connection error, for messages
        self.last_error: BaseException | None = None
        self.admin_lock: asyncio.Lock | None = None
        self._admin: Channel | None = None
        self._up = threading.Event()
        self._up_async: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._lost: asyncio.Future[BaseException | None] | None = None
        self._closing = False
        self._connecting: AsyncioConnection | None = None
        self._first_attempt = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wsnmom-amqp-{name}", daemon=True)

    # --- lifecycle ------------------------------------------------------------------

    def start(self, wait: float) -> bool:
        """Start the I/O thread; wait up to ``wait`` s for the first connection."""
        self._thread.start()
        self._first_attempt.wait(wait)
        return self._up.is_set()

    def close(self, timeout: float = 10.0) -> None:
        """Close the connection and stop the thread; idempotent."""
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
        self.admin_lock = asyncio.Lock()
        delay = self.min_delay
        while not self._closing:
            try:
                conn = await self._connect()
            except Exception as exc:
                self.last_error = exc
                log.warning("%s: cannot connect to RabbitMQ: %s", self.name, describe(exc))
                self._first_attempt.set()
                await self._pause(delay)
                delay = min(delay * 2, self.max_delay)
                continue
            self.connection = conn
            self.generation += 1
            self._admin = None
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
                    self._up.set()
                    self._up_async.set()
                    delay = self.min_delay
                    if self.generation > 1:
                        log.info("%s: reconnected to RabbitMQ", self.name)
            self._first_attempt.set()
            reason = await self._lost
            self._up.clear()
            self._up_async.clear()
            self.connection = None
            self._admin = None
            self.last_error = reason
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

    async def _connect(self) -> AsyncioConnection:
        fut: asyncio.Future[AsyncioConnection] = self.loop.create_future()

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

        conn = AsyncioConnection(
            self.parameters,
            on_open_callback=opened,
            on_open_error_callback=failed,
            on_close_callback=closed,
            custom_ioloop=self.loop,
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

        conn.channel(on_open_callback=opened)
        return Channel(self, await asyncio.wait_for(fut, self.connect_timeout))

    async def admin(self) -> Channel:
        """The shared channel for declarations (reopened after the broker closed it).

        Hold ``admin_lock`` around operations that may fail, so that one failure does not
        surface in another task's RPC.
        """
        if self._admin is None or not self._admin.is_open:
            self._admin = await self.open_channel()
        return self._admin

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
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"RabbitMQ did not answer within {timeout:.1f}s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread soon (no result); ignored once closed."""
        if self.on_loop_thread:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)
