"""Options as a Spark user gets them wrong: a misspelt option, and offsets
(``startingOffsets``/``endingOffsets``) of a stream the source does not have, past a
stream's end, of the wrong type, or ending before they start.  Each fails when the query is
planned, naming the option, instead of being ignored (the whole log read), skipping what
arrives up to a far offset, or failing in a task with a bare ``int()`` error."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark_bridge.test_sources import produce_native

pytestmark = [pytest.mark.spark]


def _log(tmp_path: Path, count: int = 10) -> str:
    """A notification log ``l`` holding offsets 1..count."""
    from wsnmom.spark_bridge.log import Entry, NotificationLog
    from wsnmom.topic_mapping.model import Topic

    path = tmp_path / "l.sqlite"
    log = NotificationLog(path, name="l")
    log.append(
        [Entry(f"m{i}", Topic("urn:x", ("a",)), f"<a>{i}</a>".encode()) for i in range(count)]
    )
    log.close()
    return str(path)


def _plan(path: str, **options: str) -> dict[str, tuple[int, int]]:
    from wsnmom.spark_bridge import log_file, plan_batch
    from wsnmom.spark_bridge.selection import Selection

    return plan_batch([log_file(path, alias="x", **options)], Selection())["x"]


def test_misspelt_options_are_refused_naming_the_closest(tmp_path: Path) -> None:
    from wsnmom.spark_bridge.kafka_source import KafkaBackend
    from wsnmom.spark_bridge.rabbitmq_tap import RabbitMQBackend

    path = _log(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"wsn_log source has no option 'startingoffset' \(did you mean startingOffsets\?\)",
    ):
        _plan(path, startingOffset="latest")
    with pytest.raises(
        ValueError, match=r"no option 'shipfromdrivers' \(did you mean shipFromDriver"
    ):
        _plan(path, shipFromDrivers="true")
    with pytest.raises(ValueError, match=r"no option 'zzz' \(known: adapterOptions, alias, "):
        KafkaBackend({"url": "kafka://127.0.0.1:1", "zzz": "1"})
    with pytest.raises(ValueError, match=r"wsn_kafka source has no option 'maxrecordspertriger'"):
        KafkaBackend({"url": "kafka://127.0.0.1:1", "maxrecordspertriger": "5"})
    with pytest.raises(ValueError, match=r"wsn_rabbitmq source has no option 'headprobetimout'"):
        RabbitMQBackend({"url": "amqp://127.0.0.1:1/%2F", "headprobetimout": "1"})
    # every documented option, and librdkafka properties, are taken
    KafkaBackend(
        {
            "url": "kafka://127.0.0.1:1",
            "kafka.socket.timeout.ms": "1000",
            "groupid": "g",
            "verifypayloads": "true",
            "exactwatermarks": "false",
            "polltimeout": "5",
            "maxrecordspertrigger": "5",
            "messagecontent": "true()",
            "includeheaders": "false",
        }
    ).close()
    assert _plan(path, shipFromDriver="true", pollTimeout="5", failOnDataLoss="false") == {
        "l": (1, 11)
    }


def test_misspelt_option_fails_a_streaming_query_at_its_start(spark: Any, tmp_path: Path) -> None:
    """Through Spark's own reader: the query fails naming the option instead of reading
    the whole log from its start."""
    path = _log(tmp_path)
    frame = (
        spark.readStream.format("wsn_log")
        .option("path", path)
        .option("startingOfsets", "latest")
        .load()
    )
    query = (
        frame.writeStream.format("memory")
        .queryName(f"misspelt_{uuid.uuid4().hex[:8]}")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        with pytest.raises(
            Exception, match=r"no option 'startingofsets' \(did you mean startingOffsets"
        ):
            query.processAllAvailable()
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"startingOffsets": '{"mqtt": 5}'},
            r"startingOffsets names 'mqtt', which is not a stream of this source "
            r"\(its streams now: l\)",
        ),
        (
            {"startingOffsets": '{"l": 100}'},
            r"startingOffsets gives offset 100 for l, past its end \(11",
        ),
        ({"endingOffsets": '{"l": 50}'}, r"endingOffsets gives offset 50 for l, past its end \(11"),
        (
            {"startingOffsets": '{"l": "abc"}'},
            r"startingOffsets: the offset of 'l' must be an integer.*not \"abc\"",
        ),
        ({"startingOffsets": '{"l": null}'}, r"the offset of 'l' must be an integer.*not null"),
        ({"startingOffsets": '{"l": 3.7}'}, r"the offset of 'l' must be an integer.*not 3\.7"),
        ({"startingOffsets": '{"l": -5}'}, r"the offset of 'l' must be an integer.*not -5"),
        (
            {"startingOffsets": "first"},
            r"startingOffsets must be earliest, latest or a JSON object",
        ),
        (
            {"startingOffsets": '{"l": 5}', "endingOffsets": '{"l": 2}'},
            r"startingOffsets 5 of l is after its endingOffsets 2",
        ),
    ],
)
def test_batch_bounds_at_the_edges_are_refused(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    from wsnmom.spark_bridge import SourceError

    path = _log(tmp_path)
    with pytest.raises(SourceError, match=rf"log source 'x' \({path}\): .*{message}"):
        _plan(path, **options)


def test_batch_bounds_inside_the_log(spark: Any, tmp_path: Path) -> None:
    from wsnmom.spark_bridge import log_file, read_notifications

    path = _log(tmp_path)
    assert _plan(path, startingOffsets='{"l": 5}', endingOffsets='{"l": 11}') == {"l": (5, 11)}
    assert _plan(path, startingOffsets='{"l": -1}') == {"l": (11, 11)}
    assert _plan(path, startingOffsets='{"l": -2}', endingOffsets='{"l": -1}') == {"l": (1, 11)}
    source = log_file(path, alias="x", startingOffsets='{"l": 5}', endingOffsets='{"l": 8}')
    frame = read_notifications(spark, [source], streaming=False)
    assert sorted(r.offset for r in frame.collect()) == [5, 6, 7]
    # both given as offsets (as read_notifications fixes them): the broker is not asked,
    # an inverted range is still refused
    direct = (
        spark.read.format("wsn_log")
        .option("path", path)
        .option("startingOffsets", '{"l": 9}')
        .option("endingOffsets", '{"l": 3}')
    )
    with pytest.raises(Exception, match=r"startingOffsets 9 of l is after its endingOffsets 3"):
        direct.load().collect()


@pytest.mark.kafka
def test_kafka_ending_offsets_past_the_end(
    spark: Any, kafka_url: str, kafka_bootstrap: str
) -> None:
    """A Kafka batch read up to an offset not written yet fails when it is planned, naming
    the partition's end (a task used to wait ``pollTimeout`` for records that never come,
    then fail)."""
    from wsnmom.spark_bridge import SourceError, kafka, read_notifications

    topic = f"sparkedge{uuid.uuid4().hex[:10]}"
    produce_native(kafka_bootstrap, topic, [f"<n>{i}</n>".encode() for i in range(3)])
    stream = f"{topic}/0"
    options = {"topic": f"n:{topic}", "namespaces": "n=urn:wsnmom:native"}

    def read(**bounds: str) -> list[int]:
        source = kafka(kafka_url, alias="edge", pollTimeout="5", **bounds)
        frame = read_notifications(
            spark,
            [source],
            options["topic"],
            namespaces={"n": "urn:wsnmom:native"},
            streaming=False,
        )
        return sorted(r.offset for r in frame.collect())

    with pytest.raises(
        SourceError,
        match=rf"kafka source .edge. .*endingOffsets gives offset 10 for {stream}, past its end "
        r"\(3:",
    ):
        read(endingOffsets=f'{{"{stream}": 10}}')
    with pytest.raises(
        SourceError, match=rf"startingOffsets names '{topic}/99', which is not a stream"
    ):
        read(startingOffsets=f'{{"{topic}/99": 0}}')
    assert read(startingOffsets=f'{{"{stream}": 1}}', endingOffsets=f'{{"{stream}": 3}}') == [1, 2]


def test_misspelt_sink_option_is_refused_before_anything_is_published(
    spark: Any, tmp_path: Path
) -> None:
    """``write_id`` for ``writeId``: ignored, a rerun of the write would publish its rows
    again; refused when the write starts, naming the option (the target does not answer:
    nothing is tried)."""
    from wsnmom.spark_bridge import sink

    from tests.fixtures.brokers import free_port

    target = f"http://127.0.0.1:{free_port()}/wsn/broker"
    with pytest.raises(
        ValueError, match=r"wsn_notify sink has no option 'write_id' \(did you mean writeId"
    ):
        sink.SinkSettings.parse({"target": target, "write_id": "2024-05-01"})
    frame = spark.createDataFrame([("<a/>",)], "payload string")
    writer = (
        frame.write.format("wsn_notify")
        .option("target", target)
        .option("ledger", str(tmp_path / "ledger.sqlite"))
        .option("write_id", "2024-05-01")
        .mode("append")
    )
    with pytest.raises(Exception, match=r"wsn_notify sink has no option 'write_id'"):
        writer.save()
    # the options Spark adds to a streaming write are taken (lower-case keys, as Spark's)
    options = {"target": target, "writeid": "w", "checkpointlocation": "/c", "queryname": "q"}
    assert sink.SinkSettings.parse(options).write_id == "w"
