"""The RabbitMQ benchmark's namespaces (``bench/middleware.py``): the raw references run in
a vhost made before the gateway steps (no broker administration after them), and a
gateway's vhost is deleted, queues and all, when the gateway stops."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pika")

import pika
import pika.exceptions

from bench.middleware import RabbitMQ
from tests.fixtures.brokers import RabbitNode

pytestmark = pytest.mark.rabbitmq


def _bench_on(node: RabbitNode) -> RabbitMQ:
    mw = RabbitMQ()
    mw.node = node
    mw.address = node.url
    return mw


def test_a_released_gateway_vhost_is_gone_with_its_queues(
    rabbitmq_node: RabbitNode, tmp_path: Path
) -> None:
    mw = _bench_on(rabbitmq_node)
    url = mw.adapter_url(tmp_path)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare("left-behind", durable=True)
    conn.close()

    mw.release(url)

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(url)).close()


def test_raw_references_use_the_prepared_vhost_and_survive_release(
    rabbitmq_node: RabbitNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mw = _bench_on(rabbitmq_node)
    mw.prepare_raw(tmp_path)
    assert mw.raw_url is not None
    mw.release(mw.raw_url)  # not a gateway's: kept

    def no_new_vhost(workdir: Path) -> str:
        raise AssertionError("a raw reference administered the broker after the gateways")

    monkeypatch.setattr(mw, "adapter_url", no_new_vhost)
    pull = mw.raw_pull_fanout(3, tmp_path)
    serial = mw.raw_fanout(3, tmp_path)
    assert pull is not None and pull > 0
    assert serial is not None and serial > 0
