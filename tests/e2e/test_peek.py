"""Peek on every middleware through a running gateway (issue 26): the first messages of a
paused subscription's backlog and of a pull point, read through the admin API without
consuming them, where the middleware allows it (embedded, filelog, Kafka, MQTT); where
it does not (RabbitMQ) the answer holds what the gateway has in memory and says why.
Either way every message is delivered afterwards, once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests

from tests.fixtures.server import RunningServer
from tests.support.ports import closed_port
from tests.support.waiting import wait_until
from wsnmom.client import NotificationConsumer, WsnClient

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize(
        "wsnmom_server", ["embedded", "filelog", "rabbitmq", "kafka", "mqtt"], indirect=True
    ),
]

#: the adapters whose middleware can be read without consuming (``Capabilities.peek``)
PEEKS = {"embedded", "filelog", "kafka", "mqtt"}


def _peek(server: RunningServer, path: str) -> dict[str, Any]:
    resp = requests.get(f"{server.base_url}/wsn/admin/api/{path}/peek?count=20", timeout=30)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _payloads(data: dict[str, Any]) -> list[str]:
    return [m["payload"] for m in data["messages"]]


def test_a_paused_backlog_is_shown_and_then_delivered_once(wsnmom_server: RunningServer) -> None:
    ns = f"urn:test:peek:{uuid.uuid4().hex[:10]}"
    bodies = [f"<v>{i}</v>" for i in range(3)]
    with (
        WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client,
        NotificationConsumer() as inbox,
    ):
        sub = client.subscribe(inbox, "t:p")
        sub.pause()
        client.notify_many([(b, "t:p") for b in bodies])
        if wsnmom_server.adapter in PEEKS:
            seen = wait_until(
                lambda: (
                    len(d := _peek(wsnmom_server, f"subscriptions/{sub.id}")["messages"]) == 3 and d
                ),
                30,
                what="the three messages waiting",
            )
            assert [m["payload"] for m in seen] == bodies  # one topic: one partition, in order
            assert {(m["where"], m["topic"]) for m in seen} == {("middleware", f"{{{ns}}}p")}
            again = _peek(wsnmom_server, f"subscriptions/{sub.id}")
            assert again["complete"] is True and _payloads(again) == bodies
        else:
            data = _peek(wsnmom_server, f"subscriptions/{sub.id}")
            assert (data["complete"], data["messages"]) == (False, [])
            assert "RabbitMQ" in data["note"] and "consum" in data["note"]
        sub.resume()
        got = inbox.wait_for(3, 30)
        assert [n.payload_xml.decode() for n in got] == bodies
        client.notify("<v>end</v>", "t:p")  # a sentinel: nothing came twice before it
        (last,) = inbox.wait_for(1, 30)
        assert last.payload_xml == b"<v>end</v>"
        sub.unsubscribe()


def test_what_the_gateway_holds_is_shown_on_every_middleware(
    wsnmom_server: RunningServer,
) -> None:
    """A consumer that is down: the batch being retried is in the gateway's memory and is
    the head of the backlog, shown also where the middleware cannot be read (RabbitMQ)."""
    ns = f"urn:test:peek:{uuid.uuid4().hex[:10]}"
    with closed_port() as port, WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        sub = client.subscribe(f"http://127.0.0.1:{port}/down", "t:h")
        client.notify("<h>1</h>", "t:h")
        held = wait_until(
            lambda: [
                m for m in _peek(wsnmom_server, f"subscriptions/{sub.id}")["messages"]
                if m["where"] == "gateway"
            ],
            30,
            what="the message held for delivery",
        )  # fmt: skip
        assert [m["payload"] for m in held] == ["<h>1</h>"]
        sub.unsubscribe()


def test_a_pull_point_is_shown_and_get_messages_still_takes_everything(
    wsnmom_server: RunningServer,
) -> None:
    ns = f"urn:test:peek:{uuid.uuid4().hex[:10]}"
    with WsnClient(wsnmom_server.broker_url, namespaces={"t": ns}) as client:
        pp = client.create_pull_point()
        feeder = client.subscribe(pp.address, "t:q")
        client.notify_many([("<q>1</q>", "t:q"), ("<q>2</q>", "t:q")])
        data = wait_until(
            lambda: len((d := _peek(wsnmom_server, f"pullpoints/{pp.id}"))["messages"]) == 2 and d,
            30,
            what="two messages in the pull point",
        )
        assert _payloads(data) == ["<q>1</q>", "<q>2</q>"]
        taken = pp.get_messages(10)
        assert [n.payload_xml for n in taken] == [b"<q>1</q>", b"<q>2</q>"]
        feeder.unsubscribe()
        pp.destroy()
