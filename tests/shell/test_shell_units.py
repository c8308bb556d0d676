"""The shell client without a gateway: progress output, `subscriptions list` against a
stand-in admin API."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.support.threads import serve


def test_live_count_of_redirected_output() -> None:
    from wsnmom.shell.common import LiveCount

    now = [0.0]
    runner = CliRunner()
    with runner.isolation() as (_, err, _):
        live = LiveCount(enabled=True, every=1.0, clock=lambda: now[0])
        live.add()  # drawn: the first
        live.add(5)  # not yet: within a second
        now[0] = 1.5
        live.add()  # drawn
        live.add()
        live.close()  # the final count, then a newline
        shown = err.getvalue().decode()
    assert shown == (
        "\rreceived 1 notification(s)\rreceived 7 notification(s)\rreceived 8 notification(s)\n"
    )
    with runner.isolation() as (_, err, _):
        quiet = LiveCount(enabled=False)
        quiet.add(3)
        quiet.close()
        assert err.getvalue() == b"" and quiet.count == 3


def test_subscriptions_list_columns_and_credentials(monkeypatch: object) -> None:
    """The listing's columns (backlog, deliveries, failures) from the API's JSON; the
    credentials (``--token`` or ``$WSN_TOKEN``) go out as a bearer token; a 403 says what
    the API answers."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from wsnmom.cli import cli

    listing = {
        "count": 1,
        "subscriptions": [
            {
                "id": "s1",
                "state": "active",
                "consumer": "http://127.0.0.1:9/c",
                "topic": None,
                "backlog": 4,
                "delivery": {"delivered": 7, "failures": 2},
                "terminates": None,
                "pull_point": None,
            }
        ],
    }

    class Admin(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.headers.get("Authorization") == "Bearer sixteen-chars-token"
            body = json.dumps(listing if ok else {"error": "no"}).encode()
            self.send_response(200 if ok else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    serve(server)
    broker = f"http://127.0.0.1:{server.server_address[1]}/wsn/broker"
    try:
        runner = CliRunner()
        refused = runner.invoke(cli, ["subscriptions", "list", "--broker", broker], env={})
        assert refused.exit_code == 1 and "it answers admins only" in refused.stderr
        for args, env in (
            (["--token", "sixteen-chars-token"], {}),
            ([], {"WSN_TOKEN": "sixteen-chars-token"}),
            # the gateway's own admin token variable, for a gateway on a loopback address
            ([], {"WSNMOM_AUTH__ADMIN_TOKEN": "sixteen-chars-token"}),
            # and the broker from the environment
            (["--broker", broker], {"WSNMOM_AUTH__ADMIN_TOKEN": "sixteen-chars-token"}),
        ):
            ok = runner.invoke(cli, ["subscriptions", "list", "--broker", broker, *args], env=env)
            assert ok.exit_code == 0, ok.output
            header, row = ok.stdout.splitlines()
            assert header.split() == [
                "ID", "STATE", "CONSUMER", "TOPIC", "BACKLOG", "DELIVERED", "FAILURES", "ENDS",
            ]  # fmt: skip
            assert row.split() == ["s1", "failing", "http://127.0.0.1:9/c", "(all)", "4", "7", "2", "never"]  # fmt: skip  # noqa: E501
    finally:
        server.shutdown()
        server.server_close()


def test_the_admin_token_variable_goes_to_loopback_gateways_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from wsnmom.shell.admin import _credentials

    monkeypatch.setenv("WSNMOM_AUTH__ADMIN_TOKEN", "sixteen-chars-token")
    for local in (
        "http://127.0.0.1:8080/wsn/broker",
        "http://[::1]:1/wsn/broker",
        "http://localhost/",
    ):
        given = _credentials(local)
        assert given is not None and given.token == "sixteen-chars-token"
    for remote in ("http://gw.example:8080/wsn/broker", "https://10.0.0.5/wsn/broker"):
        assert _credentials(remote) is None
