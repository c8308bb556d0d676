"""The adapter conformance kit against a real RabbitMQ node (see tests/fixtures/brokers.py
for how the node is found or started)."""

from __future__ import annotations

import pytest

from wsnmom.testing.conformance import (
    AckSemantics,
    AdapterBasics,
    AdapterConformance,
    Delete,
    DroppedToDeadLetters,
    Durability,
    HeadersAndBodies,
    Peek,
    PullSemantics,
    QueueLimitsSemantics,
    TopicRouting,
)

pytestmark = pytest.mark.rabbitmq


class TestRabbitMQConformance(AdapterConformance):
    """Every conformance group; each test uses its own namespace (so its own exchange)."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, module_vhost: str) -> str:
        # a vhost of the module's own: the kit asserts that a publish without a subscriber
        # reaches no queue, which a topic-less subscription elsewhere in "/" would break
        return module_vhost


class TestRabbitMQGetConformance(
    AdapterBasics,
    TopicRouting,
    AckSemantics,
    PullSemantics,
    Durability,
    QueueLimitsSemantics,
    DroppedToDeadLetters,
    Delete,
    HeadersAndBodies,
    Peek,
):
    """The kit again with ``pull = "get"``: pull points read with ``basic.get`` per
    GetMessages (``native_pull``), so the kit's pull checks (and every group that reads
    what it checks with ``receive``, ``barrier`` or ``take``) run against the adapter's own
    ``pull`` and ``take``.  Left out: ``PauseResume`` (push deliveries only) and
    ``CurrentMessage`` (no subscription), which ``pull`` does not change (it only sets
    ``native_pull``); the class above runs them."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, module_vhost: str) -> str:
        return module_vhost + ("&" if "?" in module_vhost else "?") + "pull=get"
