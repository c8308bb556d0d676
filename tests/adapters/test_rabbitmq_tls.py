"""RabbitMQ over TLS (``amqps://`` with ``tls.ca_file``): the adapter's connection runs
TLS through asyncio's transport (``adapters/rabbitmq/_fast.py``), with the channels
reading their confirms, returns and deliveries themselves as in plaintext.

The test node speaks plain AMQP, so a TLS-terminating relay on loopback (a ``trustme``
certificate for 127.0.0.1) stands in front of it.  The adapter publishes with confirms,
a consumer gets the messages in order, ``basic.get`` pulls one, and a publish to a topic
nobody subscribed comes back unrouted (a Basic.Return read over TLS).  A relay whose
certificate the adapter does not trust is refused.
"""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pika")
trustme = pytest.importorskip("trustme")

from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter  # noqa: E402
from wsnmom.core.adapter import (  # noqa: E402
    AdapterUnavailable,
    OutboundMessage,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic  # noqa: E402

from tests.support.loopback_relay import (  # noqa: E402
    LoopbackRelay,
    relayed_url,
    upstream_of,
)
from tests.support.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.rabbitmq


class TlsRelay(LoopbackRelay):
    """Accepts TLS on a loopback port and relays the plaintext to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], context: ssl.SSLContext) -> None:
        self.context = context
        super().__init__(upstream)

    def client_side(self, raw: socket.socket) -> socket.socket | None:
        try:
            return self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return None


@pytest.fixture
def certs(tmp_path: Path) -> tuple[str, ssl.SSLContext]:
    """The CA file a client trusts and the relay's server context."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    return str(ca_file), server


@pytest.fixture
def relay(rabbitmq_url: str, certs: tuple[str, ssl.SSLContext]) -> Iterator[TlsRelay]:
    r = TlsRelay(upstream_of(rabbitmq_url, 5672), certs[1])
    yield r
    r.close()


def _message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex, headers={})


def test_publish_consume_and_pull_over_tls(
    relay: TlsRelay,
    make_adapter: Callable[..., RabbitMQAdapter],
    private_vhost: str,
    certs: tuple[str, ssl.SSLContext],
) -> None:
    ns = f"urn:test:rabbit-tls:{uuid.uuid4().hex}"
    # a vhost of its own: the unrouted publish below must meet no catch-all subscription of
    # another test in the shared vhost
    adapter = make_adapter(
        relayed_url(private_vhost, relay.port, "amqps"), tls={"ca_file": certs[0]}
    )
    topic = Topic(ns, ("t",))
    consumed = adapter.subscription(
        SubscriptionSpec("c-" + uuid.uuid4().hex[:8], (PathPattern(ns, ("t",)),))
    )
    pulled = adapter.subscription(
        SubscriptionSpec("p-" + uuid.uuid4().hex[:8], (PathPattern(ns, ("t",)),))
    )
    bodies = [b"<m>%d</m>" % i for i in range(50)] + [b"<big>" + b"x" * 400_000 + b"</big>"]
    receipts = adapter.publish_many([_message(topic, b) for b in bodies])
    assert all(r.routed for r in receipts)  # confirmed, read over TLS
    got: list[Any] = []
    consumed.start(got.append)
    wait_until(lambda: len(got) >= len(bodies), 20, what="every message consumed over TLS")
    assert [m.body for m in got] == bodies
    for m in got:
        m.ack()
    first = wait_until(lambda: pulled.pull(1, timeout=0.5), 20, what="a pulled message")
    assert first[0].body == bodies[0]
    first[0].ack()
    unrouted = adapter.publish(_message(Topic(ns, ("nobody", "n" + uuid.uuid4().hex)), b"<x/>"))
    assert not unrouted.routed  # a Basic.Return, read over TLS
    consumed.delete()
    pulled.delete()


def test_an_untrusted_certificate_is_refused(
    rabbitmq_url: str, relay: TlsRelay, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    adapter = RabbitMQAdapter(
        relayed_url(rabbitmq_url, relay.port, "amqps"),
        {"tls": {"ca_file": str(other)}, "operation_timeout": 3},
    )
    try:
        with pytest.raises(AdapterUnavailable):
            adapter.open()
        assert not adapter.available()
    finally:
        adapter.close()
