"""A data directory whose store holds another adapter's resources is refused at start
(the new user's stranded backlog: ``make run`` on the embedded default, then
``wsnmom serve --adapter ...`` on the same data directory), with the way out named; an
empty store changes hands."""

from __future__ import annotations

from pathlib import Path

from tests.ops.serve_process import free_port, run_serve, running_serve, serve_env
from wsnmom.client import WsnClient
from wsnmom.startup import ExitStatus


def test_a_store_with_embedded_resources_refuses_another_adapter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = serve_env(tmp_path)
    port = free_port()
    with (
        running_serve(["--data-dir", str(data)], env, port),
        WsnClient(f"http://127.0.0.1:{port}/wsn/broker") as client,
    ):
        client.create_pull_point(name="backlog")
    other = ["--data-dir", str(data), "--adapter", f"filelog://{tmp_path}/log"]
    result = run_serve([*other, "--port", str(free_port())], env)
    assert result.returncode == ExitStatus.DATA_DIR, result.stderr
    assert "holds 1 subscriptions, pull points and registrations of the 'embedded'" in result.stderr
    assert "--data-dir" in result.stderr and "wsnmom store migrate" in result.stderr
    # the embedded gateway still starts on it, with its pull point
    port = free_port()
    with (
        running_serve(["--data-dir", str(data)], env, port),
        WsnClient(f"http://127.0.0.1:{port}/wsn/broker") as client,
    ):
        assert client.create_pull_point(name="backlog").reference.address


def test_an_empty_store_changes_adapter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = serve_env(tmp_path)
    with running_serve(["--data-dir", str(data)], env, free_port()):
        pass
    other = ["--data-dir", str(data), "--adapter", f"filelog://{tmp_path}/log"]
    with running_serve(other, env, free_port()):
        pass
