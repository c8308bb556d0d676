"""A subscription session's own MQTT 5 client on the hub (adapters/mqtt/sub_client.py)
against a fake broker: a loopback socket this test writes raw packets to.  What a real
broker does is the integration tests' (test_mqtt_cluster*.py, Mosquitto); here the broker
misbehaves on purpose."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.config import parse_settings
from wsnmom.adapters.mqtt.hub import Hub
from wsnmom.adapters.mqtt.sub_client import SessionClient
from wsnmom.adapters.mqtt.sub_codec import Connack, Publish, SubAck, split
from wsnmom.core.adapter import AdapterUnavailable, CredentialsRefused

from tests.support.waiting import wait_until

CONNACK_PRESENT = b"\x20\x03\x01\x00\x00"


def _publish(topic: str, pid: int, payload: bytes, flags: int = 0x02) -> bytes:
    t = topic.encode()
    body = len(t).to_bytes(2, "big") + t + pid.to_bytes(2, "big") + b"\x00" + payload
    return bytes((0x30 | flags, len(body))) + body


class Recorder:
    """A handler that records what the client tells it."""

    def __init__(self) -> None:
        self.calls: list[list[Publish]] = []
        self.acks: list[SubAck] = []
        self.why: str | None = None
        self.ended = threading.Event()

    def connected(self, connack: Connack) -> None:
        pass

    def published(self, messages: list[Publish]) -> None:
        self.calls.append(list(messages))

    def acknowledged(self, ack: SubAck) -> None:
        self.acks.append(ack)

    def closed(self, why: str) -> None:
        self.why = why
        self.ended.set()


class FakeBroker:
    """One listening loopback socket; :meth:`accept` the client's connection, then read
    its packets and write raw bytes."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conn: socket.socket | None = None
        self._buffer = bytearray()

    def accept(self) -> None:
        self.server.settimeout(20)
        self.conn, _ = self.server.accept()
        self.conn.settimeout(20)

    def packet(self) -> tuple[int, bytes]:
        """The client's next packet (first byte, the rest after the fixed header)."""
        assert self.conn is not None
        while True:
            packets, _ = split(self._buffer)
            if packets:
                first, body = packets[0]
                del self._buffer[: 1 + len(_vbi(len(body))) + len(body)]
                return first, body
            data = self.conn.recv(65536)
            if not data:
                raise EOFError("the client closed the connection")
            self._buffer += data

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def eof(self) -> bool:
        """Whether the client closed the connection (nothing more to read)."""
        assert self.conn is not None
        return not self._buffer and self.conn.recv(65536) == b""

    def close(self) -> None:
        for s in (self.conn, self.server):
            if s is not None:
                s.close()


def _vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


@pytest.fixture
def hub() -> Iterator[Hub]:
    h = Hub("test-sub-client")
    yield h
    h.close()


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    b = FakeBroker()
    yield b
    b.close()


def _client(
    broker: FakeBroker, hub: Hub, tmp_path: Path, handler: Recorder, **options: object
) -> SessionClient:
    settings = parse_settings(
        f"mqtt://127.0.0.1:{broker.port}", {"data_dir": str(tmp_path), **options}
    )
    return SessionClient(
        settings,
        "wsnmom-s-test",
        handler,
        hub,
        persistent=True,
        receive_maximum=8,
        label="test session",
    )


def _connect(client: SessionClient, broker: FakeBroker, connack: bytes) -> threading.Thread:
    """Start ``client`` on a thread, answer its CONNECT with ``connack``."""
    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(_attempt(client)), name="start", daemon=True
    )
    thread.start()
    broker.accept()
    first, body = broker.packet()
    assert first == 0x10 and b"wsnmom-s-test" in body
    broker.send(connack)
    thread.join(20)
    thread.result = result  # type: ignore[attr-defined]
    return thread


def _attempt(client: SessionClient) -> object:
    try:
        return client.start(20)
    except Exception as exc:
        return exc


def test_a_suback_that_does_not_match_the_subscribe_closes_with_protocol_error(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    started = _connect(client, broker, CONNACK_PRESENT)
    assert started.result == [True]  # type: ignore[attr-defined]
    with client.io_lock:
        pid = client.subscribe(["a/#", "$share/g/b"], 0x21)
    client.wake()
    first, body = broker.packet()
    assert first == 0x82 and body.endswith(b"$share/g/b\x21")
    # two filters, one reason code
    broker.send(bytes((0x90, 4)) + pid.to_bytes(2, "big") + b"\x00\x01")
    wait_until(handler.ended.is_set, 20, what="the close after a SUBACK of the wrong size")
    assert handler.why is not None and "protocol violation" in handler.why
    assert broker.packet() == (0xE0, b"\x82\x00")  # DISCONNECT, Protocol Error
    assert not handler.acks


def test_the_publishes_of_one_read_reach_the_handler_in_one_call(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    broker.send(b"".join(_publish("t/x", i, b"m%d" % i) for i in range(1, 6)))
    wait_until(lambda: sum(len(c) for c in handler.calls) == 5, 20, what="five messages")
    # one read, one call (the fake broker wrote them at once; loopback keeps them together)
    assert len(handler.calls) == 1
    assert [m.payload for m in handler.calls[0]] == [b"m%d" % i for i in range(1, 6)]
    with client.io_lock:
        client.ack(3)
    client.wake()
    assert broker.packet() == (0x40, b"\x00\x03")
    client.close(session_expiry=0)
    assert broker.packet() == (0xE0, b"\x00\x05\x11\x00\x00\x00\x00")
    assert handler.why == "closed by the gateway"
    # the broker closes its side after a DISCONNECT, as Mosquitto does: the clean close
    # ends then (left open, the hub's close waited out the whole DRAIN_TIMEOUT, 5 s)
    assert broker.conn is not None
    broker.conn.close()
    assert client.await_closed(20)


def test_a_malformed_packet_closes_with_its_reason_and_the_hub_serves_on(
    broker: FakeBroker, hub: Hub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    with caplog.at_level(logging.WARNING, logger="wsnmom.adapters.mqtt"):
        broker.send(_publish("t", 1, b"x") + _publish("t", 2, b"bad", flags=0x06))  # QoS 3
        wait_until(handler.ended.is_set, 20, what="the client closing")
    assert broker.packet() == (0xE0, b"\x81\x00")  # DISCONNECT, Malformed Packet
    assert broker.eof()
    assert not handler.calls  # the read's messages count for nothing: the session resends
    lines = [r for r in caplog.records if "broke the protocol" in r.getMessage()]
    assert len(lines) == 1 and "Malformed Packet (0x81)" in lines[0].getMessage()
    # the hub's thread lives on: another session connects and receives through it
    _another_session_receives(hub, tmp_path, "a message on the second session")


def _another_session_receives(hub: Hub, tmp_path: Path, what: str) -> None:
    """The hub's thread lives on: a session with another broker connects and receives
    through it."""
    other = FakeBroker()
    try:
        handler = Recorder()
        client = _client(other, hub, tmp_path, handler)
        _connect(client, other, CONNACK_PRESENT)
        other.send(_publish("t", 1, b"after"))
        wait_until(lambda: handler.calls, 20, what=what)
        client.close()
    finally:
        other.close()


def test_a_refused_connack_raises_the_adapters_error(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler, username="u", password="p")
    started = _connect(client, broker, b"\x20\x03\x00\x86\x00")
    (error,) = started.result  # type: ignore[attr-defined]
    assert isinstance(error, CredentialsRefused)
    assert "Bad User Name or Password" in str(error)


def test_a_session_taken_over_ends_the_connection(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    broker.send(b"\xe0\x02\x8e\x00")
    wait_until(handler.ended.is_set, 20, what="the take-over")
    assert handler.why is not None and "Session taken over (0x8E)" in handler.why
    assert not client.open


def test_keep_alive_pings_and_gives_up_on_a_silent_broker(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler, keepalive=1)
    _connect(client, broker, CONNACK_PRESENT)
    assert broker.packet() == (0xC0, b"")  # PINGREQ after a second of silence
    broker.send(b"\xd0\x00")
    assert broker.packet() == (0xC0, b"")  # answered: it pings again
    wait_until(handler.ended.is_set, 20, what="giving up without a PINGRESP")
    assert handler.why is not None and "PINGRESP" in handler.why


def test_a_broker_that_never_answers_the_connect(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    with pytest.raises(AdapterUnavailable, match="did not accept a connection"):
        client.start(0.5)
    assert handler.ended.is_set()


class Failing(Recorder):
    """A handler with a bug: every message raises."""

    def published(self, messages: list[Publish]) -> None:
        raise RuntimeError("a bug in the consumer")


def test_a_failing_callback_ends_that_session_only(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    """The session is closed (its owner hears of it and reconnects: the broker sends the
    messages again) and the hub's thread serves the other sessions on."""
    handler = Failing()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    broker.send(_publish("t", 1, b"x"))
    wait_until(handler.ended.is_set, 20, what="the failing session closed")
    assert handler.why is not None and "internal error" in handler.why
    _another_session_receives(hub, tmp_path, "a message on another session")


def test_a_clean_close_hands_over_what_is_queued_and_reads_on_until_the_broker_closes(
    broker: FakeBroker, hub: Hub, tmp_path: Path
) -> None:
    """The PUBACKs queued before the close, then DISCONNECT, then the end of the
    client's sending side; the client reads on (what the broker still sends is dropped,
    never handed out) and closes its socket once the broker closed its side.  Closing at
    once made the broker's next data answer with a TCP reset, which lost the PUBACKs the
    broker had not read yet (test_mqtt_cluster_stop_acks.py, with Mosquitto)."""
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    broker.send(b"".join(_publish("t/x", i, b"m%d" % i) for i in range(1, 4)))
    wait_until(lambda: sum(len(c) for c in handler.calls) == 3, 20, what="three messages")
    with client.io_lock:
        for pid in (1, 2, 3):
            client.ack(pid)  # queued, not written: the close hands them over
        client.close()
    assert handler.why == "closed by the gateway" and not client.open
    # the broker goes on sending (its backlog): the client still reads
    broker.send(b"".join(_publish("t/x", i, b"late%d" % i) for i in range(4, 200)))
    assert [broker.packet() for _ in range(3)] == [(0x40, b"\x00" + bytes((i,))) for i in (1, 2, 3)]
    assert broker.packet() == (0xE0, b"")  # DISCONNECT, normal
    assert broker.eof()  # the client's sending side is shut down
    broker.send(_publish("t/x", 200, b"later"))  # still read: no reset
    assert broker.conn is not None
    broker.conn.close()
    assert client.await_closed(20)
    assert sum(len(c) for c in handler.calls) == 3  # nothing after the close handed out


def test_a_clean_close_on_a_broker_that_never_closes_ends_by_the_deadline(
    broker: FakeBroker, hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close never hangs on a silent broker: the socket is closed after at most
    ``DRAIN_TIMEOUT`` (here 0.2 s), and a new connection of the client id waits no
    longer than that."""
    monkeypatch.setattr("wsnmom.adapters.mqtt.sub_client.DRAIN_TIMEOUT", 0.2)
    handler = Recorder()
    client = _client(broker, hub, tmp_path, handler)
    _connect(client, broker, CONNACK_PRESENT)
    client.close()  # returns at once: the hub hands over, the broker reads nothing yet
    assert client.await_closed(20)
    assert broker.packet() == (0xE0, b"")
    assert broker.eof()
