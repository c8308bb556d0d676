"""The shell client's operator commands against the real gateway (one shared embedded
gateway without authentication: the local operator reads and acts): ``current``,
``subscriptions pause|resume|purge``, ``pull-points list|show|purge``, ``registrations
list``, ``topics list``, and ``WSNMOM_BROKER`` instead of ``--broker``."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from tests.fixtures.server import RunningServer
from tests.support.waiting import wait_until
from wsnmom.cli import cli
from wsnmom.client import WsnClient

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("wsnmom_server", ["embedded"], indirect=True),
]

NOBODY = "http://127.0.0.1:9/nobody-listens"


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _api(server: RunningServer, path: str) -> Any:
    return requests.get(f"{server.base_url}/wsn/admin/api{path}", timeout=10).json()


@pytest.fixture
def ns() -> str:
    return f"urn:test:shell-admin:{uuid.uuid4().hex[:10]}"


def test_current_prints_the_last_message_and_fails_without_one(
    wsnmom_server: RunningServer, ns: str
) -> None:
    broker = ["--broker", wsnmom_server.broker_url, "--ns", f"t={ns}"]
    code, _, err = run("current", *broker, "t:line/temp")
    assert code == 1 and "NoCurrentMessageOnTopicFault" in err
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        client.notify("<c>20</c>", "t:line/temp")
        client.notify("<c>21</c>", "t:line/temp")
    code, out, err = run("current", *broker, "t:line/temp")
    assert code == 0, err
    assert out == f"{{{ns}}}line/temp <c>21</c>\n"
    # the broker from the environment, JSON output
    env = {"WSNMOM_BROKER": wsnmom_server.broker_url}
    code, out, err = run("current", "--format", "json", f"{{{ns}}}line/temp", env=env)
    assert code == 0, err
    assert json.loads(out)["payload"] == "<c>21</c>"


def test_subscriptions_pause_resume_and_purge(wsnmom_server: RunningServer, ns: str) -> None:
    broker = ["--broker", wsnmom_server.broker_url]
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        sub = client.subscribe(NOBODY, "t:a")
        code, out, err = run("subscriptions", "pause", *broker, sub.id)
        assert code == 0, err
        assert out == f"paused {sub.address}\n"
        assert _api(wsnmom_server, f"/subscriptions/{sub.id}")["state"] == "paused"
        client.notify_many([(f"<m>{i}</m>", "t:a") for i in range(3)])
        wait_until(
            lambda: _api(wsnmom_server, f"/subscriptions/{sub.id}")["backlog"] == 3,
            10,
            what="a backlog of 3",
        )
        code, out, err = run("subscriptions", "purge", *broker, "--yes", sub.address)
        assert code == 0, err
        assert out == f"purged {sub.id}: 3 message(s) dropped\n"
        assert _api(wsnmom_server, f"/subscriptions/{sub.id}")["backlog"] == 0
        code, out, err = run("subscriptions", "resume", *broker, sub.id)
        assert code == 0 and out == f"resumed {sub.address}\n", err
        assert _api(wsnmom_server, f"/subscriptions/{sub.id}")["state"] == "active"
        code, _, err = run("subscriptions", "purge", *broker, "--yes", "no-such-id")
        assert code == 1 and "no subscription 'no-such-id'" in err
        sub.unsubscribe()


def test_pull_points_list_show_purge(wsnmom_server: RunningServer, ns: str) -> None:
    broker = ["--broker", wsnmom_server.broker_url]
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        pp = client.create_pull_point()
        feeder = client.subscribe(pp.address, "t:b")
        client.notify_many([(f"<m>{i}</m>", "t:b") for i in range(2)])
        wait_until(
            lambda: any(
                p["id"] == pp.id and p["waiting"] == 2
                for p in _api(wsnmom_server, "/pullpoints")["pull_points"]
            ),
            10,
            what="2 messages waiting in the pull point",
        )
        code, out, err = run("pull-points", "list", *broker)
        assert code == 0, err
        header, *rows = out.splitlines()
        assert header.split() == ["ID", "WAITING", "FEEDING", "NAME", "ENDS"]
        (row,) = [r.split() for r in rows if r.startswith(pp.id)]
        assert row[1:3] == ["2", "1"]
        code, out, err = run("pull-points", "show", *broker, pp.address)
        assert code == 0, err
        assert "waiting:     2\n" in out and f"fed by:      {feeder.id}\n" in out
        code, out, err = run("pull-points", "show", *broker, "--json", pp.id)
        assert json.loads(out)["feeding"] == [feeder.id]
        code, out, err = run("pull-points", "purge", *broker, "--yes", pp.id)
        assert code == 0 and out == f"purged {pp.id}: 2 message(s) dropped\n", err
        assert pp.get_messages(10) == []
        code, _, err = run("pull-points", "show", *broker, "nope")
        assert code == 1 and "no pull point 'nope'" in err
        pp.destroy()


def test_registrations_and_topics_lists(wsnmom_server: RunningServer, ns: str) -> None:
    broker = ["--broker", wsnmom_server.broker_url]
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        reg = client.register_publisher("http://127.0.0.1:9/plc-7", ["t:c//*"], demand=False)
        client.notify_many([(f"<m>{i}</m>", "t:c/d") for i in range(4)])
        code, out, err = run("registrations", "list", *broker)
        assert code == 0, err
        (row,) = [r for r in out.splitlines() if r.startswith(reg.id)]
        assert "http://127.0.0.1:9/plc-7" in row and f"{{{ns}}}c//*" in row and " no " in row
        code, out, err = run("topics", "list", *broker)
        assert code == 0, err
        (row,) = [r.split() for r in out.splitlines() if r.startswith(f"{{{ns}}}c/d ")]
        assert row[1] == "4" and row[2].endswith("/s")
        code, out, err = run("topics", "list", *broker, "--json")
        (topic,) = [t for t in json.loads(out)["topics"] if t["namespace"] == ns]
        assert (topic["path"], topic["messages"]) == ("c/d", 4)
        reg.destroy()


def test_notify_sends_piped_json_as_json(wsnmom_server: RunningServer, ns: str) -> None:
    """Without --content-type the shell gives a payload the type native ingress would:
    JSON is application/json, other text text/plain, other bytes octet-stream."""
    from wsnmom.client import NotificationConsumer

    broker = ["--broker", wsnmom_server.broker_url, "--ns", f"t={ns}"]
    with (
        WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client,
        NotificationConsumer() as inbox,
    ):
        client.subscribe(inbox, "t:j")
        for data in (b'{"temp": 21.5}\n', b"plain words\n", b"\xff\x00\x01"):
            result = CliRunner().invoke(cli, ["notify", *broker, "t:j"], input=data)
            assert result.exit_code == 0, result.output
        received = inbox.wait_for(3)
    assert [(n.content_type, n.data) for n in received] == [
        ("application/json", b'{"temp": 21.5}'),
        ("text/plain", b"plain words"),
        ("application/octet-stream", b"\xff\x00\x01"),
    ]


def test_json_output_carries_message_id_timestamp_and_topic_namespace(
    wsnmom_server: RunningServer, ns: str
) -> None:
    """``--format json`` as ``kcat -J``: the gateway's message id and publication time (its
    ``wsnmom:Messages`` header of a push delivery), the topic with namespace and path."""
    from datetime import UTC, datetime, timedelta

    from wsnmom.client import NotificationConsumer
    from wsnmom.shell.common import render

    before = datetime.now(UTC) - timedelta(seconds=5)
    with (
        WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client,
        NotificationConsumer() as inbox,
    ):
        client.subscribe(inbox, "t:k//.")
        client.notify_many([("<m>1</m>", "t:k/a"), ("<m>2</m>", "t:k/b/c")])
        received = inbox.wait_for(2)
    records = [json.loads(render(n, "json")) for n in received]
    ids = [r["message_id"] for r in records]
    assert all(ids) and len(set(ids)) == 2
    for record, path in zip(records, ("k/a", "k/b/c"), strict=True):
        assert (record["namespace"], record["path"]) == (ns, path)
        assert record["topic"] == f"{{{ns}}}{path}"
        published = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
        assert before <= published <= datetime.now(UTC)
        assert record["headers"] == {}


def test_subscriptions_list_searches_sorts_and_pages(wsnmom_server: RunningServer, ns: str) -> None:
    broker = ["--broker", wsnmom_server.broker_url]
    tag = uuid.uuid4().hex[:8]
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        subs = [client.subscribe(f"http://127.0.0.1:9/{tag}-{n}", "t:s") for n in range(5)]
        code, out, err = run(
            "subscriptions", "list", *broker, "--search", tag, "--sort", "consumer", "--desc",
            "--offset", "1", "--limit", "2",
        )  # fmt: skip
        assert code == 0, err
        rows = out.splitlines()[1:]
        assert [r.split()[2] for r in rows] == [
            f"http://127.0.0.1:9/{tag}-3", f"http://127.0.0.1:9/{tag}-2",
        ]  # fmt: skip
        assert "5 match, from 2 to 3" in err
        for sub in subs:
            sub.unsubscribe()


def test_cluster_status_of_a_single_instance(wsnmom_server: RunningServer) -> None:
    """On a SQLite store the one instance leads and delivers every shard."""
    broker = ["--broker", wsnmom_server.broker_url]
    code, out, err = run("cluster", "status", *broker, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["shared"] is False and data["leader"] is True
    assert data["held"] == list(range(data["shards"])) and data["shards"] == 64
    assert [i["this"] for i in data["instances"]] == [True]
    assert data["instances"][0]["id"] == data["instance"]
    assert data["error"] == ""
    code, out, err = run("cluster", "status", *broker)
    assert code == 0, err
    header = "INSTANCE ADDRESS VERSION HEARTBEAT OWNS SHARDS LEASE LEFT"
    assert out.splitlines()[0].split() == header.split()
    assert f"{data['instance']}: single instance (SQLite store), 64 of 64 shards, leader" in out
    assert err == "1 instance(s)\n"
    # the overview carries it for the admin page, and /metrics the gauges
    assert _api(wsnmom_server, "/overview")["cluster"]["instance"] == data["instance"]
    text = requests.get(f"{wsnmom_server.base_url}/metrics", timeout=10).text
    assert "wsnmom_cluster_shards_owned 64.0" in text
    assert "wsnmom_cluster_leader 1.0" in text


def test_peek_prints_backlogs_without_consuming_them(wsnmom_server: RunningServer, ns: str) -> None:
    """``subscriptions peek``, ``pull-points peek`` and ``dead-letters peek``: the first
    messages, as ``pull`` prints them (line and JSON), and every one still there after."""
    broker = ["--broker", wsnmom_server.broker_url]
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        sub = client.subscribe(NOBODY, "t:p")
        sub.pause()
        client.notify_many([(f"<m>{i}</m>", "t:p") for i in range(3)])
        wait_until(
            lambda: _api(wsnmom_server, f"/subscriptions/{sub.id}")["backlog"] == 3,
            10,
            what="a backlog of 3",
        )
        code, out, err = run("subscriptions", "peek", *broker, "-n", "2", sub.address)
        assert code == 0, err
        assert out == f"{{{ns}}}p <m>0</m>\n{{{ns}}}p <m>1</m>\n"
        assert "2 message(s) shown, none consumed" in err
        code, out, err = run("subscriptions", "peek", *broker, "--format", "json", sub.id)
        assert code == 0, err
        records = [json.loads(line) for line in out.splitlines()]
        assert [r["payload"] for r in records] == ["<m>0</m>", "<m>1</m>", "<m>2</m>"]
        assert all(r["message_id"] and r["timestamp"] for r in records)
        assert {(r["namespace"], r["path"], r["where"]) for r in records} == {
            (ns, "p", "middleware")
        }
        assert _api(wsnmom_server, f"/subscriptions/{sub.id}")["backlog"] == 3
        code, _, err = run("subscriptions", "peek", *broker, "nope")
        assert code == 1 and "no subscription 'nope'" in err
        sub.unsubscribe()

        pp = client.create_pull_point()
        feeder = client.subscribe(pp.address, "t:q")
        client.notify_many([("<n>1</n>", "t:q"), ("<n>2</n>", "t:q")])
        wait_until(
            lambda: len(_api(wsnmom_server, f"/pullpoints/{pp.id}/peek")["messages"]) == 2,
            10,
            what="2 messages in the pull point",
        )
        code, out, err = run("pull-points", "peek", *broker, "--format", "xml", pp.address)
        assert code == 0, err
        assert out == "<n>1</n>\n<n>2</n>\n"
        assert [n.payload_xml for n in pp.get_messages(10)] == [b"<n>1</n>", b"<n>2</n>"]
        feeder.unsubscribe()
        pp.destroy()
    code, out, err = run("dead-letters", "peek", *broker, "-n", "3")
    assert code == 0, err
    assert "dead letter(s) shown, none consumed" in err
