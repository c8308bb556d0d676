"""Upstream subscriptions (wsnmom.upstreams, docs/federation.md) between two real gateways:
one on Kafka relays a topic tree of another on the embedded middleware.  A SOAP publisher
sends to the remote gateway; a native Kafka consumer reads the notifications from the
relaying gateway's Kafka topics.  The remote gateway restarted without its data (a
producer that forgot its subscriptions) is subscribed to again; nothing arrives twice.
Run-time upstreams (``wsnmom upstream add|list|remove``) are kept in the store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from lxml import etree

from tests.fixtures.server import RunningServer, kafka_gateway_url
from tests.support.cli import wsnmom_in_process
from tests.support.waiting import wait_until
from wsnmom.client import NotificationConsumer, WsnClient

pytestmark = [pytest.mark.e2e]

PLANT = "urn:example:plant"
#: the namespace the relayed topics appear under (Kafka topics without a root level)
NATIVE = "urn:wsnmom:native"
API = "/wsn/admin/api"


def _embedded(data_dir: Path, port: int = 0) -> RunningServer:
    return RunningServer("embedded", f"embedded://{data_dir / 'middleware'}", data_dir, port=port)


def _upstreams(server: RunningServer) -> dict[str, dict[str, Any]]:
    resp = requests.get(server.base_url + API + "/upstreams", timeout=10)
    resp.raise_for_status()
    return {u["name"]: u for u in resp.json()["upstreams"]}


def _upstream(server: RunningServer, name: str) -> dict[str, Any]:
    """The listing of upstream ``name``; an upstream added a moment ago may not be listed
    yet (the relay takes up new entries of the store on its next pass): then "absent"."""
    absent = {"state": "absent", "relayed": 0, "subscribes": 0, "error": None}
    return _upstreams(server).get(name, absent)


def _publish(remote: RunningServer, numbers: range) -> None:
    with WsnClient(remote.broker_url, namespaces={"tns": PLANT}) as wsn:
        for i in numbers:
            wsn.notify(f'<n xmlns="urn:n">{i}</n>', "tns:plant/line1/temperature")


@pytest.fixture
def remote_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wsnmom-upstream-remote-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def relay_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wsnmom-upstream-relay-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.kafka
def _restarted_empty(
    remote: RunningServer, remote_dir: Path, relay: RunningServer, name: str, what: str
) -> RunningServer:
    """``remote`` started again on its port without its data (it forgot what the relay
    made there), once the relay's upstream ``name`` subscribed a second time (``what``)."""
    remote.stop()
    shutil.rmtree(remote_dir / "a", ignore_errors=True)
    remote = _embedded(remote_dir / "b", port=remote.port)
    remote.start()
    wait_until(
        lambda: (
            _upstream(relay, name)["subscribes"] == 2
            and _upstream(relay, name)["state"] == "subscribed"
        ),
        timeout=60,
        what=what,
    )
    return remote


def test_kafka_gateway_relays_a_remote_topic_tree_and_resubscribes_after_a_restart(
    remote_dir: Path, relay_dir: Path, kafka_url: str, kafka_bootstrap: str
) -> None:
    kafka = pytest.importorskip("confluent_kafka")
    remote = _embedded(remote_dir / "a")
    remote.start()
    tag = uuid.uuid4().hex[:10]
    config = relay_dir / "wsnmom.toml"
    config.write_text(
        "[[upstream]]\n"
        'name = "plant"\n'
        f'url = "{remote.broker_url}"\n'
        'topic = "tns:plant//."\n'
        'dialect = "full"\n'
        f'namespaces = {{ tns = "{PLANT}" }}\n'
        f'namespace = "{NATIVE}"\n'
        'check_interval = "1"\n'
        'max_backoff = "1"\n'
    )
    relay = RunningServer(
        "kafka",
        kafka_gateway_url(kafka_url, tag),
        relay_dir / "data",
        extra_env={"WSNMOM_CONFIG": str(config)},
    )
    relay.start()
    consumer = kafka.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex})
    try:
        wait_until(
            lambda: _upstream(relay, "plant")["state"] == "subscribed",
            timeout=30,
            what="the subscription at the remote gateway",
        )
        _publish(remote, range(0, 20))
        wait_until(lambda: _upstream(relay, "plant")["relayed"] == 20, timeout=30)

        # the remote gateway restarts without its data: it forgot the subscription
        remote = _restarted_empty(remote, remote_dir, relay, "plant", "the second subscription")
        _publish(remote, range(20, 40))

        consumer.assign([kafka.TopicPartition(f"g{tag}.plant.line1.temperature", 0, 0)])
        seen: Counter[int] = Counter()
        headers: dict[str, str] = {}

        def read_all() -> bool:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                body = etree.fromstring(record.value())
                seen[int(body.text or -1)] += 1
                headers.update({k: (v or b"").decode() for k, v in record.headers() or []})
            return sum(seen.values()) >= 40

        wait_until(read_all, timeout=60, what="40 records in Kafka")
        assert sorted(seen) == list(range(40))
        assert set(seen.values()) == {1}  # nothing twice
        assert headers["wsnmom-topic-ns"] == NATIVE
        assert headers["wsnmom-topic-path"] == "plant/line1/temperature"
        # the relay counts a Notify once Kafka confirmed it, which can be after a reader
        # saw the records: wait for the count, then for the metric counted after it
        wait_until(lambda: _upstream(relay, "plant")["relayed"] == 40, 30, what="40 counted")
        state = _upstream(relay, "plant")
        assert (state["relayed"], state["source"], state["error"]) == (40, "config", None)
        relayed = 'wsnmom_upstream_relayed_total{upstream="plant"} 40.0'

        def counted() -> str | None:
            text = requests.get(relay.base_url + "/metrics", timeout=10).text
            return text if relayed in text else None

        metrics = wait_until(counted, 30, what="40 in the relayed metric")
        assert 'wsnmom_upstream_up{upstream="plant"} 1.0' in metrics
    finally:
        consumer.close()
        relay.stop()
        remote.stop()


def _cli_process(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``wsnmom ARGS --broker`` the gateway, as a process of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSNMOM_")}
    return subprocess.run(
        [sys.executable, "-m", "wsnmom", *args, "--broker", server.broker_url],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """The same in this process (the add above runs the command as a real process)."""
    return wsnmom_in_process(*args, "--broker", server.broker_url)


def test_upstreams_added_at_run_time_are_kept_and_removed(
    remote_dir: Path, relay_dir: Path
) -> None:
    remote = _embedded(remote_dir)
    remote.start()
    relay = _embedded(relay_dir)
    relay.start()
    try:
        added = _cli_process(
            relay,
            "upstream",
            "add",
            "alarms",
            remote.broker_url,
            "--topic",
            "tns:alarms",
            "--topic-ns",
            f"tns={PLANT}",
        )
        assert added.returncode == 0, added.stderr
        wait_until(lambda: _upstream(relay, "alarms")["state"] == "subscribed", timeout=30)
        taken = _cli(relay, "upstream", "add", "alarms", remote.broker_url)
        assert taken.returncode == 1 and "already" in taken.stderr

        # kept in the store: a restarted gateway subscribes again
        relay.stop()
        relay.start()
        # the count goes up a moment before the state says so: wait for both
        wait_until(
            lambda: (
                _upstream(relay, "alarms")["subscribes"] == 1
                and _upstream(relay, "alarms")["state"] == "subscribed"
            ),
            timeout=30,
        )
        listed = _cli(relay, "upstream", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        # the admin page shows it (filled in by the server, before any script runs)
        page = requests.get(relay.base_url + "/admin", timeout=10).text
        assert 'data-key="alarms"' in page and "subscribed (push)" in page
        overview = requests.get(relay.base_url + API + "/overview", timeout=10).json()
        assert [u["name"] for u in overview["upstreams"]] == ["alarms"]
        (entry,) = json.loads(listed.stdout)["upstreams"]
        assert (entry["name"], entry["source"], entry["topic"]) == ("alarms", "store", "tns:alarms")
        with WsnClient(remote.broker_url, namespaces={"tns": PLANT}) as wsn:
            wsn.notify('<a xmlns="urn:a">fire</a>', "tns:alarms")
            wait_until(lambda: _upstream(relay, "alarms")["relayed"] == 1, timeout=30)
            removed = _cli(relay, "upstream", "remove", "alarms")
            assert removed.returncode == 0, removed.stderr
            assert _upstreams(relay) == {}
            # the subscription at the remote gateway ended with it
            admin = requests.get(remote.base_url + API + "/subscriptions", timeout=10).json()
            assert admin["count"] == 0
    finally:
        relay.stop()
        remote.stop()


def _add(server: RunningServer, **upstream: str) -> None:
    resp = requests.post(server.base_url + API + "/upstreams", json=upstream, timeout=10)
    assert resp.status_code == 200, resp.text


def _rejected_loops(server: RunningServer) -> float:
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith('wsnmom_notifications_rejected_total{reason="loop"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_gateways_relaying_each_other_deliver_once_and_a_relay_to_itself_is_refused(
    remote_dir: Path, relay_dir: Path
) -> None:
    a, b = _embedded(remote_dir), _embedded(relay_dir)
    a.extra_env["WSNMOM_LOOPS__GATEWAY_ID"] = "gw-a"
    b.extra_env["WSNMOM_LOOPS__GATEWAY_ID"] = "gw-b"
    a.start()
    b.start()
    try:
        _add(a, name="from-b", url=b.broker_url, topic="tns:t", namespaces={"tns": PLANT})
        _add(b, name="from-a", url=a.broker_url, topic="tns:t", namespaces={"tns": PLANT})
        _add(a, name="self", url=a.broker_url, topic="tns:t", namespaces={"tns": PLANT})
        wait_until(lambda: _upstreams(a)["from-b"]["state"] == "subscribed", timeout=30)
        wait_until(lambda: _upstreams(b)["from-a"]["state"] == "subscribed", timeout=30)
        with (
            NotificationConsumer() as inbox,
            WsnClient(a.broker_url, namespaces={"tns": PLANT}) as at_a,
            WsnClient(b.broker_url, namespaces={"tns": PLANT}) as at_b,
        ):
            at_a.subscribe(inbox, "tns:t")
            at_a.notify('<m xmlns="urn:m">x</m>', "tns:t")
            # x went a -> b -> back to a, where the hop marker drops it
            wait_until(lambda: _rejected_loops(a) == 1, timeout=30, what="x dropped at a")
            at_b.notify('<m xmlns="urn:m">sentinel</m>', "tns:t")
            wait_until(lambda: _rejected_loops(b) == 1, timeout=30, what="sentinel dropped at b")
            got = inbox.wait_for(2, timeout=30)
            assert sorted(n.payload.text or "" for n in got) == ["sentinel", "x"]
            assert inbox.drain() == []
        assert (_upstreams(a)["from-b"]["relayed"], _upstreams(b)["from-a"]["relayed"]) == (2, 2)
        # a relay to the gateway itself never subscribes: its consumer address is its own
        own = _upstream(a, "self")
        assert (own["state"], own["subscribes"]) == ("retrying", 0)
        assert "own endpoint" in own["error"], own
    finally:
        a.stop()
        b.stop()


def test_pull_mode_takes_from_a_pull_point_at_the_producer_and_recreates_it(
    remote_dir: Path, relay_dir: Path
) -> None:
    remote = _embedded(remote_dir / "a")
    remote.start()
    relay = _embedded(relay_dir)
    relay.start()
    try:
        _add(
            relay,
            name="polled",
            url=remote.broker_url,
            mode="pull",
            topic="tns:t",
            namespaces={"tns": PLANT},
            check_interval="1",
            max_backoff="1",
        )
        wait_until(lambda: _upstream(relay, "polled")["state"] == "subscribed", timeout=30)
        # the producer holds a pull point and a subscription feeding it, nothing else
        listing = requests.get(remote.base_url + API + "/pullpoints", timeout=10).json()
        assert listing["count"] == 1
        with (
            NotificationConsumer() as inbox,
            WsnClient(relay.broker_url, namespaces={"tns": PLANT}) as at_relay,
        ):
            at_relay.subscribe(inbox, "tns:t")
            _notify_range(remote, range(0, 5))
            first = inbox.wait_for(5, timeout=30)
            # the producer restarts without its data: the pull point is gone
            remote = _restarted_empty(
                remote, remote_dir, relay, "polled", "a new pull point and subscription"
            )
            _notify_range(remote, range(5, 10))
            second = inbox.wait_for(5, timeout=30)
            got = [int(n.payload.text or -1) for n in [*first, *second]]
            assert sorted(got) == list(range(10))
            assert inbox.drain() == []
    finally:
        relay.stop()
        remote.stop()


def _notify_range(remote: RunningServer, numbers: range) -> None:
    with WsnClient(remote.broker_url, namespaces={"tns": PLANT}) as wsn:
        for i in numbers:
            wsn.notify(f'<n xmlns="urn:n">{i}</n>', "tns:t")


def test_credentials_at_the_producer_usernametoken_digest_and_bearer(
    remote_dir: Path, relay_dir: Path
) -> None:
    """A producer that requires authentication, as ONVIF devices do (UsernameToken with
    PasswordDigest): the right credentials subscribe, wrong ones are reported."""
    users = remote_dir / "users.toml"
    users.write_text(
        f'[users.camera]\nwsse_password = "camera-pw"\nsubscribe = ["{{{PLANT}}}camera//."]\n'
    )
    users.chmod(0o600)
    token = "admin-" + uuid.uuid4().hex
    remote = RunningServer(
        "embedded",
        f"embedded://{remote_dir / 'middleware'}",
        remote_dir,
        extra_env={"WSNMOM_AUTH__ADMIN_TOKEN": token, "WSNMOM_AUTH__USERS_FILE": str(users)},
    )
    remote.start()
    relay = _embedded(relay_dir)
    relay.start()
    try:
        common = {"url": remote.broker_url, "namespaces": {"tns": PLANT}, "max_backoff": "1"}
        _add(
            relay,
            name="cam",
            topic="tns:camera//.",
            dialect="full",
            user="camera",
            password="camera-pw",
            wsse="digest",
            **common,
        )
        _add(relay, name="bearer", topic="tns:plant//.", dialect="full", token=token, **common)
        wrong_password = {"user": "camera", "password": "nope", "wsse": "digest"}
        _add(relay, name="wrong", topic="tns:camera//.", dialect="full", **wrong_password, **common)
        wait_until(lambda: _upstream(relay, "cam")["state"] == "subscribed", timeout=30)
        wait_until(lambda: _upstream(relay, "bearer")["state"] == "subscribed", timeout=30)
        wait_until(lambda: (_upstream(relay, "wrong")["error"] or "") != "", timeout=30)
        wrong = _upstream(relay, "wrong")
        assert (wrong["state"], wrong["subscribes"]) == ("retrying", 0)
        assert "could not be authenticated" in wrong["error"], wrong
        assert _upstream(relay, "cam")["auth"] == "wsse-digest"
        assert "camera-pw" not in json.dumps(_upstreams(relay))
        with WsnClient(remote.broker_url, namespaces={"tns": PLANT}, token=token) as wsn:
            wsn.notify('<motion xmlns="urn:onvif-like">true</motion>', "tns:camera/motion")
            wsn.notify('<t xmlns="urn:t">21.5</t>', "tns:plant/temperature")
        wait_until(lambda: _upstream(relay, "cam")["relayed"] == 1, timeout=30)
        wait_until(lambda: _upstream(relay, "bearer")["relayed"] == 1, timeout=30)
    finally:
        relay.stop()
        remote.stop()
