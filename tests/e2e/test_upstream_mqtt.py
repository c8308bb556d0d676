"""An ONVIF-style producer relayed into MQTT (docs/federation.md): a producer that requires
a WS-Security UsernameToken with PasswordDigest (a wsnmom gateway with a ``wsse_password``
identity, standing in for a camera's event service in push mode) publishes motion events
under ONVIF's ``tns1:`` topics; a gateway on Mosquitto relays them, and a plain paho
subscriber sees them under their topic path, with the ONVIF topic namespace."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from lxml import etree

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt

from tests.fixtures.mosquitto import close_client, native_client
from tests.fixtures.server import RunningServer, mqtt_gateway_url
from tests.support.waiting import wait_until
from wsnmom.client import WsnClient

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]

ONVIF_TOPICS = "http://www.onvif.org/ver10/topics"
MOTION = "RuleEngine/CellMotionDetector/Motion"
API = "/wsn/admin/api"


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    made = (
        Path(tempfile.mkdtemp(prefix="wsnmom-cam-")),
        Path(tempfile.mkdtemp(prefix="wsnmom-mq-")),
    )
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _state(server: RunningServer) -> dict[str, Any]:
    listing = requests.get(server.base_url + API + "/upstreams", timeout=10).json()
    return {u["name"]: u for u in listing["upstreams"]}["cam"]


def test_motion_events_of_an_onvif_style_producer_reach_a_native_mqtt_subscriber(
    dirs: tuple[Path, Path], mqtt_url: str
) -> None:
    camera_dir, relay_dir = dirs
    users = camera_dir / "users.toml"
    users.write_text('[users.relay]\nwsse_password = "cam-pw"\n')
    users.chmod(0o600)
    token = "admin-" + uuid.uuid4().hex
    camera = RunningServer(
        "embedded",
        f"embedded://{camera_dir / 'middleware'}",
        camera_dir,
        extra_env={"WSNMOM_AUTH__ADMIN_TOKEN": token, "WSNMOM_AUTH__USERS_FILE": str(users)},
    )
    camera.start()
    tag = uuid.uuid4().hex[:10]
    config = relay_dir / "wsnmom.toml"
    config.write_text(
        "[[upstream]]\n"
        'name = "cam"\n'
        f'url = "{camera.broker_url}"\n'
        'topic = "tns1:RuleEngine//."\n'
        'dialect = "concrete_set"\n'
        f'namespaces = {{ tns1 = "{ONVIF_TOPICS}" }}\n'
        'user = "relay"\n'
        'password = "cam-pw"\n'
        'wsse = "digest"\n'
    )
    relay = RunningServer(
        "mqtt",
        mqtt_gateway_url(mqtt_url, tag),
        relay_dir / "data",
        extra_env={"WSNMOM_CONFIG": str(config)},
    )
    relay.start()
    got: list[mqtt.MQTTMessage] = []
    subscribed, arrived = threading.Event(), threading.Event()

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        got.append(message)
        arrived.set()

    client = native_client(mqtt_url, "5")
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    try:
        client.subscribe(f"g{tag}/#", qos=1)
        assert subscribed.wait(10)
        wait_until(
            lambda: _state(relay)["state"] == "subscribed",
            timeout=30,
            what="the subscription at the producer",
        )
        event = (
            '<tt:Message xmlns:tt="http://www.onvif.org/ver10/schema"'
            ' UtcTime="2026-12-05T23:00:00Z">'
            '<tt:Data><tt:SimpleItem Name="IsMotion" Value="true"/></tt:Data></tt:Message>'
        )
        with WsnClient(camera.broker_url, namespaces={"tns1": ONVIF_TOPICS}, token=token) as wsn:
            wsn.notify(event, f"tns1:{MOTION}")
        assert arrived.wait(30)
    finally:
        close_client(client)
        relay.stop()
        camera.stop()
    (message,) = got
    assert message.topic.endswith("/" + MOTION), message.topic
    body = etree.fromstring(message.payload)
    assert body.tag == "{http://www.onvif.org/ver10/schema}Message"
    assert body.find(".//{*}SimpleItem").get("Value") == "true"
    props = dict(message.properties.UserProperty)
    assert (props["wsnmom-topic-ns"], props["wsnmom-topic-path"]) == (ONVIF_TOPICS, MOTION)
