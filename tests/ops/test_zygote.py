"""The suite's gateways forked from a pre-imported parent (tests/support/zygote.py) are the
gateways a process of their own would be: the start's environment, output file and exit
statuses (a clean SIGTERM, a SIGKILL, a port in use, a setting refused) reach the test as
``Popen`` gives them; a start whose interpreter would start differently (``PYTHONPATH``) is
a real process; and the gateways of a zygote whose pytest worker is gone get SIGTERM.
docs/testing.md, "7 December 2026 (session 13): gateway starts forked from a pre-imported
parent"."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.server import RunningServer
from tests.support import zygote_client
from tests.support.waiting import wait_until
from wsnmom.startup import ExitStatus
from wsnmom.testing.gateway import GatewayFailed


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningServer]:
    server = RunningServer("embedded", f"embedded://{tmp_path / 'middleware'}", tmp_path / "gw")
    try:
        yield server
    finally:
        server.stop()


def _exited(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (exited, not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_a_forked_gateway_serves_with_its_environment_and_stops_with_status_0(
    gateway: RunningServer,
) -> None:
    gateway.extra_env["WSNMOM_PUBLIC_URL"] = "http://127.0.0.1:9/forked"
    gateway.start()
    assert isinstance(gateway.process, zygote_client.ForkedProcess)
    wsdl = requests.get(gateway.broker_url + "?wsdl", timeout=10).text
    assert "http://127.0.0.1:9/forked/wsn/broker" in wsdl
    assert gateway.process.poll() is None
    gateway.stop()
    assert gateway.process.returncode == ExitStatus.OK
    assert gateway.process.poll() == ExitStatus.OK
    # its output went to the gateway's log, as a process of its own writes it
    assert "wsnmom broker at http://127.0.0.1:9/forked/wsn/broker" in gateway.log_tail()


def test_a_killed_forked_gateway_reports_the_signal_and_restarts(gateway: RunningServer) -> None:
    gateway.start()
    assert gateway.process is not None
    gateway.process.kill()
    assert gateway.process.wait(30) == -signal.SIGKILL
    gateway.start()
    assert requests.get(gateway.base_url + "/readyz", timeout=10).status_code == 200


def test_a_forked_gateway_on_a_port_in_use_exits_6_and_the_first_start_moves(
    gateway: RunningServer, tmp_path: Path
) -> None:
    gateway.start()
    taken = RunningServer(
        "embedded", f"embedded://{tmp_path / 'mw2'}", tmp_path / "gw2", port=gateway.port
    )
    with pytest.raises(GatewayFailed):
        taken.start(60)
    assert taken.process is not None and taken.process.returncode == ExitStatus.PORT
    moved = RunningServer("embedded", f"embedded://{tmp_path / 'mw3'}", tmp_path / "gw3")
    moved.port = gateway.port  # picked here, then taken: the first start moves
    try:
        moved.start(60)
        assert moved.port != gateway.port
        assert isinstance(moved.process, zygote_client.ForkedProcess)
    finally:
        moved.stop()


def test_a_refused_setting_exits_with_the_commands_status(gateway: RunningServer) -> None:
    gateway.extra_env["WSNMOM_RETRY__MAX_ATTEMPTS"] = "many"
    with pytest.raises(GatewayFailed):
        gateway.start(60)
    assert isinstance(gateway.process, zygote_client.ForkedProcess)
    assert gateway.process.returncode == ExitStatus.CONFIG
    assert "WSNMOM_RETRY__MAX_ATTEMPTS" in gateway.log_tail()


def test_another_pythonpath_starts_a_process_of_its_own(
    gateway: RunningServer, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "sitecustomize-ran"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    gateway.extra_env["PYTHONPATH"] = str(site)
    gateway.start()
    assert isinstance(gateway.process, subprocess.Popen)
    assert marker.exists()


def test_the_switch_turns_forking_off(
    gateway: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WSNMOM_TEST_FORK_GATEWAYS", "0")
    gateway.start()
    assert isinstance(gateway.process, subprocess.Popen)


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "sigstopped"])
def test_a_zygote_whose_worker_is_gone_stops_its_gateways(tmp_path: Path, stopped: bool) -> None:
    """Also a gateway a test had stopped with SIGSTOP when its worker was killed (one was
    left behind, stopped, when a CI-like run was cut short in session 13)."""
    zygote = zygote_client.Zygote()
    server = RunningServer("embedded", f"embedded://{tmp_path / 'mw'}", tmp_path / "gw")
    try:
        command, env = server.command(), server.environment()
        assert zygote.accepts(command, env)
        server.data_dir.mkdir(parents=True)
        forked = zygote.spawn(command, env, server.log_path)
        assert forked is not None
        server.process = forked
        server._wait_ready(120)
        if stopped:
            os.kill(forked.pid, signal.SIGSTOP)
        zygote.close()  # its stdin ends, as when the worker exits or is killed
        wait_until(lambda: _exited(forked.pid), 60, what="the gateway to exit")
        assert "shutting down" in server.log_tail()
    finally:
        if server.process is not None and not _exited(server.process.pid):
            os.kill(server.process.pid, signal.SIGKILL)
        zygote.close()
