"""The MQTT buffer (``wsnmom spark-buffer``) against a real mosquitto, without Spark:
durable append before acknowledgement, persistent session across buffer restarts, no
duplicates after a crash between append and PUBACK."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from wsnmom.spark_bridge.buffer import BufferSettings, MqttBuffer
from wsnmom.spark_bridge.log import NotificationLog
from wsnmom.spark_bridge.selection import Selection

from tests.fixtures.mosquitto import MqttPublisher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

NS = {"p": "urn:plant"}
ROOTS = {"urn:plant": "plant"}


def settings(url: str, path: Path, client_id: str, topic: str = "p:valves//.") -> BufferSettings:
    return BufferSettings(
        url=url,
        log_path=str(path),
        client_id=client_id,
        selection=Selection(topic, None, NS),
        roots=ROOTS,
        session_expiry=600,
    )


def test_buffer_keeps_everything_across_its_own_restart(
    mqtt_url: str, mqtt_publisher: MqttPublisher, tmp_path: Path
) -> None:
    path = tmp_path / "mqtt.sqlite"
    client_id = f"buf-{uuid.uuid4().hex[:8]}"
    retained = f"plant/valves/r{uuid.uuid4().hex[:6]}/state"
    mqtt_publisher.publish(retained, b"<s>retained</s>", retain=True)
    buffer = MqttBuffer(settings(mqtt_url, path, client_id))
    buffer.start()
    assert buffer.filters == ["plant/valves/#"]
    for i in range(20):
        mqtt_publisher.publish(f"plant/valves/v{i % 4}/state", f"<s>{i}</s>".encode())
    mqtt_publisher.publish("plant/pumps/p1", b"<s>not selected</s>")
    log = NotificationLog(path, create=False)
    wait_until(lambda: len(log) == 20, what="20 records in the log")
    buffer.stop()
    # published while the buffer is down: the broker queues them for the session
    for i in range(20, 35):
        mqtt_publisher.publish(f"plant/valves/v{i % 4}/state", f"<s>{i}</s>".encode())
    again = MqttBuffer(settings(mqtt_url, path, client_id))
    again.start()
    assert again.session_present
    # the barrier: a sentinel after the 35
    mqtt_publisher.publish("plant/valves/sentinel/state", b"<sentinel/>")
    wait_until(
        lambda: b"<sentinel/>" in [body for _seq, _native, body in log.entries()],
        what="the sentinel in the log",
    )
    again.stop()
    mqtt_publisher.publish(retained, b"", retain=True)  # cleared on the shared broker
    bodies = [body for _seq, _native, body in log.entries()]
    # the retained message was not a new notification (as for a gateway's subscriptions)
    assert bodies == [f"<s>{i}</s>".encode() for i in range(35)] + [b"<sentinel/>"]
    assert again.duplicates == 0


def test_crash_between_append_and_puback_appends_nothing_twice(
    mqtt_url: str, mqtt_publisher: MqttPublisher, tmp_path: Path
) -> None:
    path = tmp_path / "mqtt.sqlite"
    client_id = f"buf-{uuid.uuid4().hex[:8]}"
    buffer = MqttBuffer(settings(mqtt_url, path, client_id))
    acked: list[int] = []
    buffer.session.session.link.client.ack = lambda mid, qos: acked.append(mid)  # type: ignore[method-assign]
    buffer.start()
    for i in range(6):  # as the gateway publishes: with a message id
        mqtt_publisher.publish(
            f"plant/valves/v{i}/state",
            f"<s>{i}</s>".encode(),
            {"wsnmom-message-id": f"m{i}", "wsnmom-topic-ns": "urn:plant"},
            "application/xml",
        )
    for i in range(4):  # natively: no id at all
        mqtt_publisher.publish(f"plant/valves/n{i}/state", f'{{"n": {i}}}'.encode())
    log = NotificationLog(path, create=False)
    wait_until(lambda: len(log) == 10, what="10 records")
    wait_until(lambda: len(acked) == 10, what="10 acknowledgements after the append")
    buffer.stop()  # "crash": appended, never acknowledged to the broker
    again = MqttBuffer(settings(mqtt_url, path, client_id))
    again.start()
    wait_until(lambda: again.duplicates == 10, what="10 redeliveries recognised")
    mqtt_publisher.publish("plant/valves/n9/state", b"after")
    wait_until(lambda: len(log) == 11, what="the next message")
    again.stop()
    assert again.appended == 1
    records = list(log.read(1, 100))
    assert records[6].content_type == "application/json"  # sniffed for a bare body
    assert records[0].headers["wsnmom-message-id"] == "m0"


def test_a_failed_append_is_retried_and_nothing_is_acknowledged_before(
    mqtt_url: str, mqtt_publisher: MqttPublisher, tmp_path: Path
) -> None:
    path = tmp_path / "mqtt.sqlite"
    buffer = MqttBuffer(settings(mqtt_url, path, f"buf-{uuid.uuid4().hex[:8]}"))
    client = buffer.session.session.link.client
    acked: list[int] = []
    send_ack = client.ack
    client.ack = lambda mid, qos: (acked.append(mid), send_ack(mid, qos))[1]  # type: ignore[method-assign]
    append = buffer.log.append
    acked_at_failure: list[int] = []

    def failing_twice(entries: Any, **kwargs: Any) -> Any:
        if len(acked_at_failure) < 2:
            acked_at_failure.append(len(acked))
            raise sqlite3.OperationalError("disk I/O error")
        return append(entries, **kwargs)

    buffer.log.append = failing_twice  # type: ignore[method-assign]
    buffer.start()
    try:
        for i in range(3):
            mqtt_publisher.publish(f"plant/valves/f{i}/state", f"<s>{i}</s>".encode())
        log = NotificationLog(path, create=False)
        wait_until(lambda: len(log) == 3, what="3 records after two failed appends")
        wait_until(lambda: len(acked) == 3, what="3 acknowledgements")
    finally:
        buffer.stop()
    assert acked_at_failure == [0, 0]
    assert buffer.session.tap_failures == 2


def test_spark_buffer_command_runs_until_terminated(
    mqtt_url: str, mqtt_publisher: MqttPublisher, tmp_path: Path
) -> None:
    path = tmp_path / "cli.sqlite"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wsnmom",
            "spark-buffer",
            "--mqtt",
            mqtt_url,
            "--log",
            str(path),
            "--client-id",
            f"cli-{uuid.uuid4().hex[:6]}",
            "--topic",
            "p:valves/*/state",
            "-n",
            "p=urn:plant",
            "--root",
            "urn:plant=plant",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # a Python process starting: seconds of CPU, a minute on a loaded machine (at load
        # 35 the default 10 s ran out); the file appears complete (spark_bridge/log.py)
        wait_until(lambda: path.exists(), 60, what="the log file")

        def bodies() -> list[bytes]:
            return [body for _seq, _native, body in NotificationLog(path, create=False).entries()]

        def subscribed() -> bool:  # a probe reached the log: the buffer has subscribed
            mqtt_publisher.publish("plant/valves/probe/state", b"<probe/>")
            return bool(bodies())

        wait_until(subscribed, 60, interval=0.2, what="a probe in the log")
        for i in range(5):
            mqtt_publisher.publish(f"plant/valves/v{i}/state", b"<s/>")
        mqtt_publisher.publish("plant/valves/sentinel/state", b"<sentinel/>")  # the barrier
        got = wait_until(lambda: b"<sentinel/>" in (b := bodies()) and b, 30, what="the sentinel")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert got.count(b"<s/>") == 5
    assert proc.returncode == 0, err
    assert f"{len(got)} appended" in err and "plant/valves/+/state" in err


def test_spark_buffer_refuses_a_bad_expression(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wsnmom",
            "spark-buffer",
            "--mqtt",
            "mqtt://127.0.0.1:1",
            "--log",
            str(tmp_path / "x.sqlite"),
            "--client-id",
            "c",
            "--topic",
            "q:a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "InvalidTopicExpression" in result.stderr
