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
    def adapter_url(self, module_vhost: str) -> str:
        # a vhost of the module's own: the kit asserts that a publish without a subscriber
        # reaches no queue, which a topic-less subscription elsewhere in "/" would break
        return module_vhost


class TestRabbitMQGetConformance(AdapterConformance):
    """The kit again with ``pull = "get"``: pull points read with ``basic.get`` per
    GetMessages (``native_pull``), so the kit's pull checks run against the adapter's own
    ``pull`` and ``take``."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, module_vhost: str) -> str:
        return module_vhost + ("&" if "?" in module_vhost else "?") + "pull=get"
