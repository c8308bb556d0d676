"""The adapter conformance kit against the MQTT adapter on the session's broker (a private
Mosquitto unless WSNMOM_TEST_MQTT_URL names one), over MQTT 5 and MQTT 3.1.1.

Each test has a data directory of its own, so its own persistent session and queues."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.core.adapter import Adapter

from wsnmom.testing.conformance import AdapterConformance

pytestmark = pytest.mark.mqtt


class TestMqtt5Conformance(AdapterConformance):
    """Every group, MQTT 5."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, mqtt_url: str) -> str:
        return mqtt_url

    @pytest.fixture
    def adapter_options(self, tmp_path: Path) -> Mapping[str, Any]:
        return {"data_dir": str(tmp_path), "session_expiry": 300}


class TestMqtt311Conformance(TestMqtt5Conformance):
    """Every group, MQTT 3.1.1 (no headers: those checks skip)."""

    @pytest.fixture
    def adapter_options(self, tmp_path: Path) -> Mapping[str, Any]:
        return {"data_dir": str(tmp_path), "session_expiry": 300, "protocol": "3.1.1"}


class TestMqttClusterConformance(TestMqtt5Conformance):
    """Every group, MQTT 5 in cluster mode (``shared_by_instances``): a session per
    subscription on the broker (docs/scale-out.md, "MQTT in cluster mode")."""

    @pytest.fixture
    def adapter_options(self, tmp_path: Path) -> Mapping[str, Any]:
        return {
            "data_dir": str(tmp_path),
            "session_expiry": 300,
            # the cluster's sessions are named after it: one per test
            "topic_prefix": f"k{uuid.uuid4().hex[:10]}",
        }

    @pytest.fixture(autouse=True)
    def _no_publisher_cut_off(self, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
        """No instance's publisher loses its connection: nothing here stops the broker, so
        a loss is a client id two instances share (see ``make_adapter``).  A subscription
        session's loss is by design (whoever connects with its client id last receives)."""
        caplog.set_level(logging.WARNING, logger="wsnmom.adapters.mqtt")
        yield
        lost = [
            message
            for r in caplog.get_records("call")
            if (message := r.getMessage()).startswith("MQTT publisher:") and "lost" in message
        ]
        assert not lost, lost

    @pytest.fixture
    def make_adapter(
        self,
        adapter_class: type[Adapter],
        adapter_url: str,
        adapter_options: Mapping[str, Any],
        tmp_path: Path,
    ) -> Iterator[Callable[[], Adapter]]:
        """Each adapter an instance of its own, with a data directory of its own, as
        docs/scale-out.md has it: two open on one directory share its client id, and the
        broker cuts each one's publisher off when the other connects (the kit's
        ``adapter`` fixture is open while a test makes more: "the MQTT broker is not
        connected", session 9 at load 18-21)."""
        made: list[Adapter] = []

        def make() -> Adapter:
            data_dir = tmp_path / f"instance-{len(made)}"
            adapter = adapter_class(adapter_url, {**adapter_options, "data_dir": str(data_dir)})
            adapter.shared_by_instances(lambda name: True)
            adapter.open()
            made.append(adapter)
            return adapter

        yield make
        for adapter in reversed(made):
            adapter.close()
