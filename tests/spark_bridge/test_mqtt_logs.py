"""Spark reads MQTT through both forms of the buffer, which read MQTT as the gateway's MQTT
adapter does: the gateway's own session keeping a log (adapter option ``spark_logs``) and
the standalone ``wsnmom spark-buffer``.  A notification published through the MQTT gateway
and natively (paho, MQTT 5 with metadata, MQTT 3.1.1 without) appear in both with the same
namespace, path, message id and content type; the gateway's log keeps what arrives while
the gateway is down (its persistent session), next to a WS-N pull point that gets the same.

Cost: one gateway (started twice), one standalone buffer, three Spark batch reads: ~15 s.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.mosquitto import MqttPublisher, close_client, native_client
from tests.fixtures.server import RunningServer, mqtt_gateway_url
from tests.spark_bridge.conftest import unique_namespace
from tests.spark_bridge.test_sources import notify
from tests.support.waiting import wait_until
from wsnmom.client.broker import WsnClient

pytestmark = [pytest.mark.spark, pytest.mark.mqtt]

SELECTED = "p:fleet//pos"


def _config(path: Path, ns: str, log_path: Path) -> Path:
    path.write_text(
        "[adapter_options]\n"
        f'namespaces = {{ "{ns}" = "plant" }}\n'
        "[adapter_options.spark_logs.fleet]\n"
        f'path = "{log_path}"\n'
        f'topic = "{SELECTED}"\n'
        f'namespaces = {{ p = "{ns}" }}\n'
    )
    return path


def _entries(log_path: Path) -> list[tuple[int, str, bytes]]:
    from wsnmom.spark_bridge.log import NotificationLog

    if not log_path.exists():
        return []
    return list(NotificationLog(log_path, create=False).entries())


def _read(spark: Any, log_path: Path, alias: str, ns: str) -> list[Any]:
    from wsnmom.spark_bridge import log_file, read_notifications

    frame = read_notifications(
        spark,
        [log_file(str(log_path), alias=alias)],
        SELECTED,
        namespaces={"p": ns},
        streaming=False,
    )
    return list(frame.orderBy("offset").collect())


def test_gateway_and_native_mqtt_notifications_in_spark_through_both_buffers(
    spark: Any, mqtt_url: str, tmp_path: Path
) -> None:
    from wsnmom.spark_bridge.buffer import BufferSettings, MqttBuffer
    from wsnmom.spark_bridge.selection import Selection

    ns = unique_namespace()
    tag = uuid.uuid4().hex[:10]
    prefix = f"g{tag}/plant"  # the gateway's topic_prefix, then the namespace's prefix
    gateway_log, buffer_log = tmp_path / "gateway.sqlite", tmp_path / "buffer.sqlite"
    (tmp_path / "gateway").mkdir()
    server = RunningServer(
        "mqtt",
        mqtt_gateway_url(mqtt_url, tag),
        tmp_path / "gateway",
        extra_env={"WSNMOM_CONFIG": str(_config(tmp_path / "gw.toml", ns, gateway_log))},
    )
    server.start()
    buffer = MqttBuffer(
        BufferSettings(
            url=mqtt_url,
            log_path=str(buffer_log),
            client_id=f"buf-{tag}",
            selection=Selection(SELECTED, None, {"p": ns}),
            roots={ns: "plant"},
            topic_prefix=f"g{tag}",
        )
    )
    buffer.start()
    # a native MQTT 5 subscriber learns the message id the gateway gave its notification
    seen: dict[str, str] = {}
    got_it, subscribed = threading.Event(), threading.Event()
    watcher = native_client(mqtt_url)

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        props = dict(message.properties.UserProperty or [])
        seen[message.topic] = props.get("wsnmom-message-id", "")
        got_it.set()

    watcher.on_message = on_message
    watcher.on_subscribe = lambda *_: subscribed.set()
    watcher.subscribe(f"{prefix}/fleet/t1/pos", qos=1)
    v5, v311 = MqttPublisher(mqtt_url, "5"), MqttPublisher(mqtt_url, "3.1.1")
    client = WsnClient(server.broker_url, namespaces={"p": ns})
    try:
        pull_point = client.create_pull_point()
        client.subscribe(pull_point, "p:fleet//.")
        assert subscribed.wait(10)
        notify(server, ns, [("fleet/t1/pos", '<pos xmlns="urn:f">1</pos>')])
        v5.publish(
            f"{prefix}/fleet/t2/pos",
            b'{"lat": 2}',
            {"wsnmom-message-id": "native-5"},
            "application/json",
        )
        v311.publish(f"{prefix}/fleet/t3/gps/pos", b"<pos>3</pos>")
        v311.publish(f"{prefix}/fleet/t4/speed", b"<speed>4</speed>")  # not selected
        v311.publish(f"{prefix}/fleet/t5/pos/raw", b"<pos>5</pos>")  # mid-path: not selected
        v5.publish(f"{prefix}/fleet/end/pos", b"<pos>end</pos>")
        for log_path in (gateway_log, buffer_log):
            wait_until(
                lambda p=log_path: len(_entries(p)) >= 4, what=f"4 records in {log_path.name}"
            )
        assert got_it.wait(10)
        gateway_id = seen[f"{prefix}/fleet/t1/pos"]
        assert gateway_id

        # the same rows from the gateway's log and from the standalone buffer
        by_gateway = _read(spark, gateway_log, "gw-mqtt", ns)
        by_buffer = _read(spark, buffer_log, "buffer-mqtt", ns)
        for alias, rows in (("gw-mqtt", by_gateway), ("buffer-mqtt", by_buffer)):
            assert [r.topic_path for r in rows] == [
                "fleet/t1/pos",
                "fleet/t2/pos",
                "fleet/t3/gps/pos",
                "fleet/end/pos",
            ], alias
            assert {r.topic_namespace for r in rows} == {ns}
            assert {r.middleware for r in rows} == {"mqtt"}
            gateway, native5, native311, _ = rows
            assert gateway.message_id == gateway_id
            assert gateway.content_type == "application/xml"
            assert gateway.headers["wsnmom-topic-path"] == "fleet/t1/pos"
            assert native5.message_id == "native-5"
            assert native5.content_type == "application/json"
            assert native5.body == b'{"lat": 2}'
            # MQTT 3.1.1: the topic and the body only; the media type sniffed from it
            assert native311.content_type == "application/xml" and native311.headers == {}
            assert native311.payload == "<pos>3</pos>"
            assert native311.message_id == f"{alias}/{native311.stream}/{native311.offset}"
        # the gateway's subscribers get their notifications as before
        pulled: list[Any] = []
        wait_until(
            lambda: pulled.extend(client.get_messages(pull_point)) or len(pulled) >= 6,
            what="6 notifications at the pull point",
        )
        assert len(pulled) == 6

        # the gateway is down: its session keeps what is published for the log too
        server.stop()
        for i in range(3):
            v311.publish(f"{prefix}/fleet/late{i}/pos", f"<pos>late {i}</pos>".encode())
        server.start()
        wait_until(lambda: len(_entries(gateway_log)) == 7, what="3 more records")
        later = _read(spark, gateway_log, "gw-mqtt", ns)
        assert [r.topic_path for r in later[4:]] == [f"fleet/late{i}/pos" for i in range(3)]
    finally:
        client.close()
        v5.close()
        v311.close()
        close_client(watcher)
        buffer.stop()
        server.stop()
