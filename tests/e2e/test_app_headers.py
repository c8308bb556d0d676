"""Application headers end to end, on every adapter: a Notify's ``wsnmom:Messages`` SOAP
header and its HTTP ``traceparent`` travel through the middleware to push consumers (the
``wsnmom:Messages`` block and the HTTP trace context) and to GetMessages (the same block in
the response); a header that breaks a rule is a fault and publishes nothing; the shell's
``notify --header`` and ``pull --format json`` carry them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from lxml import etree

from tests.fixtures.server import ConsumerServer, Received, RunningServer
from tests.support.soap import content_type, envelope, notify_body
from tests.support.waiting import wait_until
from wsnmom.cli import cli
from wsnmom.client import Message, WsnClient

from .conftest import Wsn

pytestmark = pytest.mark.e2e

WSNMOM = "urn:wsnmom:ns:1"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OWN_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _messages_block(*per_message: dict[str, str]) -> str:
    items = "".join(
        "<wsnmom:Message>"
        + "".join(f'<wsnmom:Header name="{k}">{v}</wsnmom:Header>' for k, v in h.items())
        + "</wsnmom:Message>"
        for h in per_message
    )
    return f'<wsnmom:Messages xmlns:wsnmom="{WSNMOM}">{items}</wsnmom:Messages>'


def _post_notify(wsn: Wsn, body: str, headers: str, http: dict[str, str] | None = None) -> int:
    data = envelope(body, headers=headers)
    resp = wsn.http.post(
        wsn.broker, data=data, headers={"Content-Type": content_type(), **(http or {})}
    )
    return resp.status_code


def _delivered(received: list[Received]) -> dict[str, tuple[dict[str, str], Received]]:
    """Payload text -> (its application headers, the request that carried it)."""
    out: dict[str, tuple[dict[str, str], Received]] = {}
    for rec in received:
        messages = rec.body_child.findall("{*}NotificationMessage")
        blocks = rec.header(f"{{{WSNMOM}}}Messages")
        infos = list(blocks[0]) if blocks else []
        assert len(infos) == len(messages)
        for message, info in zip(messages, infos, strict=True):
            payload = message.find("{*}Message")
            assert payload is not None
            text = "".join(payload.itertext())
            headers = {h.get("name") or "": h.text or "" for h in info}
            out[text] = (headers, rec)
    return out


def test_headers_reach_push_consumers_and_pull_points(
    wsnmom_server: RunningServer, wsn: Wsn, consumer: ConsumerServer
) -> None:
    wsn.subscribe(consumer.address(), "tns:hdr")
    with WsnClient(wsnmom_server.broker_url, namespaces={"tns": wsn.ns}, timeout=10) as client:
        pp = client.create_pull_point()
        client.subscribe(pp.address, "tns:hdr")
        body = notify_body(("tns:hdr", "<v>a</v>"), ("tns:hdr", "<v>b</v>"), ns=wsn.ns)
        block = _messages_block({"tenant": "t-a"}, {"traceparent": OWN_TRACEPARENT})
        status = _post_notify(wsn, body, block, {"traceparent": TRACEPARENT})
        assert status in (200, 202)

        wait_until(lambda: len(_delivered(consumer.received)) == 2, what="both pushed")
        pushed = _delivered(consumer.received)
        headers_a, request_a = pushed["a"]
        assert headers_a == {"tenant": "t-a", "traceparent": TRACEPARENT}
        assert pushed["b"][0] == {"traceparent": OWN_TRACEPARENT}  # its own wins
        # the trace context also travels as HTTP headers (of the first message of a batch)
        assert request_a.headers.get("traceparent") == TRACEPARENT

        pulled: list = []
        wait_until(
            lambda: pulled.extend(client.get_messages(pp)) or len(pulled) >= 2, what="both pulled"
        )
        by_payload = {"".join(n.payload.itertext()): n for n in pulled}
        assert by_payload["a"].app_headers == {"tenant": "t-a", "traceparent": TRACEPARENT}
        assert by_payload["b"].app_headers == {"traceparent": OWN_TRACEPARENT}
        assert all(n.message_id for n in pulled)


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (_messages_block({"x-death": "1"}), "reserved"),
        (_messages_block({"wsnmom-message-id": "forged"}), "reserved"),
        (_messages_block({"bad name": "1"}), "is not"),
        (_messages_block({"k": "1"}, {"k": "2"}, {"k": "3"}), "3 wsnmom:Message elements"),
    ],
)
def test_a_header_that_breaks_a_rule_is_a_fault_and_publishes_nothing(
    wsnmom_server: RunningServer, wsn: Wsn, block: str, words: str
) -> None:
    with WsnClient(wsnmom_server.broker_url, namespaces={"tns": wsn.ns}, timeout=10) as client:
        pp = client.create_pull_point()
        client.subscribe(pp.address, "tns:bad")
        body = notify_body(("tns:bad", "<v>refused</v>"), ("tns:bad", "<v>too</v>"), ns=wsn.ns)
        data = envelope(body, headers=block)
        resp = wsn.http.post(wsn.broker, data=data, headers={"Content-Type": content_type()})
        assert resp.status_code == 500, resp.content
        reason = etree.fromstring(resp.content).findtext(".//{*}Description") or ""
        assert words in reason
        # the sentinel, published after the refused Notify, is all the pull point gets
        client.notify("<v>sentinel</v>", "tns:bad")
        pulled: list = []
        wait_until(
            lambda: (
                pulled.extend(client.get_messages(pp))
                or any("".join(n.payload.itertext()) == "sentinel" for n in pulled)
            ),
            what="the sentinel",
        )
        assert ["".join(n.payload.itertext()) for n in pulled] == ["sentinel"]


@pytest.mark.parametrize("wsnmom_server", ["embedded"], indirect=True)
def test_the_shell_sends_and_shows_headers(wsnmom_server: RunningServer, wsn: Wsn) -> None:
    with WsnClient(wsnmom_server.broker_url, namespaces={"tns": wsn.ns}, timeout=10) as client:
        pp = client.create_pull_point()
        client.subscribe(pp.address, "tns:cli")
        client.notify_many([Message("<v>lib</v>", "tns:cli", headers={"via": "library"})])
    runner = CliRunner()
    broker = ["--broker", wsnmom_server.broker_url, "--ns", f"t={wsn.ns}"]
    sent = runner.invoke(cli, ["notify", *broker, "-H", "tenant=t1", "t:cli", "<v>cli</v>"])
    assert sent.exit_code == 0, sent.output
    refused = runner.invoke(cli, ["notify", *broker, "-H", "x-death=1", "t:cli", "<v>no</v>"])
    assert refused.exit_code == 2 and "reserved" in refused.output
    records: list[dict] = []

    def pull() -> bool:
        result = runner.invoke(cli, ["pull", *broker, "--format", "json", pp.address])
        assert result.exit_code == 0, result.output
        records.extend(json.loads(line) for line in result.stdout.splitlines() if line)
        return len(records) >= 2

    wait_until(pull, what="both messages pulled")
    by_payload = {r["payload"]: r for r in records}
    assert by_payload["<v>lib</v>"]["headers"] == {"via": "library"}
    assert by_payload["<v>cli</v>"]["headers"] == {"tenant": "t1"}
    assert all(r["message_id"] and r["timestamp"] for r in records)
