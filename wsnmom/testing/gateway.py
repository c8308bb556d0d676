"""A real wsnmom gateway for tests: ``wsnmom serve`` in a subprocess on a free loopback port.

::

    from wsnmom.testing.gateway import start_gateway

    with start_gateway("embedded") as gateway:          # or "rabbitmq", or an adapter URL
        with gateway.client(namespaces={"t": "urn:test"}) as wsn:
            wsn.notify("<hello/>", "t:greetings")

:class:`Gateway` is one ``wsnmom serve`` process: it starts with a store and log in its data
directory, waits until ``/readyz`` answers, and stops gracefully (SIGTERM, then SIGKILL);
``restart()`` keeps its port, data and middleware.  :func:`start_gateway` also provides the
middleware (:mod:`wsnmom.testing.middleware`) and a temporary data directory, and removes
both afterwards.  The pytest plugin's ``wsnmom_gateway`` fixture is built on it.

Settings reach the gateway as ``WSNMOM_*`` environment variables (``env=``), for example
``{"WSNMOM_RETRY__MAX_ATTEMPTS": "2"}``; the variables of the calling process are inherited,
except the test-only ``WSNMOM_TEST_*`` ones.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import requests

from wsnmom.startup import ExitStatus

from .middleware import resolve_middleware

if TYPE_CHECKING:
    from wsnmom.client import WsnClient

__all__ = [
    "PORT_ATTEMPTS",
    "PORT_RANGE",
    "Gateway",
    "GatewayFailed",
    "GatewayProcess",
    "free_port",
    "listens_on",
    "start_gateway",
]

#: how often a first start tries another free port when its port was taken meanwhile
PORT_ATTEMPTS = 3
#: ``wsnmom serve``'s exit status for a listen port in use
PORT_IN_USE = int(ExitStatus.PORT)


class GatewayFailed(RuntimeError):
    """The gateway process exited or did not become ready (the message has its log tail)."""


class GatewayProcess(Protocol):
    """What :class:`Gateway` uses of its process: the part of :class:`subprocess.Popen`
    that a test suite's own way of starting ``wsnmom serve`` (see :meth:`Gateway.spawn`)
    must provide too."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


#: ports :func:`free_port` picks from: below Linux's ephemeral range (32768-60999), from
#: which every outgoing connection on the machine takes its source port
PORT_RANGE = (20000, 32767)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing is bound to now (for a server started right after).

    It is drawn at random below the ephemeral range, so that an outgoing connection does not
    take it as its source port between the pick and the bind, or while a server on it is
    restarted; when none of 200 draws can be bound, the system picks one.  A port is only
    free when it is picked: whoever binds it should check that it holds it
    (:func:`listens_on`).
    """
    for _ in range(200):
        port = random.randint(*PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a TCP socket listening on ``port`` (read from Linux's
    ``/proc``; elsewhere ``True``, since the caller's HTTP answer is then all there is)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return not Path("/proc/self/fd").is_dir()
    held = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # fields: slot, local address:port (hex), remote, state (0A = LISTEN), ..., inode
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
                and fields[9] in held
            ):
                return True
    return False


@dataclass
class Gateway:
    """One ``wsnmom serve`` process (see the module docstring)."""

    #: a label for logs and test ids ("embedded", "rabbitmq", ...)
    adapter: str
    adapter_url: str
    data_dir: Path
    port: int = 0
    #: settings for this gateway (``WSNMOM_*`` variables), over the inherited environment
    extra_env: dict[str, str] = field(default_factory=dict)
    process: GatewayProcess | None = None
    host: str = "127.0.0.1"
    #: the store's URL (None: ``store.db`` in ``data_dir``); a ``postgresql://`` store lets
    #: several gateways share their resources
    store_url: str | None = None
    #: the port was picked here (``port=0``): a first start may move to another one
    port_chosen: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port(self.host)
            self.port_chosen = True

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def broker_url(self) -> str:
        """The NotificationBroker endpoint."""
        return f"{self.base_url}/wsn/broker"

    @property
    def log_path(self) -> Path:
        """The process's output (appended across restarts)."""
        return self.data_dir / "server.log"

    def command(self) -> list[str]:
        """The ``wsnmom serve`` command line."""
        return [
            sys.executable,
            "-m",
            "wsnmom",
            "serve",
            "--adapter",
            self.adapter_url,
            "--store",
            self.store_url or f"sqlite:///{self.data_dir / 'store.db'}",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    def environment(self) -> dict[str, str]:
        """The process environment: inherited (without ``WSNMOM_TEST_*``) + ``extra_env``."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("WSNMOM_TEST_")}
        return {**inherited, **self.extra_env}

    def start(self, timeout: float = 30.0, *, wait_for: str = "/readyz") -> None:
        """Start the process and wait until ``wait_for`` answers 200 (``/readyz``: ready
        to serve; ``/healthz``: up, e.g. while its middleware is still unreachable); on
        any failure it is stopped.

        A free port is free only when it is picked: another process (or an outgoing
        connection's source port) may take it before the gateway binds it.  The first
        start of a gateway whose port was picked here then moves to another free port
        (up to :data:`PORT_ATTEMPTS` tries); a restart never moves, since clients and the
        gateway's stored addresses hold the port."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        may_move = self.port_chosen and self.process is None
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.process = self.spawn()
            try:
                self._wait_ready(timeout, wait_for)
                return
            except GatewayFailed:
                self.stop()
                if not (may_move and attempt < PORT_ATTEMPTS and self.port_taken()):
                    raise
                self.port = free_port(self.host)
            except BaseException:
                self.stop()  # never leave a gateway behind that nobody will stop
                raise

    def spawn(self) -> GatewayProcess:
        """Start :meth:`command` with :meth:`environment`, its output appended to
        :attr:`log_path` (a subclass may start it another way that runs the same command)."""
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                self.command(), env=self.environment(), stdout=log, stderr=subprocess.STDOUT
            )

    def port_taken(self) -> bool:
        """Whether the process exited because its port was in use (exit status 6)."""
        return self.process is not None and self.process.poll() == PORT_IN_USE

    def _wait_ready(self, timeout: float, path: str = "/readyz") -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GatewayFailed(f"wsnmom serve exited:\n{self.log_tail()}")
            try:
                answered = requests.get(f"{self.base_url}{path}", timeout=1).status_code == 200
            except requests.RequestException:
                answered = False
            # another process that took the port first may answer too, until ours exits
            if answered and listens_on(self.process.pid, self.port):
                return
            time.sleep(0.1)
        raise GatewayFailed(f"wsnmom serve not ready after {timeout}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        """Whether the process lives."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully (SIGTERM; SIGKILL after ``timeout`` seconds).  Idempotent."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def restart(self) -> None:
        """Stop and start again on the same port, data and middleware."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the process's output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def client(self, **kwargs: Any) -> WsnClient:
        """A :class:`wsnmom.client.WsnClient` for this gateway (keyword arguments are the
        client's)."""
        from wsnmom.client import WsnClient

        return WsnClient(self.broker_url, **kwargs)


@contextmanager
def start_gateway(
    adapter: str = "embedded",
    *,
    env: Mapping[str, str] | None = None,
    data_dir: Path | str | None = None,
    store_url: str | None = None,
    timeout: float = 30.0,
) -> Iterator[Gateway]:
    """A running gateway on ``adapter`` ("embedded", "filelog", "rabbitmq", "kafka" or an
    adapter URL); stopped, and its middleware and temporary data directory removed, on
    exit.

    ``store_url`` names the store (default: SQLite in the data directory).

    Raises :class:`~wsnmom.testing.middleware.MiddlewareUnavailable` when the middleware
    cannot be provided and :class:`GatewayFailed` when the gateway does not start."""
    middleware = resolve_middleware(adapter)
    own_dir = data_dir is None
    directory = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="wsnmom-"))
    name = adapter if "://" not in adapter else adapter.split("://", 1)[0]
    url = middleware.url.replace("{data_dir}", str(directory))
    gateway = Gateway(name, url, directory, extra_env=dict(env or {}), store_url=store_url)
    try:
        gateway.start(timeout)
        yield gateway
    finally:
        gateway.stop()
        middleware.close()
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
