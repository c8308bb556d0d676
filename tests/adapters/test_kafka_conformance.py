"""The adapter conformance kit against the Kafka adapter on the session's Kafka-protocol
broker (tansu unless WSNMOM_TEST_KAFKA_BOOTSTRAP names a cluster): every group in the
topic-per-path mapping, the groups the mapping takes part in in the topic-per-namespace
mapping."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from wsnmom.testing.conformance import (
    AdapterBasics,
    AdapterConformance,
    CurrentMessage,
    DroppedToDeadLetters,
    Durability,
    HeadersAndBodies,
    Peek,
    PullSemantics,
    TopicRouting,
)

pytestmark = pytest.mark.kafka


def isolated_options(**extra: Any) -> dict[str, Any]:
    """Options that keep one test's topics, groups and inbox apart from every other test
    sharing the broker (a head reader then follows only this test's topics)."""
    tag = uuid.uuid4().hex[:10]
    return {
        "topic_prefix": f"t{tag}",
        "internal_topic": f"i{tag}",
        "head_group": f"wsnmom.head.{tag}",
        "group_prefix": f"wsnmom.sub.{tag}.",
        "discovery_interval": 0.5,
        # tansu's high watermark is not exact; right on Apache Kafka too, only slower
        "exact_watermarks": False,
        **extra,
    }


class TestKafkaConformance(AdapterConformance):
    """Every group, topic-per-path mapping."""

    receive_timeout = 10.0

    @pytest.fixture
    def adapter_url(self, kafka_url: str) -> str:
        return kafka_url

    @pytest.fixture
    def adapter_options(self) -> Mapping[str, Any]:
        return isolated_options()


class TestKafkaConformancePerNamespace(
    AdapterBasics,
    TopicRouting,
    PullSemantics,
    Durability,
    DroppedToDeadLetters,
    CurrentMessage,
    HeadersAndBodies,
    Peek,
):
    """Topic-per-namespace mapping (one Kafka topic of two partitions per namespace): the
    groups that publish to, follow or read back several topics or the current message,
    where the mapping (``adapters/kafka/mapping.py``: a record's log and key, its topic,
    which logs a subscription reads) is consulted.  Left out: ``AckSemantics``,
    ``PauseResume``, ``QueueLimitsSemantics`` and ``Delete``, whose tests each use one
    topic: its records are on one partition of the shared log, as on the one of its own
    log in the path mapping, and from there on (settling, pausing, limits, deleting) the
    engine does not know the mapping; the class above runs them."""

    receive_timeout = 10.0

    @pytest.fixture
    def adapter_url(self, kafka_url: str) -> str:
        return kafka_url

    @pytest.fixture
    def adapter_options(self) -> Mapping[str, Any]:
        return isolated_options(mode="namespace", partitions=2)
