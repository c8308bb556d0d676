"""SoapClient against a recording HTTP endpoint: wrapped and raw Notify, WS-A headers,
failures, the outbound policy at send time (and connecting to the address it checked)
and the demand-based control calls."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Any

import pytest
from wsnmom.core.config import OutboundSettings
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    SoapVersion,
)
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ports import DeliveryFailed
from wsnmom.soap_frontend.client import SoapClient, combine_topics, retry_after_seconds
from wsnmom.topic_mapping.model import Topic

from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, WSNT
from tests.support.wsn_schemas import assert_body_valid

PARAM = b'<k:Key xmlns:k="urn:k">7</k:Key>'


def _deliveries(n: int = 2) -> list[Delivered]:
    ref = EndpointReference("http://b/wsn/subscriptions/s1")
    return [
        Delivered(
            NotificationMessage(
                f"m{i}", f'<p:v xmlns:p="urn:p">{i}</p:v>'.encode(), Topic("urn:t", ("a",))
            ),
            "s1",
            ref,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("version", list(SoapVersion))
def test_wrapped_notify(consumer: ConsumerServer, version: SoapVersion) -> None:
    client = SoapClient()
    target = EndpointReference(consumer.address("/c"), (PARAM,))
    client.notify(target, version, _deliveries(3), use_raw=False, timeout=5)
    (rec,) = consumer.notifies()
    assert_body_valid(rec.body)
    env = rec.envelope
    expected = (
        "http://www.w3.org/2003/05/soap-envelope"
        if version is SoapVersion.SOAP12
        else "http://schemas.xmlsoap.org/soap/envelope/"
    )
    assert env.tag == f"{{{expected}}}Envelope"
    assert len(rec.body_child.findall(f"{{{WSNT}}}NotificationMessage")) == 3
    assert rec.header(f"{{{NS['wsa']}}}To")[0].text == consumer.address("/c")
    assert rec.header(f"{{{NS['wsa']}}}Action")[0].text.endswith("NotificationConsumer/Notify")  # type: ignore[union-attr]
    key = rec.header("{urn:k}Key")[0]
    assert key.text == "7" and key.get(f"{{{NS['wsa']}}}IsReferenceParameter") == "true"


def test_raw_notify_one_request_per_message(consumer: ConsumerServer) -> None:
    SoapClient().notify(
        EndpointReference(consumer.address()),
        SoapVersion.SOAP11,
        _deliveries(2),
        use_raw=True,
        timeout=5,
    )
    recs = consumer.notifies()
    assert [r.body_child.tag for r in recs] == ["{urn:p}v", "{urn:p}v"]
    assert [r.body_child.text for r in recs] == ["0", "1"]


def test_failures_raise_delivery_failed(consumer: ConsumerServer) -> None:
    client = SoapClient()
    target = EndpointReference(consumer.address())
    consumer.mode = "error"
    with pytest.raises(DeliveryFailed) as info:
        client.notify(target, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=5)
    assert not info.value.permanent  # a Receiver fault may go away
    assert info.value.answered and not info.value.timed_out
    consumer.mode = "drop"
    with pytest.raises(DeliveryFailed) as info:
        client.notify(target, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=5)
    assert not info.value.answered and not info.value.timed_out
    closed = EndpointReference(f"http://127.0.0.1:{_closed_port()}/x")
    with pytest.raises(DeliveryFailed) as info:
        client.notify(closed, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=2)
    assert not info.value.answered and not info.value.timed_out  # refused at once
    with socket.socket() as tarpit:  # connects (listen backlog), never answers
        tarpit.bind(("127.0.0.1", 0))
        tarpit.listen(4)
        silent = EndpointReference(f"http://127.0.0.1:{tarpit.getsockname()[1]}/x")
        with pytest.raises(DeliveryFailed) as info:
            client.notify(silent, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=0.3)
    assert info.value.timed_out and not info.value.answered


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REFUSED = [
    (OutboundSettings(), "http://169.254.169.254/latest/meta-data"),
    (OutboundSettings(), "http://[::ffff:169.254.169.254]/latest/meta-data"),
    (OutboundSettings(), "http://2852039166/"),
    (OutboundSettings(), "ftp://127.0.0.1/x"),
    (OutboundSettings(allow_loopback=False), "http://127.0.0.1:{port}/x"),
    (OutboundSettings(allow_loopback=False), "http://[::ffff:127.0.0.1]:{port}/x"),
    (OutboundSettings(allow_loopback=False), "http://0x7f000001:{port}/x"),
    (OutboundSettings(allow_loopback=False), "http://127.1:{port}/x"),
    (OutboundSettings(allow_loopback=False), "http://rebound.test:{port}/x"),
    (OutboundSettings(deny=["10.0.0.0/8"]), "http://10.1.2.3/x"),
    (OutboundSettings(deny=["*.internal"]), "http://db.internal/x"),
    (OutboundSettings(allow=["192.0.2.0/24"]), "http://127.0.0.1:{port}/x"),
    (OutboundSettings(), "http://[fe80::1]/x"),
    (OutboundSettings(), "http://[::1"),
]


def test_refused_addresses_get_no_traffic(consumer: ConsumerServer) -> None:
    """Every call checks its address with core's policy first: a refusal is a permanent
    DeliveryFailed and nothing reaches the (loopback) consumer."""
    for settings, url in REFUSED:
        policy = OutboundPolicy(settings, resolver=lambda host, port: ["127.0.0.1"])
        client = SoapClient(policy=policy)
        target = EndpointReference(url.format(port=consumer.port))
        with pytest.raises(DeliveryFailed, match="refused: ") as info:
            client.notify(target, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=2)
        assert info.value.permanent, url
        with pytest.raises(DeliveryFailed, match="refused: "):
            client.subscribe(target, EndpointReference("http://b/wsn/broker"), [], timeout=2)
        with pytest.raises(DeliveryFailed, match="refused: "):
            client.pause(target, timeout=2)
    assert consumer.notifies() == [] and consumer.control == []


def test_an_unresolvable_name_is_a_temporary_failure() -> None:
    def down(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    client = SoapClient(policy=OutboundPolicy(resolver=down))
    with pytest.raises(DeliveryFailed) as info:
        client.notify(
            EndpointReference("http://consumer.test/c"),
            SoapVersion.SOAP12,
            _deliveries(1),
            use_raw=False,
            timeout=2,
        )
    assert not info.value.permanent


def test_a_name_is_reached_at_the_address_the_policy_checked(
    consumer: ConsumerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No second lookup: the connection goes to the checked address (the resolver's
    answer), never to what the system resolver says about the name; the name stays in
    the Host header and wsa:To."""
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def recording(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(str(host))
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    resolver_calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        resolver_calls.append(host)
        return ["127.0.0.1"]

    client = SoapClient(policy=OutboundPolicy(resolver=resolver))
    address = f"http://Consumer.Test:{consumer.port}/c?k=1"
    for _ in range(2):
        client.notify(
            EndpointReference(address), SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=5
        )
    recs = consumer.notifies()
    assert [r.path for r in recs] == ["/c?k=1", "/c?k=1"]
    assert {r.headers["Host"] for r in recs} == {f"consumer.test:{consumer.port}"}
    assert recs[0].header(f"{{{NS['wsa']}}}To")[0].text == address
    assert resolver_calls == ["consumer.test"]  # checked once, then reused
    assert not [h for h in looked_up if "consumer" in h.lower()]


def test_demand_control_calls(consumer: ConsumerServer) -> None:
    client = SoapClient()
    topics = [
        ExpressionSource(None, "t:a", {"t": "urn:t"}),
        ExpressionSource(
            "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple", "t:b", {"t": "urn:t"}
        ),
    ]
    ref = client.subscribe(
        EndpointReference(consumer.address("/producer")),
        EndpointReference("http://broker/wsn/broker"),
        topics,
        timeout=5,
    )
    assert ref.address.startswith(consumer.url + "/publisher-subscriptions/")
    client.pause(ref, timeout=5)
    client.resume(ref, timeout=5)
    client.unsubscribe(ref, timeout=5)
    assert [op for op, _ in consumer.control] == [
        "Subscribe",
        "PauseSubscription",
        "ResumeSubscription",
        "Unsubscribe",
    ]


def test_combine_topics() -> None:
    (one,) = combine_topics(
        [
            ExpressionSource(None, "t:a", {"t": "urn:t"}),
            ExpressionSource(None, "t:b/c", {"t": "urn:t"}),
        ]
    )
    assert one.text == "t:a | t:b/c" and one.dialect.endswith("/Full")  # type: ignore[union-attr]
    clash = combine_topics(
        [
            ExpressionSource(None, "t:a", {"t": "urn:1"}),
            ExpressionSource(None, "t:b", {"t": "urn:2"}),
        ]
    )
    assert len(clash) == 2


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [(503, "7", 7.0), (429, "2", 2.0), (500, "7", None), (503, None, None), (503, "soon", None)],
    ids=["503", "429", "500-not-read", "none", "unreadable"],
)
def test_a_failed_answer_carries_its_status_and_retry_after(
    consumer: ConsumerServer, status: int, header: str | None, expected: float | None
) -> None:
    consumer.mode, consumer.error_status, consumer.retry_after = "error", status, header
    with pytest.raises(DeliveryFailed) as caught:
        SoapClient().notify(
            EndpointReference(consumer.address("/c")),
            SoapVersion.SOAP12,
            _deliveries(1),
            use_raw=False,
            timeout=5,
        )
    assert (caught.value.status, caught.value.retry_after) == (status, expected)
    assert caught.value.answered


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("Sat, 05 Dec 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("Sat, 05 Dec 2026 11:59:00 GMT", now) == 0.0  # past: now
    assert retry_after_seconds(" 12 ", now) == 12.0
    assert retry_after_seconds("-3", now) is None and retry_after_seconds(None) is None
