"""Example Spark job: count notifications per topic per minute across a Kafka and a RabbitMQ
broker (and an MQTT buffer log), and publish the counts back as notifications on a summary
topic.  See docs/spark.md.

    python examples/spark_topic_counts.py \\
        --kafka "$WSN_KAFKA_URL" --rabbitmq "$WSN_AMQP_URL" --mqtt-log "$WSN_MQTT_LOG" \\
        --topic 'p:plant//.' --ns p=urn:example:plant \\
        --target "$WSN_AMQP_URL" --checkpoint /tmp/topic-counts

Each count is a ``TopicCount`` element in ``urn:wsnmom:example:summary``, published on
``s:topic-counts`` (``--summary-topic``); a subscriber of any gateway on the target
middleware receives them.  ``--once`` processes what is there and stops (Trigger.AvailableNow);
otherwise the query runs every ``--interval`` seconds until interrupted.  Under
``spark-submit`` the job uses the session spark-submit configured; run directly, it starts
a local one.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

SUMMARY_NS = "urn:wsnmom:example:summary"


def build_query(
    spark: Any,
    *,
    kafka: str | None,
    rabbitmq: str | None,
    mqtt_log: str | None,
    topic: str | None,
    namespaces: dict[str, str],
    target: str,
    summary_topic: str,
    checkpoint: str,
    tap_queue: str | None = None,
) -> Any:
    """The configured ``DataStreamWriter`` of the job (call ``trigger(...).start()``)."""
    import wsnmom.spark_bridge as bridge
    from pyspark.sql import functions as F

    sources = []
    if kafka:
        sources.append(bridge.kafka(kafka, alias="kafka"))
    if rabbitmq:
        options = {"queue": tap_queue} if tap_queue else {}
        sources.append(bridge.rabbitmq(rabbitmq, alias="rabbitmq", **options))
    if mqtt_log:
        sources.append(bridge.log_file(mqtt_log, alias="mqtt"))
    notifications = bridge.read_notifications(
        spark, sources, topic, namespaces=namespaces, streaming=True, checkpoint=checkpoint
    )
    counts = (
        notifications.withColumn("at", F.coalesce("timestamp", F.current_timestamp()))
        .withWatermark("at", "2 minutes")
        .groupBy(F.window("at", "1 minute"), "source", "topic")
        .count()
    )
    payload = bridge.xml_element(
        "TopicCount",
        SUMMARY_NS,
        {
            "source": "source",
            "topic": "topic",
            "windowStart": F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'"),
            "windowEnd": F.date_format("window.end", "yyyy-MM-dd'T'HH:mm:ss'Z'"),
            "count": "count",
        },
    )
    writer = bridge.write_notifications(
        counts.select(payload.alias("payload")),
        target,
        topic=summary_topic,
        namespaces={"s": SUMMARY_NS},
        checkpoint=checkpoint,
        sink_id="topic-counts",
        output_mode="update",
    )
    assert writer is not None
    return writer.queryName("topic-counts")


def _pairs(values: Sequence[str]) -> dict[str, str]:
    out = {}
    for value in values:
        prefix, _, uri = value.partition("=")
        out[prefix] = uri
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kafka", help="the Kafka gateway's adapter URL (kafka://...)")
    parser.add_argument("--rabbitmq", help="the RabbitMQ gateway's adapter URL (amqp://...)")
    parser.add_argument("--mqtt-log", help="the log of a wsnmom spark-buffer")
    parser.add_argument("--tap-queue", help="the RabbitMQ tap's queue (default: derived)")
    parser.add_argument("--topic", help="WS-Topics expression (default: every topic)")
    parser.add_argument("--ns", action="append", default=[], metavar="PREFIX=URI")
    parser.add_argument(
        "--target",
        required=True,
        help="where the counts go (a middleware URL or a gateway's broker URL)",
    )
    parser.add_argument("--summary-topic", default="s:topic-counts")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--once", action="store_true", help="process what is there, then stop")
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName("wsnmom-topic-counts").getOrCreate()
    else:
        from wsnmom.spark_bridge import local_session

        spark = local_session("wsnmom-topic-counts")
    writer = build_query(
        spark,
        kafka=args.kafka,
        rabbitmq=args.rabbitmq,
        mqtt_log=args.mqtt_log,
        topic=args.topic,
        namespaces=_pairs(args.ns),
        target=args.target,
        summary_topic=args.summary_topic,
        checkpoint=args.checkpoint,
        tap_queue=args.tap_queue,
    )
    if args.once:
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime=f"{args.interval} seconds").start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    read = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"{read} notification(s) read in {len(query.recentProgress)} micro-batch(es)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
