"""The shell client (``wsnmom notify|subscribe|pull|subscriptions|check``) against the real
gateway: click's runner for the one-shot commands, subprocesses for the long-running ones
(``subscribe --print`` until Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.e2e.conftest import Wsn
from tests.fixtures.server import RunningServer, free_port
from tests.support.waiting import wait_until
from wsnmom.cli import cli
from wsnmom.client import (
    ONVIF_CONCRETE_SET,
    NotificationConsumer,
    ResourceUnknownFault,
    WsnClient,
)

# one adapter is enough: these tests are about the shell client, not the middleware
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("wsnmom_server", ["embedded"], indirect=True),
]


def run(*args: str, input: str | bytes | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def opts(wsnmom_server: RunningServer, wsn: Wsn) -> list[str]:
    return ["--broker", wsnmom_server.broker_url, "--ns", f"t={wsn.ns}"]


class Lines:
    """A subprocess's stdout and stderr, read line by line in background threads."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _read(stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append(line.rstrip("\n"))

    def wait_err(self, text: str, timeout: float = 15) -> str:
        return str(
            wait_until(
                lambda: next((line for line in self.err if text in line), None),
                timeout,
                what=f"{text!r} on stderr (stderr: {self.err})",
            )
        )


#: runs ``python -m wsnmom ARGS`` with Ctrl-C (SIGINT) acting as at a terminal: a child
#: inherits an ignored or blocked SIGINT from its parent, and in full runs the pytest worker
#: that spawns it had, at times, SIGINT ignored or blocked by then (twice the CLI never saw
#: the signal; which earlier test leaves it so is not known yet)
_INTERRUPTIBLE = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "sys.argv[0] = 'wsnmom'; "
    "runpy.run_module('wsnmom', run_name='__main__', alter_sys=True)"
)


@pytest.fixture
def spawn() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> Lines:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WSNMOM_")}
        proc = subprocess.Popen(
            [sys.executable, "-c", _INTERRUPTIBLE, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(proc)
        return Lines(proc)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _admin_ids(server: RunningServer) -> set[str]:
    data = requests.get(server.base_url + "/wsn/admin/api/subscriptions", timeout=5).json()
    return {s["id"] for s in data["subscriptions"]}


# --- notify -----------------------------------------------------------------------------------
def test_notify_argument_and_stdin(
    opts: list[str], client: WsnClient, inbox: NotificationConsumer
) -> None:
    client.subscribe(inbox, "t:cli//.", namespaces={"t": client.namespaces["tns"]})
    code, _, err = run("notify", *opts, "t:cli/a", "<reading unit='C'>21</reading>")
    assert code == 0 and "sent 1 notification(s)" in err
    code, _, _ = run("notify", *opts, "t:cli/b", input="plain words\n")
    assert code == 0
    xml, text = inbox.wait_for(2)
    assert xml.payload.tag == "reading" and xml.payload.get("unit") == "C"
    assert str(xml.topic) == "{" + client.namespaces["tns"] + "}cli/a"
    assert text.is_native and text.data == b"plain words" and text.content_type == "text/plain"


def test_notify_lines_from_file_with_progress(
    opts: list[str], client: WsnClient, inbox: NotificationConsumer, tmp_path: Path
) -> None:
    client.subscribe(inbox, "tns:bulk")
    source = tmp_path / "events.txt"
    source.write_text("".join(f"<e n='{i}'/>\n" for i in range(250)) + "\n")
    code, _, err = run(
        "notify", *opts, "--ns", f"tns={client.namespaces['tns']}", "tns:bulk",
        "--lines", "-f", str(source), "--batch", "100",
    )  # fmt: skip
    assert code == 0, err
    for count in (100, 200, 250):
        assert f"sent {count} notification(s)" in err
    assert "sent 250 notification(s) in " in err
    got = inbox.wait_for(250, timeout=30)
    assert [n.payload.get("n") for n in got] == [str(i) for i in range(250)]


def test_notify_refusals(opts: list[str], wsnmom_server: RunningServer) -> None:
    code, _, err = run("notify", *opts, "nope:a", "<x/>")
    assert code == 2 and "undeclared prefix" in err
    code, _, err = run("notify", *opts, "t:a", "<x/>", "-f", "-", input="<y/>")
    assert code == 2 and "not both" in err
    code, _, err = run("notify", *opts, "t:a[", "<x/>")
    assert code == 1 and "InvalidTopicExpressionFault" in err
    code, _, err = run("notify", *opts, "t:a", "no xml", "--content-type", "application/xml")
    assert code == 2 and "not one XML element" in err
    dead = f"http://127.0.0.1:{free_port()}/wsn/broker"
    code, _, err = run("notify", "--broker", dead, "{urn:x}a", "<x/>")
    assert code == 1 and "cannot reach" in err and "Traceback" not in err
    assert err.count("\n") <= 3


# --- subscribe --------------------------------------------------------------------------------
def test_subscribe_print_until_ctrl_c(
    spawn: object, opts: list[str], client: WsnClient, wsnmom_server: RunningServer
) -> None:
    proc: Lines = spawn("subscribe", *opts, "--print", "t:live//*")  # type: ignore[operator]
    line = proc.wait_err("listening at")
    sub_address = line.split("(subscription ")[1].rstrip(")")
    sub_id = sub_address.rsplit("/", 1)[1]
    assert sub_id in _admin_ids(wsnmom_server)
    client.notify("<one>1</one>", "tns:live/a")
    client.notify("<two>2</two>", "tns:live/b/c")
    wait_until(lambda: len(proc.out) >= 2, 10, what="two printed notifications")
    ns = client.namespaces["tns"]
    assert proc.out[:2] == [f"{{{ns}}}live/a <one>1</one>", f"{{{ns}}}live/b/c <two>2</two>"]
    # what a spawned child would inherit, should the signal go unseen again
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc.proc.send_signal(signal.SIGINT)
    # the Unsubscribe is a round trip to the gateway, which a loaded CI machine stretched
    # past 15 s once (with the exit after it); the exit alone is quick
    try:
        proc.wait_err("unsubscribed", 30)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (SIGINT in this worker: {inherited})") from None
    proc.wait_err("received 2 notification(s)")
    assert proc.proc.wait(15) == 0, proc.err
    assert sub_id not in _admin_ids(wsnmom_server)


def test_subscribe_print_pull_json_with_count(
    spawn: object, opts: list[str], client: WsnClient
) -> None:
    proc: Lines = spawn(  # type: ignore[operator]
        "subscribe", *opts, "--print", "--pull", "--interval", "0.2", "-C", "2",
        "--format", "json", "t:pulled",
    )  # fmt: skip
    line = proc.wait_err("pulling from")
    pp_address = line.split("pulling from ")[1].split(" ")[0]
    client.notify_many([("<a/>", "tns:pulled"), ("<b/>", "tns:pulled")])
    assert proc.proc.wait(20) == 0
    records = [json.loads(line) for line in proc.out]
    assert [r["payload"] for r in records] == ["<a/>", "<b/>"]
    assert records[0]["topic"] == "{" + client.namespaces["tns"] + "}pulled"
    assert records[0]["subscription"] and not records[0]["raw"]
    proc.wait_err("destroyed the pull point")
    with pytest.raises(ResourceUnknownFault):
        client.get_messages(pp_address)


def test_subscribe_consumer_then_subscriptions_commands(
    opts: list[str], inbox: NotificationConsumer, wsnmom_server: RunningServer, wsn: Wsn
) -> None:
    code, out, err = run(
        "subscribe", *opts, "--consumer", inbox.address, "--message-content", "boolean(/x)",
        "t:managed",
    )  # fmt: skip
    assert code == 0, err
    address = out.strip()
    sub_id = address.rsplit("/", 1)[1]
    assert f"id {sub_id}" in err

    code, out, _ = run("subscriptions", "list", *opts)
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[4:] == ["BACKLOG", "DELIVERED", "FAILURES", "ENDS"]
    row = next(line for line in out.splitlines() if line.startswith(sub_id)).split()
    assert row[1:4] == ["active", inbox.address, "{" + wsn.ns + "}managed"]
    assert row[4:7] == ["0", "0", "0"]
    code, out, _ = run("subscriptions", "list", *opts, "--json")
    listed = {s["id"]: s for s in json.loads(out)["subscriptions"]}
    assert listed[sub_id]["message_content"]["text"] == "boolean(/x)"

    code, out, _ = run("subscriptions", "show", *opts, sub_id)
    assert code == 0
    assert f"consumer:         {inbox.address}" in out
    assert "message_content:  boolean(/x)" in out and "state:            active" in out
    code, out, _ = run("subscriptions", "show", *opts, address, "--json")
    assert json.loads(out)["topic"] == "{" + wsn.ns + "}managed"

    code, out, err = run("subscriptions", "delete", *opts, sub_id)
    assert code == 0 and f"deleted {address}" in out and "deleted 1 of 1" in err
    code, out, err = run("subscriptions", "delete", *opts, sub_id, address)
    assert code == 1 and "ResourceUnknownFault" in err and "deleted 0 of 2" in err
    code, _, err = run("subscriptions", "show", *opts, sub_id)
    assert code == 1 and "ResourceUnknownFault" in err


def test_subscribe_usage_errors(opts: list[str]) -> None:
    assert run("subscribe", *opts, "t:a")[0] == 2
    assert run("subscribe", *opts, "--pull", "t:a")[0] == 2
    code, _, err = run("subscribe", *opts, "--print", "--lifetime", "soon", "t:a")
    assert code == 2 and "neither seconds nor an xsd:duration" in err
    code, _, err = run("subscribe", *opts, "--print", "--listen", "0.0.0.0:0", "t:a")
    assert code == 2 and "give --advertise URL" in err
    code, _, err = run("subscribe", *opts, "--print", "--listen", "nowhere", "t:a")
    assert code == 2 and "is not HOST:PORT" in err


# --- pull -------------------------------------------------------------------------------------
def test_pull(opts: list[str], client: WsnClient) -> None:
    pp = client.create_pull_point()
    pp.notify("<m>1</m>", "tns:p")
    pp.notify("<m>2</m>", "tns:p")
    pp.notify("<m>3</m>", "tns:p")
    code, out, err = run("pull", *opts, pp.address, "--max", "2")
    assert code == 0 and out.splitlines() == [
        "{" + client.namespaces["tns"] + "}p <m>1</m>",
        "{" + client.namespaces["tns"] + "}p <m>2</m>",
    ]
    assert "2 notification(s)" in err
    code, out, err = run("pull", *opts, pp.id, "--format", "xml", "--destroy")
    assert code == 0 and out.strip() == "<m>3</m>" and "destroyed the pull point" in err
    code, _, err = run("pull", *opts, pp.id)
    assert code == 1 and "ResourceUnknownFault" in err


def test_pull_drains_with_progress(opts: list[str], client: WsnClient) -> None:
    """More than one GetMessages' worth (the gateway hands out 1000 at most per call):
    every message, in order, with a progress line per batch and the total."""
    pp = client.create_pull_point()
    pp.client.notify_many([(f"<n>{i}</n>", "tns:d") for i in range(2300)], to=pp.reference)
    code, out, err = run("pull", *opts, pp.id, "--format", "xml")
    assert code == 0, err
    assert out.splitlines() == [f"<n>{i}</n>" for i in range(2300)]
    assert [ln for ln in err.splitlines() if ln.startswith("pulled")] == [
        "pulled 2000 notification(s)",
        "pulled 2300 notification(s)",
    ]
    assert "2300 notification(s) in " in err
    code, out, err = run("pull", *opts, pp.id)
    assert code == 0 and out == "" and "0 notification(s)" in err


# --- check ------------------------------------------------------------------------------------
def test_check_a_broker(wsnmom_server: RunningServer) -> None:
    base, broker = wsnmom_server.base_url, wsnmom_server.broker_url
    for url in (broker, base, broker + "?wsdl"):
        code, out, _ = run("check", url)
        assert code == 0, out
        assert "verdict:      a WS-Notification broker" in out
        assert "(SOAP 1.1 and SOAP 1.2)" in out
        assert "  NotificationBroker: Notify, Subscribe" in out
        assert f"ONVIF ConcreteSet ({ONVIF_CONCRETE_SET})" in out
        assert "topic set:    open" in out and "DefaultTerminationTime:" in out
    code, out, _ = run("check", wsnmom_server.base_url, "--json")
    data = json.loads(out)
    assert data["is_broker"] and "Subscribe" in data["port_types"]["NotificationProducer"]
    assert data["policy"]["UseRawSupported"] == "true"


def test_check_not_a_broker(wsnmom_server: RunningServer) -> None:
    code, out, _ = run("check", wsnmom_server.base_url + "/healthz")
    assert code == 1 and "verdict:      not a WS-Notification broker" in out
    code, out, _ = run("check", f"http://127.0.0.1:{free_port()}/")
    assert code == 1 and "verdict:      nothing answers" in out
    code, _, err = run("check", "not-a-url")
    assert code == 2 and "is not an http(s) URL" in err
    for url in ("http://[::1", "http://127.0.0.1:x/wsn/broker"):
        code, _, err = run("check", url)
        assert code == 2 and "is not an http(s) URL" in err and "Traceback" not in err
        code, _, err = run("subscriptions", "list", "--broker", url)
        assert code == 2 and "Invalid value for '--broker'" in err


def test_subscriptions_list_needs_the_admin_api(wsnmom_server: RunningServer) -> None:
    with NotificationConsumer() as stand_in:  # any HTTP server that is not a wsnmom gateway
        code, _, err = run("subscriptions", "list", "--broker", stand_in.address)
    assert code == 1 and "needs a wsnmom gateway" in err


# --- the README's quick start ---------------------------------------------------------------------
def _quick_start_commands() -> list[list[str]]:
    """The ``wsnmom`` commands of the README's quick start, as argument lists."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == [".venv/bin/wsnmom"]:
                commands.append(words[1:])
    return commands


def test_the_readme_quick_start_works(
    spawn: object, wsnmom_server: RunningServer, client: WsnClient
) -> None:
    """The shell commands the README shows next to ``make run`` do what it says, against a
    gateway (its address replaces the default 127.0.0.1:8080)."""
    commands = {words[0]: words for words in _quick_start_commands()}
    assert set(commands) == {"subscribe", "notify", "check", "subscriptions"}
    default = "http://127.0.0.1:8080/wsn/broker"
    broker = ["--broker", wsnmom_server.broker_url]
    subscribe = [*commands["subscribe"], *broker, "-C", "1"]
    proc: Lines = spawn(*subscribe)  # type: ignore[operator]
    proc.wait_err("listening at")
    code, _, err = run(*commands["notify"], *broker)
    assert code == 0, err
    assert proc.proc.wait(15) == 0
    assert proc.out == ["{urn:example}sensors/room1 <temp>21.5</temp>"]
    check = [wsnmom_server.broker_url if w == default else w for w in commands["check"]]
    code, out, _ = run(*check)
    assert code == 0 and "a WS-Notification broker" in out
    code, out, _ = run(*commands["subscriptions"], *broker)
    assert code == 0 and out.startswith("ID ")
    page = requests.get(wsnmom_server.base_url + "/admin", timeout=5)
    assert page.status_code == 200 and "<title>wsnmom admin</title>" in page.text
