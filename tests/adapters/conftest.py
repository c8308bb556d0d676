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
