"""``NotificationConsumer`` driven with raw HTTP posts: wrapped and raw Notify, both SOAP
versions, refusals, the iterator, the callback form."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from wsnmom.client import NotificationConsumer, WsnFault
from wsnmom.client.errors import fault_from_envelope

SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSA = "http://www.w3.org/2005/08/addressing"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"


def _envelope(body: str, ns: str = SOAP12, header: str = "") -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns}" xmlns:wsnt="{WSNT}" xmlns:wsa="{WSA}">'
        f"<s:Header>{header}</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def _message(topic: str, payload: str) -> str:
    return (
        f'<wsnt:NotificationMessage><wsnt:Topic xmlns:t="urn:t" Dialect="{SIMPLE}">{topic}'
        "</wsnt:Topic><wsnt:ProducerReference><wsa:Address>http://p/</wsa:Address>"
        f"</wsnt:ProducerReference><wsnt:Message>{payload}</wsnt:Message>"
        "</wsnt:NotificationMessage>"
    )


def _post(url: str, data: bytes, ctype: str = "application/soap+xml") -> requests.Response:
    return requests.post(url, data=data, headers={"Content-Type": ctype}, timeout=5)


def test_wrapped_notify_both_versions() -> None:
    with NotificationConsumer() as consumer:
        assert consumer.address == f"http://127.0.0.1:{consumer.port}/consumer"
        body = f"<wsnt:Notify>{_message('t:a', '<a>1</a>')}{_message('t:b', '<b/>')}</wsnt:Notify>"
        resp = _post(consumer.address, _envelope(body))
        assert resp.status_code == 202 and resp.content == b""
        soap11 = _envelope(f"<wsnt:Notify>{_message('t:c', '<c/>')}</wsnt:Notify>", SOAP11)
        assert _post(consumer.address + "/other", soap11, "text/xml").status_code == 202
        a, b, c = consumer.wait_for(3, timeout=5)
        assert a.payload.text == "1" and a.topic is not None and str(a.topic) == "{urn:t}a"
        assert a.producer_reference is not None and a.producer_reference.address == "http://p/"
        assert (b.payload.tag, c.payload.tag) == ("b", "c")
        assert c.path == "/consumer/other"
        assert consumer.received == 3


def test_raw_delivery_and_headers() -> None:
    with NotificationConsumer(path="inbox") as consumer:
        assert consumer.address.endswith("/inbox")
        data = _envelope(
            '<r:alarm xmlns:r="urn:r" level="2"/>',
            header='<k:Key xmlns:k="urn:k" wsa:IsReferenceParameter="true">7</k:Key>'
            "<wsa:Action>urn:any</wsa:Action>",
        )
        assert _post(consumer.address, data).status_code == 202
        got = consumer.get(timeout=5)
        assert got.raw and got.topic is None
        assert got.payload.tag == "{urn:r}alarm" and got.payload.get("level") == "2"
        assert [(h.tag, h.text) for h in got.headers] == [("{urn:k}Key", "7")]


def test_refusals() -> None:
    with NotificationConsumer() as consumer:
        assert requests.get(consumer.address, timeout=5).status_code == 405
        assert _post(consumer.address, b"<a/>", "application/json").status_code == 415
        assert _post(consumer.address, b"<not-closed").status_code == 400
        assert _post(consumer.address, b"<a/>").status_code == 400  # not an envelope
        empty = _post(consumer.address, _envelope("<wsnt:Notify/>"))
        assert empty.status_code == 500
        fault = fault_from_envelope(empty.content, 500)
        assert isinstance(fault, WsnFault) and "NotificationMessage" in fault.description
        no_message = "<wsnt:Notify><wsnt:NotificationMessage/></wsnt:Notify>"
        assert _post(consumer.address, _envelope(no_message)).status_code == 500
        assert consumer.received == 0 and consumer.drain() == []


def test_oversized_request_is_refused() -> None:
    with (
        NotificationConsumer() as consumer,
        socket.create_connection(("127.0.0.1", consumer.port), timeout=5) as sock,
    ):
        sock.sendall(
            b"POST /consumer HTTP/1.1\r\nHost: x\r\nContent-Type: application/soap+xml\r\n"
            b"Content-Length: 999999999\r\n\r\n"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 413 ")


def test_iterator_stops_after_quiet_or_count() -> None:
    with NotificationConsumer() as consumer:
        started = time.monotonic()
        assert list(consumer.notifications(timeout=0.3)) == []
        assert 0.25 < time.monotonic() - started < 3

        def send() -> None:
            for i in range(3):
                body = f"<wsnt:Notify>{_message('t:a', f'<n>{i}</n>')}</wsnt:Notify>"
                _post(consumer.address, _envelope(body))

        threading.Thread(target=send).start()
        got = [n.payload.text for n in consumer.notifications(timeout=5, count=2)]
        assert got == ["0", "1"]
        assert consumer.get(timeout=5).payload.text == "2"
        with pytest.raises(TimeoutError):
            consumer.get(timeout=0.1)
        with pytest.raises(TimeoutError, match="0 of 1"):
            consumer.wait_for(1, timeout=0.2)


def test_callback_form() -> None:
    seen: list[str] = []
    done = threading.Event()

    def on_notification(n: object) -> None:
        seen.append(n.payload.tag)
        if len(seen) == 2:
            done.set()
        raise RuntimeError("a failing callback still acknowledges")

    with NotificationConsumer(on_notification=on_notification) as consumer:
        body = f"<wsnt:Notify>{_message('t:a', '<x/>')}{_message('t:a', '<y/>')}</wsnt:Notify>"
        assert _post(consumer.address, _envelope(body)).status_code == 202
        assert done.wait(5)
        assert seen == ["x", "y"]
        assert consumer.drain() == []


def test_advertised_address_and_ipv6() -> None:
    with NotificationConsumer(advertised_address="http://gateway.example/c") as consumer:
        assert consumer.address == "http://gateway.example/c"
    try:
        consumer6 = NotificationConsumer("::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    with consumer6:
        assert consumer6.address == f"http://[::1]:{consumer6.port}/consumer"
        body = f"<wsnt:Notify>{_message('t:a', '<six/>')}</wsnt:Notify>"
        assert _post(consumer6.address, _envelope(body)).status_code == 202
        assert consumer6.get(timeout=5).payload.tag == "six"


def test_close_ends_the_keep_alive_connections_it_serves() -> None:
    """A broker keeps its delivery connection open between Notifies; closing the consumer
    ends it (before, its socket and request thread stayed until the broker closed it)."""
    consumer = NotificationConsumer()
    conn = socket.create_connection((consumer.host, consumer.port), timeout=10)
    try:
        conn.sendall(b"GET /consumer HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"here\n"):
            chunk = conn.recv(4096)
            assert chunk, "the consumer closed the connection before answering"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 405")  # answered, and kept open (HTTP/1.1)
        consumer.close()
        assert conn.recv(4096) == b""  # the end of the connection, within the timeout
    finally:
        conn.close()
        consumer.close()
