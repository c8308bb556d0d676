"""The adapter conformance kit against a real RabbitMQ node (see tests/fixtures/brokers.py
for how the node is found or started)."""

from __future__ import annotations

import pytest

from wsnmom.testing.conformance import AdapterConformance

pytestmark = pytest.mark.rabbitmq


class TestRabbitMQConformance(AdapterConformance):
    """Every conformance group; each test uses its own namespace (so its own exchange)."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, rabbitmq_url: str) -> str:
        return rabbitmq_url


class TestRabbitMQGetConformance(AdapterConformance):
    """The kit again with ``pull = "get"``: pull points read with ``basic.get`` per
    GetMessages (``native_pull``), so the kit's pull checks run against the adapter's own
    ``pull`` and ``take``."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, rabbitmq_url: str) -> str:
        return rabbitmq_url + ("&" if "?" in rabbitmq_url else "?") + "pull=get"
