"""Asking a real RabbitMQ whether a queue exists, as tests of queue making and deleting do."""

from __future__ import annotations


def queue_exists(amqp_url: str, queue: str) -> bool:
    """Whether RabbitMQ has ``queue``: a passive declaration on a connection of its own
    (the broker closes the channel that asks for a missing one, 404)."""
    import pika  # the rabbitmq extra: imported only by tests that reach a broker
    from pika.exceptions import ChannelClosedByBroker

    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        return False
    finally:
        if conn.is_open:
            conn.close()
