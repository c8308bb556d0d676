"""``wsnmom serve`` in a child process: start on a free port with a fresh store, wait for
``/readyz``, measure its RSS, stop it gracefully (or kill it).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import cpus
from bench.client import get_json_status
from bench.util import free_port, rss_bytes
from wsnmom.startup import ExitStatus

#: waitress worker threads of the server under test; the ingress baseline uses the same
SERVER_THREADS = 16
#: ``wsnmom serve``'s exit status when its port is in use, and how often a first start
#: moves to another free port then
PORT_IN_USE = int(ExitStatus.PORT)
PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """The server's port was in use when it started."""


def serve_available() -> str | None:
    """None when ``wsnmom serve`` exists, else why not."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "wsnmom", "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"wsnmom serve cannot run: {exc}"
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
        return f"wsnmom serve is not available yet ({tail[0][:200]})"
    return None


def write_config(path: Path, extra: str = "") -> Path:
    """The TOML configuration every benchmark server gets (plus ``extra`` lines)."""
    path.write_text(
        f"threads = {SERVER_THREADS}\n"
        'log_level = "WARNING"\n'
        "[termination]\n"
        'maximum = "P30D"\n'
        'pull_point_default = "P1D"\n'
        # the scenarios create up to 100k subscriptions from one client: beyond the
        # per-client quotas a gateway has by default
        "[quotas]\n"
        + "".join(
            f'{name} = "none"\n'
            for name in (
                "subscriptions",
                "pull_points",
                "registrations",
                "total_subscriptions",
                "total_pull_points",
                "total_registrations",
                "notify_fanout_bytes",
                "ad_hoc_topics",
            )
        )
        + extra
    )
    return path


class ServerProcess:
    """One ``wsnmom serve`` process under test."""

    def __init__(
        self,
        adapter_url: str,
        workdir: Path,
        config_extra: str = "",
        port: int | None = None,
    ) -> None:
        self.adapter_url = adapter_url
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        #: the port was picked here and the server never started: a start may move it
        self._may_move = port is None
        self.config = write_config(workdir / "wsnmom.toml", config_extra)
        self.store_url = f"sqlite:///{workdir.resolve()}/store.db"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "server.log"

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.port}"

    @property
    def broker_url(self) -> str:
        """The NotificationBroker endpoint."""
        return f"{self.base_url}/wsn/broker"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            sys.executable,
            "-m",
            "wsnmom",
            "serve",
            "--adapter",
            self.adapter_url,
            "--store",
            self.store_url,
            # adapters that keep files (MQTT's session and queues) get this process's own
            # directory: the gateway's data directory overrides an adapter URL's data_dir
            "--data-dir",
            str((self.workdir / "data").resolve()),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--config",
            str(self.config),
        ]

    def start(self, timeout: float = 90.0) -> float:
        """Start and wait until /readyz answers 200; returns the seconds that took.

        The first start of a server whose free port was picked here moves to another one
        when the port was taken before the server bound it (exit status 6); a restart
        keeps its port (clients and stored addresses hold it)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start(timeout)
            except PortTaken:
                if not self._may_move or attempt == PORT_ATTEMPTS:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, timeout: float) -> float:
        started = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cpus.server_prefix() + self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                error = PortTaken if self.proc.returncode == PORT_IN_USE else RuntimeError
                raise error(f"wsnmom serve exited ({self.proc.returncode}): {self.log_tail()}")
            if get_json_status(self.base_url + "/readyz", timeout=1.0) == 200:
                self._may_move = False
                return time.perf_counter() - started
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"wsnmom serve not ready within {timeout:.0f}s: {self.log_tail()}")

    def rss(self) -> int | None:
        """Resident set size of the server process in bytes."""
        return rss_bytes(self.proc.pid) if self.proc is not None else None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def exited(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` for the server to exit by itself (after a SIGTERM sent
        with :meth:`signal`; a second SIGTERM ends a graceful stop at once) and forget it;
        returns its exit status, None when it is still running (then it is killed)."""
        if self.proc is None:
            return None
        try:
            status: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            status = None
        self.kill()
        return status

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the running server (SIGTERM, SIGSTOP, SIGCONT...)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the server (a crash)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the server's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])[-1500:]
