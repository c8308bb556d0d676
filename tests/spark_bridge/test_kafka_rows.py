"""The column-wise Kafka conversion (``kafka_rows``) gives exactly the rows the record by
record path gives (the Kafka adapter's ``record_from_parts`` and ``schema.RowBuilder``):
gateway records and native ones, odd headers, topics named by headers, per-namespace and
internal Kafka topics, every kind of selection.  Neither Spark's JVM nor a broker."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyarrow")

from wsnmom.adapters.kafka.clients import record_from_parts
from wsnmom.adapters.kafka.config import parse_settings
from wsnmom.adapters.kafka.mapping import KafkaMapping
from wsnmom.core.codec import NO_TOPIC_NAMESPACE, pull_point_inbox
from wsnmom.spark_bridge.kafka_rows import KafkaRows
from wsnmom.spark_bridge.schema import RowBuilder, arrow_schema
from wsnmom.spark_bridge.selection import Selection
from wsnmom.topic_mapping.model import Topic

NS = "urn:rows"
OTHER = "urn:rows:other"
URL = "kafka://127.0.0.1:9?topic_prefix=t"
PUBLISHED = b"2026-03-01T12:00:00.250000+00:00"

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int | None]


def gateway(mid: str, path: str, body: bytes, ns: str = NS) -> Record:
    """A record as the gateway's Kafka adapter writes it (the message id twice)."""
    headers = [
        ("wsnmom-message-id", mid.encode()),
        ("wsnmom-topic-ns", ns.encode()),
        ("wsnmom-topic-path", path.encode()),
        ("wsnmom-published-at", PUBLISHED),
        ("wsnmom-message-id", mid.encode()),
        ("content-type", b"application/xml"),
    ]
    return (None, body, headers, 1_772_366_400_000)


RECORDS: list[Record] = [
    gateway("m1", "a/b", b'<p:x xmlns:p="urn:p"><p:v>1</p:v></p:x>'),
    gateway("m2", "a/b", b"<v>2</v>"),
    # native records: JSON without headers, text, binary with odd header values
    (None, b'{"v": 3}', None, 1_772_366_401_000),
    (b"k", b"plain text", [("x-trace", b"t1")], 1_772_366_402_000),
    (None, b"\xff\xfe\x00", [("bad", b"\xff"), ("none", None), ("x", b"1"), ("x", b"2")], None),
    # XML without the gateway's id (checked), a media type header of another spelling
    (None, b"<v>6</v>", [("Content-Type", b"text/xml"), ("content-type", b"")], 0),
    (None, b"<v>7", [("contentType", b"application/xml")], 7),
    # topic headers naming another topic, the no-topic topic, a namespace without value
    (None, b"<v>8</v>", [("wsnmom-topic-ns", NS.encode()), ("wsnmom-topic-path", b"a/c")], 8),
    (
        None,
        b"<v>9</v>",
        [("wsnmom-topic-ns", NO_TOPIC_NAMESPACE.encode()), ("wsnmom-topic-path", b"NoTopic")],
        9,
    ),
    (None, b"<v>10</v>", [("wsnmom-topic-ns", None), ("wsnmom-topic-path", b"z")], 10),
    # a producer reference, a publication time without zone, an empty message id
    (
        None,
        b"<v>11</v>",
        [
            ("wsnmom-message-id", b""),
            ("wsnmom-producer-ref", b'{"address": "http://producer.example/p"}'),
            ("wsnmom-published-at", b"2026-03-01T12:00:00"),
            ("content-type", b"application/xml"),
        ],
        11,
    ),
    (None, b"<v>12</v>", [("wsnmom-producer-ref", b"{not json")], 12),
    (None, None, [("wsnmom-message-id", b"m13")], 13),
]

SELECTIONS = [
    Selection("p:a//.", None, {"p": NS}),
    Selection(),
    Selection("p:a/b", None, {"p": NS}),
    Selection("p:zz", None, {"p": NS}),
    Selection(message_content="boolean(//*[local-name()='v'])"),
]


def _mapping(options: dict[str, Any] | None = None) -> KafkaMapping:
    mapping = KafkaMapping(parse_settings(URL, options))
    mapping.register(NS)
    return mapping


def _normal(row: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    out = list(row)
    out[12] = list(out[12])
    return tuple(out)


def by_record(
    log: str, records: list[Record], selection: Selection, options: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    mapping = _mapping(options)
    rows = RowBuilder("src", "kafka", selection.compile())
    out = []
    for i, (key, value, headers, millis) in enumerate(records):
        record = record_from_parts(mapping, log, 3, 100 + i, key, value, headers or [], millis)
        row = rows.values(record, f"{log}/3")
        if row is not None:
            out.append(_normal(row))
    return out


def by_column(
    log: str,
    records: list[Record],
    selection: Selection,
    options: dict[str, Any] | None = None,
    *,
    verify: bool = True,
) -> list[tuple[Any, ...]]:
    rows = KafkaRows("src", _mapping(options), selection.compile(), verify_payloads=verify)
    batch = rows.convert(
        log,
        3,
        [100 + i for i in range(len(records))],
        [r[0] for r in records],
        [r[1] for r in records],
        [r[3] for r in records],
        [r[2] for r in records],
    )
    assert batch.schema.equals(arrow_schema())
    assert rows.accepted == batch.num_rows
    assert rows.accepted + rows.dropped == len(records)
    return [_normal(tuple(row.values())) for row in batch.to_pylist()]


@pytest.mark.parametrize("selection", SELECTIONS, ids=lambda s: s.describe())
def test_rows_equal_the_record_by_record_rows(selection: Selection) -> None:
    log = _mapping().destination(Topic(NS, ("a", "b"))).log
    expected = by_record(log, RECORDS, selection)
    assert by_column(log, RECORDS, selection) == expected
    assert by_column(log, RECORDS, selection, verify=False) == expected
    # chunked as a task reads them: the same rows
    chunked = by_column(log, RECORDS[:5], selection) + by_column(log, RECORDS[5:], selection)
    assert chunked == by_record(log, RECORDS[:5], selection) + by_record(
        log, RECORDS[5:], selection
    )


def test_a_gateway_record_is_taken_as_the_gateway_wrote_it() -> None:
    """Unless ``verify_payloads``: a record with the gateway's message id and an XML media
    type keeps its body as payload unparsed; every other record is checked."""
    log = _mapping().destination(Topic(NS, ("a", "b"))).log
    broken = [gateway("m1", "a/b", b"<v>not closed"), (None, b"<v>not closed", None, 1)]
    trusted = by_column(log, broken, Selection(), verify=False)
    checked = by_column(log, broken, Selection(), verify=True)
    assert checked == by_record(log, broken, Selection())
    assert trusted[0][9] == "<v>not closed"
    assert checked[0][9].startswith("<wsnmom:NativeMessage")
    assert trusted[1] == checked[1]  # a native record is checked either way
    assert checked[1][9].startswith("<wsnmom:NativeMessage")


def test_values_of_the_gateway_records() -> None:
    log = _mapping().destination(Topic(NS, ("a", "b"))).log
    rows = by_column(log, RECORDS[:1], Selection("p:a//.", None, {"p": NS}))
    (row,) = rows
    assert row[:9] == (
        "src",
        "kafka",
        f"{log}/3",
        100,
        NS,
        "a/b",
        "{urn:rows}a/b",
        "m1",
        None,
    )
    assert row[11] == "application/xml"
    assert dict(row[12]) == {
        "wsnmom-message-id": "m1",
        "wsnmom-topic-ns": NS,
        "wsnmom-topic-path": "a/b",
        "wsnmom-published-at": PUBLISHED.decode(),
    }
    assert row[13].isoformat() == "2026-03-01T12:00:00.250000+00:00"


def test_shared_and_internal_kafka_topics_route_by_key() -> None:
    """Per-namespace Kafka topics: each record's key is its path; the internal topic (pull
    point inboxes) is never read as notifications."""
    url = {"namespaces": {NS: {"mode": "namespace"}}}
    mapping = _mapping(url)
    shared = mapping.destination(Topic(NS, ("a", "b"))).log
    records: list[Record] = [
        (b"a/b", b"<v>1</v>", None, 1),
        (b"a/c", b"<v>2</v>", None, 2),
        (None, b"<v>3</v>", [("wsnmom-topic-path", b"a/d")], 3),
        (b"q", b"<v>4</v>", [("wsnmom-topic-ns", OTHER.encode()), ("wsnmom-topic-path", b"o")], 4),
    ]
    for selection in (Selection("p:a/*", None, {"p": NS}), Selection()):
        expected = by_record(shared, records, selection, url)
        assert by_column(shared, records, selection, url) == expected
    paths = [r[5] for r in by_column(shared, records, Selection(), url)]
    assert paths == ["a/b", "a/c", "a/d", "o"]
    inbox = mapping.destination(pull_point_inbox("x1"))
    internal: list[Record] = [(inbox.key, b"<v/>", None, 1)]
    assert by_column(inbox.log, internal, Selection(), url) == []
    assert by_record(inbox.log, internal, Selection(), url) == []


def test_a_derived_root_learns_its_namespace_from_the_first_record() -> None:
    """A namespace the source was not told about: the first record's topic headers name
    it, as in the adapter."""
    writer = KafkaMapping(parse_settings(URL))
    log = writer.destination(Topic(OTHER, ("d", "e"))).log
    records = [gateway(f"m{i}", "d/e", b"<v/>", ns=OTHER) for i in range(3)]
    reader = KafkaRows("src", KafkaMapping(parse_settings(URL)), Selection().compile())
    batch = reader.convert(
        log, 0, [0, 1, 2], [None] * 3, [r[1] for r in records], [1] * 3, [r[2] for r in records]
    )
    assert batch.column("topic").to_pylist() == ["{urn:rows:other}d/e"] * 3


def test_no_records_and_nothing_selected_give_empty_batches() -> None:
    rows = KafkaRows("src", _mapping(), Selection("p:zz", None, {"p": NS}).compile())
    log = _mapping().destination(Topic(NS, ("a", "b"))).log
    assert rows.convert(log, 0, [], [], [], [], []).num_rows == 0
    batch = rows.convert(log, 0, [1], [None], [b"<v/>"], [1], [None])
    assert batch.num_rows == 0
    assert batch.schema.equals(arrow_schema())
    assert rows.dropped == 1


def test_records_of_spark_kafka_source_in_one_array() -> None:
    """``native_kafka.convert_records``: records of several Kafka topic partitions in one
    Arrow array (as Spark's Kafka connector hands them to the UDF) give one row per record,
    in place, null where the selection refuses it or no selected topic can be there."""
    import pyarrow as pa
    from wsnmom.spark_bridge.native_kafka import convert_records

    mapping = _mapping()
    ab = mapping.destination(Topic(NS, ("a", "b"))).log
    elsewhere = mapping.destination(Topic(NS, ("z",))).log
    selection = Selection("p:a//.", None, {"p": NS})
    logs = [ab, elsewhere, ab, ab, elsewhere, ab]
    records = [RECORDS[0], RECORDS[1], RECORDS[2], RECORDS[8], RECORDS[3], RECORDS[7]]
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    array = pa.StructArray.from_arrays(
        [
            pa.array([r[0] for r in records], pa.binary()),
            pa.array([r[1] for r in records], pa.binary()),
            pa.array(logs, pa.string()),
            pa.array([3] * len(records), pa.int32()),
            pa.array([100 + i for i in range(len(records))], pa.int64()),
            pa.array([(r[3] or 0) * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            pa.array(
                [[{"key": k, "value": v} for k, v in r[2]] if r[2] else None for r in records],
                headers,
            ),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "headers"],
    )
    options = {"url": URL, "alias": "src", **selection.to_options()}
    options = {k.lower(): v for k, v in options.items()}
    converted = convert_records(options, array).to_pylist()
    assert len(converted) == len(records)
    # .z cannot hold p:a//.; RECORDS[8] has no topic
    assert [i for i, row in enumerate(converted) if row is None] == [1, 3, 4]
    got = [_normal(tuple(converted[i].values())) for i in (0, 2, 5)]
    assert [row[3] for row in got] == [100, 102, 105]
    expected = by_record(ab, [records[i] for i in (0, 2, 5)], selection)
    assert [row[4:7] + row[9:] for row in got] == [row[4:7] + row[9:] for row in expected]


def test_without_headers_the_column_is_null_and_the_rest_unchanged() -> None:
    """``includeHeaders=false``: both paths leave ``headers`` null, nothing else changes."""
    log = _mapping().destination(Topic(NS, ("a", "b"))).log
    selection = Selection()
    full = by_column(log, RECORDS, selection)
    rows = KafkaRows("src", _mapping(), selection.compile(), include_headers=False)
    batch = rows.convert(
        log,
        3,
        [100 + i for i in range(len(RECORDS))],
        [r[0] for r in RECORDS],
        [r[1] for r in RECORDS],
        [r[3] for r in RECORDS],
        [r[2] for r in RECORDS],
    )
    assert batch.column("headers").null_count == len(full)
    assert batch.drop_columns(["headers"]).to_pylist() == [
        {k: v for k, v in zip(batch.schema.names, row, strict=True) if k != "headers"}
        for row in full
    ]
    builder = RowBuilder("src", "kafka", selection.compile(), include_headers=False)
    mapping = _mapping()
    key, value, headers, millis = RECORDS[0]
    record = record_from_parts(mapping, log, 3, 100, key, value, headers or [], millis)
    row = builder.values(record, f"{log}/3")
    assert row is not None and row[12] is None
