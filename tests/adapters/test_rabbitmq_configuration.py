"""The RabbitMQ adapter's configuration: option parsing, URL handling, the queue arguments
its limits map to, its native names, its plugin's schemes, and an open that fails cleanly
(no broker, or one refusing the credentials or the vhost).  What the adapter does against a
running node is test_rabbitmq.py and its neighbours.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from wsnmom.adapters.rabbitmq.adapter import (
    RabbitMQAdapter,
    RabbitMQOptions,
)
from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
    OutboundMessage,
    Overflow,
    PublishFailed,
    QueueLimits,
)
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Topic
from wsnmom.topic_mapping.translate import fallback_namespace

pytestmark = pytest.mark.rabbitmq


class TestConfiguration:
    """Option parsing, URL handling and argument mapping (no broker needed)."""

    def test_queue_arguments_for_limits(self) -> None:
        a = RabbitMQAdapter("amqp://guest:guest@localhost/%2F")
        assert a.queue_arguments(QueueLimits()) == {"x-queue-type": "classic"}
        args = a.queue_arguments(
            QueueLimits(
                max_messages=10,
                max_bytes=2048,
                overflow=Overflow.DROP_NEWEST,
                max_age=timedelta(seconds=1.5),
            )
        )
        assert args == {
            "x-queue-type": "classic",
            "x-max-length": 10,
            "x-max-length-bytes": 2048,
            "x-overflow": "reject-publish",
            "x-message-ttl": 1500,
        }
        assert a.queue_arguments(QueueLimits(max_messages=1))["x-overflow"] == "drop-head"
        # a dead-letter destination: RabbitMQ sends what it drops there, refusals included
        dl = a.queue_arguments(
            QueueLimits(max_messages=1, overflow=Overflow.DROP_NEWEST), ("dl.x", "orders")
        )
        assert dl["x-dead-letter-exchange"] == "dl.x"
        assert dl["x-dead-letter-routing-key"] == "orders"
        assert dl["x-overflow"] == "reject-publish-dlx"

    def test_options_from_url_query_and_mapping(self) -> None:
        a = RabbitMQAdapter(
            "rabbitmq://u:p@broker:5673/vh?prefetch=7&queue_type=quorum&heartbeat=11",
            {"exchanges": {"urn:x": "x.events"}, "queue_arguments": {"x-delivery-limit": 5}},
        )
        assert a.opts.prefetch == 7
        assert a.opts.queue_type == "quorum"
        assert a.parameters.host == "broker"
        assert a.parameters.port == 5673
        assert a.parameters.virtual_host == "vh"
        assert a.parameters.heartbeat == 11
        assert a.parameters.ssl_options is None
        assert a.queue_arguments(QueueLimits())["x-delivery-limit"] == 5
        assert a.exchange_for("urn:x") == "x.events"

    def test_amqps_uses_tls(self) -> None:
        a = RabbitMQAdapter("amqps://u:p@broker.example/%2F")
        assert a.parameters.ssl_options is not None
        assert a.parameters.port == 5671
        assert a.parameters.ssl_options.server_hostname == "broker.example"
        b = RabbitMQAdapter("amqp://u:p@h/%2F", {"tls": {"verify": False}})
        assert b.parameters.ssl_options is not None

    def test_bad_options(self) -> None:
        with pytest.raises(ValueError, match="unknown"):
            RabbitMQOptions.parse({"prefetchh": 3})
        with pytest.raises(ValueError, match="queue_type"):
            RabbitMQOptions.parse({"queue_type": "stream"})

    def test_names(self) -> None:
        a = RabbitMQAdapter("amqp://localhost", {"exchanges": {"urn:x": "x.ex"}})
        # '.' inside a segment is escaped, so it never splits a routing key word
        assert a.native_name(Topic("urn:x", ("stock.IBM", "price"))) == (
            "x.ex",
            "stock_x002E_IBM.price",
        )
        assert a.bindings_for((PathPattern("urn:x", ("a", ANY, DEEP)),)) == [("x.ex", "a.*.#")]
        assert a.bindings_for(None) == [("wsnmom.all", "#")]
        # a native routing key word that is not an NCName comes back escaped
        assert a.topic_of("x.ex", "2024.a b", {}) == Topic("urn:x", ("_x0032_024", "a_x0020_b"))
        assert a.topic_of("orders", "eu.new", {}) == Topic(
            fallback_namespace("orders"), ("eu", "new")
        )

    def test_plugin_registers_schemes(self) -> None:
        from wsnmom.adapters.rabbitmq import plugin
        from wsnmom.core.plugins import AdapterRegistry

        registry = AdapterRegistry()
        plugin.wsnmom_register_adapters(registry)
        assert set(registry.schemes()) == {"amqp", "amqps", "rabbitmq"}
        assert registry.load("amqps") is RabbitMQAdapter

    def test_open_fails_cleanly_without_broker(self) -> None:
        from tests.fixtures.brokers import free_port

        a = RabbitMQAdapter(
            f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F", {"operation_timeout": 1}
        )
        try:
            with pytest.raises(AdapterUnavailable):
                a.open()
            assert a.ping() is False
            assert a.available() is False
            with pytest.raises(PublishFailed):  # within its timeout (default 10 s)
                a.publish(OutboundMessage(Topic("urn:x", ("a",)), b"<x/>", "m1"), timeout=1.0)
        finally:
            a.close()

    @pytest.mark.parametrize(
        "change", [("guest:guest@", "guest:wrong@"), ("/%2F", "/no-such-vhost")]
    )
    def test_refused_credentials_and_vhost_are_not_retried(
        self, rabbitmq_url: str, change: tuple[str, str]
    ) -> None:
        url = rabbitmq_url.replace(*change)
        assert url != rabbitmq_url
        a = RabbitMQAdapter(url, {"operation_timeout": 10})
        started = time.monotonic()
        with pytest.raises(AdapterError) as raised:
            a.open()
        assert not isinstance(raised.value, AdapterUnavailable)
        assert "refused" in str(raised.value)
        assert time.monotonic() - started < 8  # not a timeout: refused at once
        assert a.available() is False
