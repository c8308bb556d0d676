"""``wsnmom spark-tap``: declares the RabbitMQ tap a ``wsn_rabbitmq`` source reads."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.spark_bridge.conftest import unique_namespace
from wsnmom.cli import cli


@pytest.mark.rabbitmq
def test_spark_tap_declares_a_stream_queue_bound_like_a_subscription(rabbitmq_url: str) -> None:
    import pika
    from wsnmom.adapters.rabbitmq.names import RabbitMQNames

    ns = unique_namespace()
    args = ["spark-tap", "--rabbitmq", rabbitmq_url, "--topic", "p:a/*", "-n", f"p={ns}"]
    result = CliRunner().invoke(cli, [*args, "--queue", "tap.test", "--max-age", "1h"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "tap.test"
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.confirm_delivery()
    exchange = RabbitMQNames({}).exchange_for(ns)
    channel.basic_publish(exchange, "a.b", b"<x/>", mandatory=True)  # routed: no error
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish(exchange, "c.d", b"<x/>", mandatory=True)
    # a stream queue: declaring it again as a classic one is refused
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        connection.channel().queue_declare("tap.test", durable=True)
    connection.close()
    refused = CliRunner().invoke(cli, [*args[:-2], "-n", "q=urn:x"])
    assert refused.exit_code == 2 and "InvalidTopicExpression" in refused.output
