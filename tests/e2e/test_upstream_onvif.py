"""An ONVIF device relayed into MQTT in ONVIF pull mode (docs/federation.md): a wsnmom
gateway's own ONVIF event service (``/onvif/event_service``), requiring a WS-Security
UsernameToken with PasswordDigest, plays the camera.  A gateway on Mosquitto, added the
upstream with ``wsnmom upstream add --mode onvif-pull``, holds a pull-point subscription
there (CreatePullPointSubscription), empties it with PullMessages and renews it with Renew.
A plain paho subscriber sees the motion events under their ``tns1:`` topics.  The camera
restarts without its data (a rebooted camera forgets its subscriptions): the relay
subscribes again, and nothing arrives twice."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from lxml import etree

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt

from tests.fixtures.mosquitto import close_client, native_client
from tests.fixtures.server import RunningServer, mqtt_gateway_url
from tests.support.cli import wsnmom_in_process
from tests.support.waiting import wait_until
from wsnmom.client import FULL, AuthenticationFailed, SoapFault, TopicExpression, WsnClient
from wsnmom.client.onvif import OnvifEvents, max_message_limit

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]

ONVIF_TOPICS = "http://www.onvif.org/ver10/topics"
MOTION = "RuleEngine/CellMotionDetector/Motion"
API = "/wsn/admin/api"
CAMERA_LIMIT = 5
BURST = range(10, 22)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wsnmom-onvif-up-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _camera(data_dir: Path, users: Path, token: str, port: int = 0) -> RunningServer:
    return RunningServer(
        "embedded",
        f"embedded://{data_dir / 'middleware'}",
        data_dir,
        port=port,
        extra_env={
            "WSNMOM_AUTH__ADMIN_TOKEN": token,
            "WSNMOM_AUTH__USERS_FILE": str(users),
            # PullMessages gives at most 5 at once: the relay must lower its MessageLimit
            "WSNMOM_LIMITS__GET_MESSAGES_CAP": str(CAMERA_LIMIT),
        },
    )


def _relay_user(where: Path) -> Path:
    """A camera's users file in ``where``: the relay, with its WS-Security password."""
    users = where / "users.toml"
    users.write_text('[users.relay]\nwsse_password = "cam-pw"\n')
    users.chmod(0o600)
    return users


@pytest.fixture(scope="module")
def camera() -> Iterator[tuple[RunningServer, str]]:
    """A camera of the tests that do not reboot it, and its admin token: each of them
    holds a subscription of its own there."""
    path = Path(tempfile.mkdtemp(prefix="wsnmom-onvif-cam-"))
    users = _relay_user(path)
    token = "admin-" + uuid.uuid4().hex
    server = _camera(path / "cam", users, token)
    server.start()
    try:
        yield server, token
    finally:
        server.stop()
        shutil.rmtree(path, ignore_errors=True)


def _cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``wsnmom ARGS --broker`` the gateway, in this process (``test_upstream_relay.py``
    runs ``wsnmom upstream add`` as a real process)."""
    return wsnmom_in_process(*args, "--broker", server.broker_url)


def _state(server: RunningServer) -> dict[str, Any]:
    listing = requests.get(server.base_url + API + "/upstreams", timeout=10).json()
    return {u["name"]: u for u in listing["upstreams"]}["cam"]


def _motion(camera: RunningServer, token: str, *numbers: int) -> None:
    with WsnClient(camera.broker_url, namespaces={"tns1": ONVIF_TOPICS}, token=token) as wsn:
        for number in numbers:
            event = (
                '<tt:Message xmlns:tt="http://www.onvif.org/ver10/schema"'
                ' UtcTime="2026-12-05T23:00:00Z">'
                f'<tt:Source><tt:SimpleItem Name="Event" Value="{number}"/></tt:Source>'
                '<tt:Data><tt:SimpleItem Name="IsMotion" Value="true"/></tt:Data></tt:Message>'
            )
            wsn.notify(event, f"tns1:{MOTION}")


def _subscriptions_at(camera: RunningServer, token: str) -> int:
    resp = requests.get(
        camera.base_url + API + "/pullpoints",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    resp.raise_for_status()
    return int(resp.json()["count"])


@contextlib.contextmanager
def _relay_heard(
    mqtt_url: str, workdir: Path
) -> Iterator[tuple[RunningServer, list[mqtt.MQTTMessage]]]:
    """A relay gateway on MQTT (its own topic prefix) and what a native MQTT client
    subscribed under that prefix receives; the client closed and the relay stopped on
    leaving."""
    tag = uuid.uuid4().hex[:10]
    relay = RunningServer("mqtt", mqtt_gateway_url(mqtt_url, tag), workdir / "relay")
    relay.start()
    got: list[mqtt.MQTTMessage] = []
    subscribed = threading.Event()
    client = native_client(mqtt_url, "5")
    client.on_message = lambda c, u, message: got.append(message)
    client.on_subscribe = lambda *args: subscribed.set()
    try:
        client.subscribe(f"g{tag}/#", qos=1)
        assert subscribed.wait(10)
        yield relay, got
    finally:
        close_client(client)
        relay.stop()


def _add_camera(relay: RunningServer, event_service: str, topic: str, *extra: str) -> None:
    """``wsnmom upstream add`` of the camera's event service in ONVIF pull mode (the
    ``relay`` user, a PasswordDigest token), once the relay holds its subscription."""
    added = _cli(
        relay,
        "upstream",
        "add",
        "cam",
        event_service,
        "--mode",
        "onvif-pull",
        "--topic",
        topic,
        "--dialect",
        "concrete_set",
        "--topic-ns",
        f"tns1={ONVIF_TOPICS}",
        "--remote-user",
        "relay",
        "--remote-password",
        "cam-pw",
        "--remote-wsse",
        "digest",
        *extra,
    )
    assert added.returncode == 0, added.stderr
    wait_until(
        lambda: _state(relay)["state"] == "subscribed",
        timeout=30,
        what="the pull-point subscription at the camera",
    )


def test_onvif_pull_mode_relays_motion_events_into_mqtt_and_resubscribes_after_a_reboot(
    workdir: Path, mqtt_url: str
) -> None:
    users = _relay_user(workdir)
    token = "admin-" + uuid.uuid4().hex
    camera = _camera(workdir / "cam-a", users, token)
    camera.start()
    try:
        with _relay_heard(mqtt_url, workdir) as (relay, got):
            _add_camera(relay, camera.base_url + "/onvif/event_service", "tns1:RuleEngine//.")
            state = _state(relay)
            assert (state["mode"], state["auth"], state["subscribes"]) == (
                "onvif-pull",
                "wsse-digest",
                1,
            )
            assert "/onvif/subscriptions/" in state["subscription"], state
            # the camera holds one pull point: the subscription's
            assert _subscriptions_at(camera, token) == 1
            listed = _cli(relay, "upstream", "list")
            assert listed.returncode == 0 and "onvif-pull" in listed.stdout, listed
            page = requests.get(relay.base_url + "/admin", timeout=10).text
            assert "subscribed (onvif-pull)" in page

            _motion(camera, token, 1)
            wait_until(lambda: len(got) == 1, timeout=30, what="the first motion event in MQTT")
            # a burst larger than the camera's MessageLimit: taken in several PullMessages
            _motion(camera, token, *BURST)
            wait_until(lambda: len(got) == 1 + len(BURST), timeout=30, what="the burst in MQTT")
            assert _state(relay)["subscribes"] == 1  # the limit fault did not cost the subscription

            # the camera reboots without its data: the subscription is gone there
            camera.stop()
            camera = _camera(workdir / "cam-b", users, token, port=camera.port)
            camera.start()
            wait_until(
                lambda: _state(relay)["subscribes"] == 2 and _state(relay)["state"] == "subscribed",
                timeout=90,
                what="a new pull-point subscription at the rebooted camera",
            )
            _motion(camera, token, 2)
            wait_until(lambda: len(got) >= 2 + len(BURST), timeout=30, what="the event after it")
            # the sentinel: a third event after both, so a duplicate would be in by now
            _motion(camera, token, 3)
            wait_until(lambda: len(got) >= 3 + len(BURST), timeout=30, what="the sentinel")
    finally:
        camera.stop()
    numbers = []
    for message in got:
        assert message.topic.endswith("/" + MOTION), message.topic
        props = dict(message.properties.UserProperty)
        assert (props["wsnmom-topic-ns"], props["wsnmom-topic-path"]) == (ONVIF_TOPICS, MOTION)
        body = etree.fromstring(message.payload)
        assert body.tag == "{http://www.onvif.org/ver10/schema}Message"
        assert body.find(".//{*}Data/{*}SimpleItem").get("Value") == "true"
        numbers.append(int(body.find(".//{*}Source/{*}SimpleItem").get("Value")))
    assert sorted(numbers) == sorted([1, *BURST, 2, 3])


def test_the_onvif_client_pulls_renews_and_unsubscribes_with_a_digest_token(
    camera: tuple[RunningServer, str],
) -> None:
    """``wsnmom.client.onvif``, which ONVIF pull mode uses, against the same camera: each
    operation with a PasswordDigest UsernameToken; a wrong password is refused."""
    camera_server, token = camera
    url = camera_server.base_url + "/onvif/event_service"
    motion = TopicExpression.parse("tns1:RuleEngine//.", {"tns1": ONVIF_TOPICS}, FULL)
    with (
        WsnClient(url, user="relay", password="nope", wsse="digest") as wrong,
        pytest.raises(AuthenticationFailed),
    ):
        OnvifEvents(wrong).create_pull_point_subscription(motion)
    with WsnClient(url, user="relay", password="cam-pw", wsse="digest") as client:
        sub = OnvifEvents(client).create_pull_point_subscription(
            motion, initial_termination_time=timedelta(seconds=30)
        )
        first_end = sub.termination_time
        assert first_end is not None
        assert sub.pull_messages(timedelta(0), CAMERA_LIMIT) == []
        _motion(camera_server, token, 7)
        (event,) = sub.pull_messages(timedelta(seconds=20), CAMERA_LIMIT)
        assert event.topic is not None and event.topic.text.endswith(MOTION)
        assert sub.renew(timedelta(minutes=10)) is not None
        assert sub.termination_time is not None and sub.termination_time > first_end
        with pytest.raises(SoapFault) as too_many:  # more than the camera gives at once
            sub.pull_messages(timedelta(0), CAMERA_LIMIT + 1)
        assert max_message_limit(too_many.value) == CAMERA_LIMIT
        sub.unsubscribe()
        with pytest.raises(SoapFault):
            sub.pull_messages(timedelta(0), 1)


#: the lifetime the relay asks of the camera: renewed when a third of it is left (3 s,
#: with a pass a second), long before the default check_interval (30 s) would renew it
SHORT_LIFETIME = 9


def test_onvif_pull_mode_renews_before_expiry_and_events_keep_flowing(
    workdir: Path, mqtt_url: str, camera: tuple[RunningServer, str]
) -> None:
    """The relay's pull-point subscription at the camera lives 9 s: the relay renews it
    (Renew with a PasswordDigest UsernameToken) before it expires, the camera keeps the one
    subscription, and events sent past its first and its second termination time reach
    MQTT, each once."""
    camera_server, token = camera
    held_before = _subscriptions_at(camera_server, token)  # the other tests' subscriptions
    with _relay_heard(mqtt_url, workdir) as (relay, got):
        _add_camera(
            relay,
            camera_server.base_url + "/onvif/event_service",
            f"tns1:{MOTION}",
            "--lifetime",
            f"PT{SHORT_LIFETIME}S",
        )
        first = _state(relay)
        first_end = datetime.fromisoformat(first["expires"])
        assert first["renews"] == 0 and first_end - datetime.now(UTC) <= timedelta(
            seconds=SHORT_LIFETIME
        )
        _motion(camera_server, token, 1)
        wait_until(lambda: len(got) == 1, timeout=30, what="the first motion event in MQTT")

        # past the first termination time, renewed: the next event still comes through
        wait_until(
            lambda: datetime.now(UTC) > first_end and _state(relay)["renews"] >= 1,
            timeout=60,
            what="the first termination time to pass",
        )
        renewed = _state(relay)
        assert datetime.fromisoformat(renewed["expires"]) > first_end
        _motion(camera_server, token, 2)
        wait_until(lambda: len(got) == 2, timeout=30, what="the event after the first Renew")

        # and past the renewed termination time too
        second_end = datetime.fromisoformat(renewed["expires"])
        wait_until(
            lambda: datetime.now(UTC) > second_end and _state(relay)["renews"] >= 2,
            timeout=60,
            what="the renewed termination time to pass",
        )
        _motion(camera_server, token, 3)
        wait_until(lambda: len(got) == 3, timeout=30, what="the event after the second Renew")
        # the sentinel: a fourth event after them, so a duplicate would be in by now
        _motion(camera_server, token, 4)
        wait_until(lambda: len(got) >= 4, timeout=30, what="the sentinel")

        final = _state(relay)
        assert (final["state"], final["subscribes"], final["error"]) == ("subscribed", 1, None)
        # renewed, never made again
        assert _subscriptions_at(camera_server, token) == held_before + 1
    numbers = [
        int(etree.fromstring(m.payload).find(".//{*}Source/{*}SimpleItem").get("Value"))
        for m in got
    ]
    assert numbers == [1, 2, 3, 4]
    assert all(m.topic.endswith("/" + MOTION) for m in got)
