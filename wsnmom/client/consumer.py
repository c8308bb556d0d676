"""``NotificationConsumer``: a small HTTP server that receives Notify messages.

It listens on a free port of the loopback interface unless told otherwise, accepts SOAP 1.1
and 1.2 posts on any path, and turns each ``wsnt:NotificationMessage`` of a wrapped Notify
-- or the Body of a raw delivery (UseRaw) -- into a
:class:`~wsnmom.client.model.Notification`::

    with NotificationConsumer() as consumer:
        wsn.subscribe(consumer, "tns:alarms")
        for notification in consumer.notifications(timeout=10):   # stops after 10 s of quiet
            print(notification.topic, notification.payload_xml)

or, with a callback (called on the server's request thread)::

    consumer = NotificationConsumer(on_notification=lambda n: print(n.payload_xml))

Notifications are acknowledged with HTTP 202 once they are queued (or the callback
returned).  A body that is not SOAP gets 400 or 415; a Notify that is not well-formed WS-N
gets a SOAP fault (HTTP 500), so the broker retries or gives up as configured.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, Self

from wsnmom.core.errors import WsnError
from wsnmom.soap_frontend.codec import HOPS, T
from wsnmom.soap_frontend.envelope import (
    HttpError,
    SoapProtocolErrorWithContext,
    content_type_for,
    envelope_bytes,
    parse_request,
)
from wsnmom.soap_frontend.faults import fault_for_error, transport_fault
from wsnmom.soap_frontend.message_info import MESSAGES
from wsnmom.soap_frontend.xml import parse_fragment, serialize_standalone

from . import wire
from .model import Notification

__all__ = ["MAX_REQUEST_BYTES", "NotificationConsumer"]

log = logging.getLogger("wsnmom.client.consumer")

#: largest request body accepted
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
#: how often the idle serving loop checks for close() (which waits up to this long)
_POLL_INTERVAL: Final = 0.05


class NotificationConsumer:
    """A NotificationConsumer endpoint in a background thread (see the module docstring)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        path: str = "/consumer",
        on_notification: Callable[[Notification], None] | None = None,
        advertised_address: str | None = None,
    ) -> None:
        """Listen on ``host``:``port`` (0: a free port).  ``path`` is the path of
        :attr:`address`; posts to any path are accepted.  ``on_notification`` replaces the
        queue.  ``advertised_address`` is the address to give brokers when they reach this
        host under another name (NAT, containers)."""
        self._queue: queue.Queue[Notification] = queue.Queue()
        self._callback = on_notification
        self._count = 0
        self._lock = threading.Lock()
        #: the connections being served (keep-alive ones wait for their next request)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        consumer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "wsnmom-consumer"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def setup(self) -> None:
                super().setup()
                with consumer._connections_lock:
                    consumer._connections.add(self.connection)

            def finish(self) -> None:
                with consumer._connections_lock:
                    consumer._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                consumer._handle(self)

            def do_GET(self) -> None:
                consumer._reply(self, 405, b"POST SOAP notifications here\n", "text/plain")

        family_host = host.strip("[]")
        server_class = _server_class(family_host)
        self._server = server_class((family_host, port), Handler)
        self._server.daemon_threads = True
        self.host = family_host
        self.port = int(self._server.server_address[1])
        self.path = path if path.startswith("/") else "/" + path
        self._advertised = advertised_address
        # close() waits for the serving loop's next poll (0.5 s by default)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name="wsnmom-consumer",
            daemon=True,
        )
        self._thread.start()

    @property
    def address(self) -> str:
        """The address to subscribe (``http://127.0.0.1:PORT/consumer``)."""
        if self._advertised:
            return self._advertised
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    @property
    def received(self) -> int:
        """How many notifications arrived so far."""
        with self._lock:
            return self._count

    # --- receiving ---------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Notification:
        """The next notification; ``TimeoutError`` when none arrives within ``timeout``."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no notification within {timeout}s") from None

    def notifications(
        self, timeout: float | None = None, count: int | None = None
    ) -> Iterator[Notification]:
        """Yield notifications as they arrive; stop after ``count`` of them, or when
        ``timeout`` seconds pass without one (None: wait forever)."""
        yielded = 0
        while count is None or yielded < count:
            try:
                yield self.get(timeout)
            except TimeoutError:
                return
            yielded += 1

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Notification]:
        """Exactly the next ``count`` notifications; ``TimeoutError`` when they do not all
        arrive within ``timeout`` seconds in total."""
        deadline = time.monotonic() + timeout
        out: list[Notification] = []
        while len(out) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(out)} of {count} notifications within {timeout}s")
            try:
                out.append(self.get(remaining))
            except TimeoutError:
                raise TimeoutError(
                    f"{len(out)} of {count} notifications within {timeout}s"
                ) from None
        return out

    def drain(self) -> list[Notification]:
        """Every notification queued now, without waiting."""
        out: list[Notification] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    # --- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the server and end the connections it serves (a broker's keep-alive
        connection would keep its socket and request thread otherwise); idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        with self._connections_lock:
            serving = list(self._connections)
        for connection in serving:  # its request thread reads the end and closes it
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the HTTP side ---------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            length = int(handler.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_REQUEST_BYTES:
            handler.close_connection = True
            self._reply(handler, 413 if length > 0 else 411, b"bad Content-Length\n", "text/plain")
            return
        data = handler.rfile.read(length)
        try:
            request = parse_request("POST", handler.headers.get("Content-Type"), data)
        except HttpError as exc:
            answer = transport_fault(exc, handler.headers.get("Content-Type"))
            self._reply(handler, answer.status, answer.body, answer.content_type)
            return
        except SoapProtocolErrorWithContext as exc:
            self._fault(handler, exc, exc.version, exc.addressing.message_id)
            return
        # the echoed reference parameters (the gateway's hop marker is not one)
        others = request.addressing.other_headers
        headers = tuple(copy.deepcopy(h) for h in others if h.tag not in (HOPS, MESSAGES))
        try:
            if request.body.tag == T("Notify"):
                received = wire.notifications(request.body, allow_empty=False)
            else:
                payload = parse_fragment(serialize_standalone(request.body))
                received = [Notification(payload=payload, raw=True)]
        except WsnError as exc:
            self._fault(handler, exc, request.version, request.addressing.message_id)
            return
        wire.apply_message_info(received, others)
        for notification in received:
            notification.path = handler.path
            notification.headers = headers
            self._deliver(notification)
        self._reply(handler, 202, b"", None)

    def _deliver(self, notification: Notification) -> None:
        with self._lock:
            self._count += 1
        if self._callback is None:
            self._queue.put(notification)
            return
        try:
            self._callback(notification)
        except Exception:
            log.exception("the on_notification callback failed")

    def _fault(
        self,
        handler: BaseHTTPRequestHandler,
        error: BaseException,
        version: Any,
        relates_to: str | None,
    ) -> None:
        fault, action, _ = fault_for_error(error, version)
        body = envelope_bytes(version, fault, action=action, relates_to=relates_to)
        self._reply(handler, 500, body, content_type_for(version, action))

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str | None
    ) -> None:
        handler.send_response(status)
        if content_type:
            handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body:
            handler.wfile.write(body)


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    import socket

    if ":" not in host:
        return ThreadingHTTPServer

    class V6Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    return V6Server
