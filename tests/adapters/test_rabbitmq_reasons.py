"""Why RabbitMQ is unreachable, in words (``errors.reason``, ``errors.outage``): the errors
pika reports for each cause, as pika builds them (the nested connection-workflow wrappers
of a refused connection included), become the sentence core's 503 and ``/readyz`` show.
The same causes on a real node: tests/e2e/test_middleware_outage.py."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorSocketConnectError,
    AMQPConnectorStackTimeout,
)
from wsnmom.adapters.rabbitmq._link import Link
from wsnmom.adapters.rabbitmq.errors import outage, reason

pytestmark = pytest.mark.rabbitmq

WHERE = "amqp://127.0.0.1:5672/%2F"
LOGIN = (
    "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - Login was refused using "
    "authentication mechanism PLAIN. For details see the broker logfile.'"
)


def refused_connection() -> BaseException:
    """What a connection attempt to a port nothing listens on reports."""
    socket_error = AMQPConnectorSocketConnectError(ConnectionRefusedError(111, "Connect failed"))
    return pika.exceptions.AMQPConnectionError(AMQPConnectionWorkflowFailed([socket_error]))


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (refused_connection(), f"cannot connect to RabbitMQ at {WHERE}: connection refused"),
        (
            pika.exceptions.ProbableAuthenticationError(LOGIN),
            f"RabbitMQ at {WHERE} refused the gateway's credentials: (403) 'ACCESS_REFUSED - "
            "Login was refused using authentication mechanism PLAIN. For details see the "
            "broker logfile.'",
        ),
        (
            pika.exceptions.ConnectionClosedByBroker(530, "NOT_ALLOWED - vhost v not found"),
            f"RabbitMQ at {WHERE} refused access to the vhost: (530) NOT_ALLOWED - vhost v "
            "not found",
        ),
        (
            pika.exceptions.ConnectionClosedByBroker(
                320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
            ),
            f"RabbitMQ at {WHERE} closed the connection: (320) CONNECTION_FORCED - broker "
            "forced connection closure with reason 'shutdown'",
        ),
        (
            pika.exceptions.AMQPHeartbeatTimeout(
                "No activity or too many missed heartbeats in the last 3 seconds"
            ),
            f"heartbeat missed: RabbitMQ at {WHERE} sent nothing in time (No activity or too "
            "many missed heartbeats in the last 3 seconds)",
        ),
        (
            pika.exceptions.StreamLostError(
                "Stream connection lost: ConnectionResetError(104, 'Connection reset by peer')"
            ),
            f"the connection to RabbitMQ at {WHERE} was lost: Stream connection lost: "
            "ConnectionResetError(104, 'Connection reset by peer')",
        ),
        (
            pika.exceptions.AMQPConnectionError(
                AMQPConnectionWorkflowFailed([AMQPConnectorStackTimeout("timed out")])
            ),
            f"cannot connect to RabbitMQ at {WHERE}: no answer in time",
        ),
        (None, f"not connected to RabbitMQ at {WHERE} yet"),
    ],
    ids=["refused", "login", "vhost", "closed", "heartbeat", "lost", "timeout", "none"],
)
def test_each_cause_in_words(error: BaseException | None, said: str) -> None:
    assert reason(error, WHERE) == said


@pytest.fixture
def links() -> Iterator[list[Link]]:
    made = [
        Link(name, pika.URLParameters(WHERE), _connected, _lost)
        for name in ("publisher", "consumer")
    ]
    yield made
    for link in made:
        link.loop.close()


async def _connected(link: Link) -> None:
    return None


def _lost(link: Link, error: BaseException | None) -> None:
    return None


def test_outage_says_what_the_last_attempt_met_and_why_the_connection_was_lost(
    links: list[Link],
) -> None:
    publisher, consumer = links
    closed = pika.exceptions.ConnectionClosedByBroker(320, "CONNECTION_FORCED - shutdown")
    publisher.last_error = publisher.lost_reason = closed
    consumer.last_error = consumer.lost_reason = closed
    assert outage(links, WHERE) == (
        f"RabbitMQ at {WHERE} closed the connection: (320) CONNECTION_FORCED - shutdown"
    )
    publisher.last_error = refused_connection()
    assert outage(links, WHERE) == (
        f"cannot connect to RabbitMQ at {WHERE}: connection refused (before that, RabbitMQ "
        "closed the connection: (320) CONNECTION_FORCED - shutdown)"
    )
    # a link that never connected: only what its attempts met
    consumer.lost_reason = None
    assert outage([consumer], WHERE) == (
        f"RabbitMQ at {WHERE} closed the connection: (320) CONNECTION_FORCED - shutdown"
    )
