"""Deleting Kafka records in a test (what retention does to a log's start), skipping only
where the broker cannot: the session's local tansu (it does not implement DeleteRecords and
drops the connection), or a broker that answers that the request is unsupported.  Every
other error fails the test.  The record-loss path these tests prove on Kafka runs on every
machine through the same logbase cursor code on the file-log adapter
(tests/adapters/test_logbase_engine.py::test_retention_losses_are_counted)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

#: the answers that mean "this broker does not do DeleteRecords"
UNSUPPORTED = {KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE}
REASON = "cannot delete records"


def delete_records_or_skip(admin: Any, end: TopicPartition, broker: Any) -> None:
    """Delete the records of ``end``'s partition before ``end.offset``.

    ``broker`` is the session's ``kafka_broker`` (a ``ResolvedBroker``).
    """
    from tests.fixtures.tansu import TansuNode

    if isinstance(broker.node, TansuNode):
        pytest.skip(f"tansu {REASON} (DeleteRecords is not implemented)")
    try:
        admin.delete_records([end])[end].result()
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() in UNSUPPORTED:
            pytest.skip(f"this broker {REASON}: {error}")
        raise
