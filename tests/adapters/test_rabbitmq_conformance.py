"""The adapter conformance kit against a real RabbitMQ node (see tests/fixtures/brokers.py
for how the node is found or started)."""

from __future__ import annotations

import pytest
from wsnmom.topic_mapping.model import ANY

from wsnmom.testing.conformance import AdapterConformance

pytestmark = pytest.mark.rabbitmq


class TestRabbitMQConformance(AdapterConformance):
    """Every conformance group; each test uses its own namespace (so its own exchange)."""

    receive_timeout = 5.0
    quiet_period = 0.3

    @pytest.fixture
    def adapter_url(self, rabbitmq_url: str) -> str:
        return rabbitmq_url

    def test_fifo_across_topics(self, adapter, namespace, unique_name) -> None:  # type: ignore[no-untyped-def]
        """The kit's version publishes on ``t/0``, whose segment ``0`` is not an NCName (a
        ``Topic`` path holds NCNames), which this adapter refuses; same test on ``t/n0``."""
        handle = self.subscribe(adapter, unique_name(), (self.pattern(namespace, "t", ANY),))
        bodies = [f"t/n{i % 3}/{i}".encode() for i in range(12)]
        for b in bodies:
            self.publish(adapter, self.topic(namespace, "/".join(b.decode().split("/")[:2])), b)
        assert [m.body for m in self.receive(handle, 12)] == bodies
