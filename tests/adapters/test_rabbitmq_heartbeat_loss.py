"""A RabbitMQ connection whose broker falls silent (``adapters/rabbitmq/_fast.py`` under
pika's heartbeat checker), on the real test node behind a loopback relay.

The relay stops passing the broker's bytes to the adapter while the adapter's own still
reach the broker, so only the adapter's side can notice: pika's heartbeat checker must see
no bytes received (the counters the stream keeps), abort the stream through the adapter's
I/O, and the link must report the loss.  A publisher waiting for its confirm then fails
at once with pika's heartbeat timeout as the reason instead of waiting out its timeout, and the link
reconnects (the relay passes new connections) and publishes again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

pytest.importorskip("pika")

from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import OutboundMessage, PublishFailed
from wsnmom.topic_mapping.model import Topic

from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


class Relay:
    """Relays loopback connections to ``upstream``; :meth:`silence` makes the broker's
    side of the connections open now go quiet (its bytes are read and dropped)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.silenced: set[int] = set()
        self.connections = 0
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            self.connections += 1
            number = self.connections
            self.sockets += [client, up]
            threading.Thread(target=self._pump, args=(client, up, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, number), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, number: int | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if number is None or number not in self.silenced:
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def silence(self) -> None:
        self.silenced.update(range(1, self.connections + 1))

    def close(self) -> None:
        """Stop accepting and end the relayed connections, and with them the threads
        (closing a socket does not wake a thread blocked on it: shutting it down does;
        the accepting thread was left behind per test)."""
        for s in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._accepting.join(10)


@pytest.fixture
def relay(rabbitmq_url: str) -> Iterator[Relay]:
    parts = urlsplit(rabbitmq_url)
    assert parts.hostname is not None
    r = Relay((parts.hostname, parts.port or 5672))
    yield r
    r.close()


def _via(rabbitmq_url: str, port: int) -> str:
    parts = urlsplit(rabbitmq_url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex, headers={})


def test_a_silent_broker_is_noticed_by_the_heartbeat_and_publishers_fail_fast(
    relay: Relay, make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    adapter = make_adapter(_via(rabbitmq_url, relay.port), heartbeat=1, reconnect_max_delay=0.5)
    topic = Topic(f"urn:test:rabbit-hb:{uuid.uuid4().hex}", ("t",))
    adapter.publish(_message(topic, b"<before/>"), timeout=10.0)  # direct path is warm

    relay.silence()
    outcome: list[Any] = []
    publish_timeout = 60.0

    def publish() -> None:
        started = time.monotonic()
        try:
            adapter.publish(_message(topic, b"<during/>"), timeout=publish_timeout)
            outcome.append(("confirmed", time.monotonic() - started))
        except PublishFailed as exc:
            outcome.append((str(exc), time.monotonic() - started))

    thread = threading.Thread(target=publish)
    thread.start()
    # heartbeat 1 s: pika checks every 6 s, so the loss is seen within ~12 s
    thread.join(publish_timeout)
    [(result, took)] = outcome
    assert "heartbeats" in result, result  # pika's AMQPHeartbeatTimeout, passed on
    assert took < publish_timeout / 2, took
    # the link comes back on its own, through the relay's new (not silenced) connection
    wait_until(lambda: adapter.ping(timeout=1.0), 30, what="the link reconnected")
    wait_until(
        lambda: adapter.publish(_message(topic, b"<after/>"), timeout=5.0),
        30,
        what="a publish confirmed after the reconnect",
        errors=(PublishFailed,),
    )
