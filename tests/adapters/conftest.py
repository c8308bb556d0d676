"""Fixtures shared by the adapter tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Directory of an embedded middleware for one test."""
    return tmp_path / "store"


@pytest.fixture
def adapter(store: Path) -> Iterator[EmbeddedAdapter]:
    """An open embedded adapter on ``store`` (test files may define their own ``adapter``)."""
    a = EmbeddedAdapter(f"embedded://{store}")
    a.open()
    yield a
    a.close()


@pytest.fixture
def make_adapter(rabbitmq_url: str) -> Iterator[Callable[..., Any]]:
    """Open ``RabbitMQAdapter``s on the test node (another URL when given); all are closed
    at the end of the test."""
    # imported here: the embedded adapter's tests must not need pika
    from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter

    made: list[RabbitMQAdapter] = []

    def make(url: str | None = None, **options: Any) -> RabbitMQAdapter:
        adapter = RabbitMQAdapter(url or rabbitmq_url, options)
        adapter.open()
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        adapter.close()


@pytest.fixture
def native(rabbitmq_url: str) -> Iterator[Any]:
    """A plain pika BlockingChannel (publisher confirms on), as a native client uses."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    ch = conn.channel()
    ch.confirm_delivery()
    yield ch
    with contextlib.suppress(Exception):
        conn.close()


@contextlib.contextmanager
def _own_vhost(rabbitmq_url: str, rabbitmq_broker: Any) -> Iterator[str]:
    """The AMQP URL of a new vhost on the session's RabbitMQ node, deleted afterwards;
    skips when the broker is not a node this session started."""
    from urllib.parse import quote, urlsplit, urlunsplit

    from tests.fixtures.brokers import RabbitNode

    node = rabbitmq_broker.node
    if not isinstance(node, RabbitNode):
        pytest.skip(f"RabbitMQ comes from {rabbitmq_broker.source}: cannot add a vhost")
    name = node.fresh_vhost()
    try:
        yield urlunsplit(urlsplit(rabbitmq_url)._replace(path="/" + quote(name, safe="")))
    finally:
        with contextlib.suppress(Exception):  # nothing waits for the clean-up
            node.rabbitmqctl_in_background("delete_vhost", name)


@pytest.fixture
def private_vhost(rabbitmq_url: str, rabbitmq_broker: Any) -> Iterator[str]:
    """A vhost of this test's own, for tests that assert a publish reached *no* queue: in
    the shared vhost a subscription without a topic filter of another test (an e2e
    gateway of the same pytest-xdist worker, say) routes everything."""
    with _own_vhost(rabbitmq_url, rabbitmq_broker) as url:
        yield url


@pytest.fixture(scope="module")
def module_vhost(rabbitmq_url: str, rabbitmq_broker: Any) -> Iterator[str]:
    """:func:`private_vhost` for a whole module (the conformance kit's classes)."""
    with _own_vhost(rabbitmq_url, rabbitmq_broker) as url:
        yield url
