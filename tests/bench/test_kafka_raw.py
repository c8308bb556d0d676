"""The Kafka benchmark's raw confluent-kafka baselines (``bench/kafka_raw.py``) at tiny sizes
against the session's broker: they run and measure what they say (the figures are not
asserted)."""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka")

from bench import kafka_raw

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
