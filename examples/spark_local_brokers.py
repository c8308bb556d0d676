"""Start, on this machine, everything the Spark example (docs/spark.md) runs against, the way
the test suite starts its brokers: a private RabbitMQ node, a Kafka-protocol broker (tansu,
from the ``test`` extra), a private mosquitto, a gateway on RabbitMQ and one on Kafka, the
RabbitMQ tap and the MQTT buffer of the example's topic (MQTT root ``site`` for the
namespace ``urn:example:plant``: ``{urn:example:plant}plant/tanks/t2`` is the MQTT topic
``site/plant/tanks/t2``).  All on loopback, on free ports, in one work directory; Ctrl-C
stops everything.

    python examples/spark_local_brokers.py --workdir /tmp/wsnmom-spark
    source /tmp/wsnmom-spark/env.sh          # in another shell

Run it from the repository checkout (it uses ``tests/fixtures``) with the virtualenv of
``make venv EXTRAS=test,rabbitmq,kafka,mqtt,spark``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMESPACE = "urn:example:plant"
TOPIC = "p:plant//."


def main() -> int:
    from wsnmom.spark_bridge.buffer import BufferSettings, MqttBuffer
    from wsnmom.spark_bridge.rabbitmq_tap import ensure_tap
    from wsnmom.spark_bridge.selection import Selection

    from tests.fixtures.brokers import RabbitNode
    from tests.fixtures.mosquitto import MosquittoNode
    from tests.fixtures.server import kafka_gateway_url
    from tests.fixtures.tansu import TansuNode
    from wsnmom.testing.gateway import Gateway

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/wsnmom-spark"))
    args = parser.parse_args()
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started: list[object] = []
    try:
        print("starting RabbitMQ, tansu and mosquitto ...", flush=True)
        rabbit, kafka, mqtt = RabbitNode(), TansuNode(), MosquittoNode()
        for node in (rabbit, kafka, mqtt):
            node.start()
            started.append(node)
        kafka_url = kafka_gateway_url(kafka.url, "example")
        gateways = {
            "rabbitmq": Gateway("rabbitmq", rabbit.url, work / "gateway-rabbitmq"),
            "kafka": Gateway("kafka", kafka_url, work / "gateway-kafka"),
        }
        for gateway in gateways.values():
            gateway.start(timeout=60)
            started.append(gateway)
        namespaces = json.dumps({"p": NAMESPACE})
        tap = ensure_tap({"url": rabbit.url, "topic": TOPIC, "namespaces": namespaces})
        mqtt_log = work / "mqtt.sqlite"
        buffer = MqttBuffer(
            BufferSettings(
                url=mqtt.url,
                log_path=str(mqtt_log),
                client_id="wsnmom-spark-example",
                selection=Selection(TOPIC, None, {"p": NAMESPACE}),
                roots={NAMESPACE: "site"},
            )
        )
        buffer.start()
        started.append(buffer)
        env = {
            "WSN_RABBIT_GATEWAY": gateways["rabbitmq"].broker_url,
            "WSN_KAFKA_GATEWAY": gateways["kafka"].broker_url,
            "WSN_AMQP_URL": rabbit.url,
            "WSN_KAFKA_URL": kafka_url,
            "WSN_MQTT_URL": mqtt.url,
            "WSN_MQTT_PORT": str(mqtt.port),
            "WSN_MQTT_LOG": str(mqtt_log),
            "WSN_TAP_QUEUE": tap,
        }
        lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        (work / "env.sh").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        print(f"\nwritten to {work / 'env.sh'}; Ctrl-C stops everything", flush=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for thing in reversed(started):
            stopper = getattr(thing, "cleanup", None) or thing.stop
            try:
                stopper()
            except Exception as exc:  # keep stopping the rest
                print(f"stopping {thing!r} failed: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
