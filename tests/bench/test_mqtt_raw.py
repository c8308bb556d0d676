"""The MQTT benchmark's raw paho baselines (``bench/mqtt_raw.py``) at tiny sizes against the
session's broker: they run and measure what they say (the figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from bench import mqtt_raw
from bench.middleware import Mqtt

pytestmark = pytest.mark.mqtt


def test_round_trip_receives_every_message(mqtt_url: str) -> None:
    result = mqtt_raw.roundtrip(mqtt_url, 200, b"<x/>", publishers=2)
    assert result["seconds"] > 0 and result["msgs_per_s"] == pytest.approx(200 / result["seconds"])


def test_fan_out_reaches_every_session(mqtt_url: str) -> None:
    assert mqtt_raw.fanout(mqtt_url, 50) > 0


@pytest.mark.parametrize("batch", [1, 20])
def test_ingress_confirms_whole_notifies(mqtt_url: str, batch: int) -> None:
    bodies = [b"<x/>"] * batch
    result = mqtt_raw.ingress(mqtt_url, bodies, seconds=0.5, threads=4)
    assert result["rps"] > 0
    assert result["msgs_per_s"] == pytest.approx(result["rps"] * batch)


def test_the_benchmark_measures_mqtt_with_these_baselines(mqtt_url: str, tmp_path: Path) -> None:
    mw = Mqtt()
    mw.address = mqtt_url  # the broker the variable would name: no private node
    assert mw.raw_roundtrip(20, b"<x/>", tmp_path)["seconds"] > 0
    assert (mw.raw_fanout(5, tmp_path) or 0) > 0
    assert (mw.raw_ingress([b"<x/>"], 0.3, 2) or 0) > 0
    assert mw.raw_latency(100, 0.3, b"<x/>", tmp_path) is None  # no MQTT latency baseline
