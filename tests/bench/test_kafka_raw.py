"""The Kafka benchmark's raw confluent-kafka baselines (``bench/kafka_raw.py``) at tiny sizes
against the session's broker: they run and measure what they say (the figures are not
asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

from bench import kafka_raw
from bench.middleware import Kafka

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("batch", [1, 20])
def test_ingress_confirms_whole_notifies(kafka_bootstrap: str, batch: int) -> None:
    bodies = [b"<x/>"] * batch
    result = kafka_raw.ingress(kafka_bootstrap, bodies, seconds=0.5, threads=4)
    assert result["rps"] > 0
    assert result["msgs_per_s"] == pytest.approx(result["rps"] * batch)


def test_latency_reports_what_arrived(kafka_bootstrap: str) -> None:
    result = kafka_raw.latency(kafka_bootstrap, rate=100, seconds=0.5, body=b"<x/>", threads=2)
    assert result["received"] == 50
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_roundtrip_times_until_every_record_is_consumed(kafka_bootstrap: str) -> None:
    result = kafka_raw.roundtrip(kafka_bootstrap, count=40, body=b"<x/>", publishers=4)
    assert result["seconds"] > 0
    assert result["msgs_per_s"] == pytest.approx(40 / result["seconds"])


def test_the_benchmark_measures_kafka_with_these_baselines(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    mw = Kafka()
    mw.address = kafka_bootstrap  # the broker the variable would name: no private node
    assert mw.raw_roundtrip(20, b"<x/>", tmp_path)["seconds"] > 0
    assert (mw.raw_fanout(5, tmp_path) or 0) > 0
    assert (mw.raw_ingress([b"<x/>"], 0.3, 2) or 0) > 0
    latency = mw.raw_latency(100, 0.3, b"<x/>", tmp_path)
    assert latency is not None and latency["received"] == 30
