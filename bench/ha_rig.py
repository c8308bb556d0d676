"""The rig of the ``ha`` family of bench scenarios (``ha``, ``ha-scale``, ``follow`` and the
``bench.ha_*`` experiments): recording push consumers (:class:`Posts`, each POST parsed and
handed to a hook; :class:`Recorder`), a private PostgreSQL store, the ``[cluster]`` table of
a failover instance and the adapter URL the instances share."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench import client, soap
from bench.middleware import Middleware
from bench.server import ServerProcess
from bench.util import postgres as fresh_postgres

if TYPE_CHECKING:  # bench.scenarios imports this module
    from bench.scenarios.base import Context

_SEQ = re.compile(rb'seq="(\d+)"')
_TOOK = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*took shards ([\d,]+)", re.M)


@dataclass(frozen=True, slots=True)
class Post:
    """One POST a recording consumer received."""

    #: ``time.monotonic()`` when its body was read
    at: float
    #: the request path (a subscription of its own where the consumer address says so)
    path: str
    #: the instance that sent it (``WSNMOM-Instance``)
    sender: str
    #: the sequence numbers of the messages it carried (``seq="N"``)
    seqs: tuple[int, ...]


class Posts:
    """Push consumers on ``ports`` free loopback ports (each a destination of its own for
    the gateways' per-destination limit): every POST is parsed into a :class:`Post`,
    handed to ``record`` (on the server's thread) and answered 202."""

    def __init__(self, record: Callable[[Post], None], ports: int = 1) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.monotonic()
                seqs = tuple(int(s) for s in _SEQ.findall(body))
                record(Post(now, self.path, self.headers.get("WSNMOM-Instance", ""), seqs))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._servers: list[ThreadingHTTPServer] = []
        for _ in range(ports):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads = True
            threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            ).start()
            self._servers.append(server)

    def address(self, i: int = 0, path: str = "/consumer") -> str:
        """``path`` on the ``i``-th port (modulo their number)."""
        return f"http://127.0.0.1:{self._servers[i % len(self._servers)].server_port}{path}"

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


class Recorder:
    """A consumer on a free loopback port that records each message's sequence number,
    arrival time and the instance that sent it (``WSNMOM-Instance``)."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str, int]] = []
        #: POSTs received (a delivery batch is one)
        self.posts = 0
        self._lock = threading.Lock()
        self._posts = Posts(self._record)

    def _record(self, post: Post) -> None:
        with self._lock:
            self.arrivals.extend((post.at, post.sender, s) for s in post.seqs)
            self.posts += 1

    @property
    def address(self) -> str:
        return self._posts.address()

    def snapshot(self) -> list[tuple[float, str, int]]:
        with self._lock:
            return list(self.arrivals)

    def count(self) -> int:
        with self._lock:
            return len(self.arrivals)

    def close(self) -> None:
        self._posts.close()


def post(server: ServerProcess, body: bytes, kc: client.KeepAliveClient) -> None:
    status, answer = kc.post(server.broker_url, body)
    if not 200 <= status < 300:
        raise RuntimeError(f"{status} from {server.base_url}: {soap.fault_summary(answer)}")


def cluster_of(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.base_url + "/wsn/admin/api/cluster", timeout=5) as answer:
        data: dict[str, Any] = json.load(answer)
    return data


def shared_url(mw: Middleware, url: str) -> str:
    """``url`` as every instance of the failover shares it: without a data directory of
    one process (each instance keeps its own: the MQTT adapter's client id is kept there),
    and on RabbitMQ with pull points read by basic.get."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "data_dir"]
    if mw.name == "rabbitmq":
        query.append(("pull", "get"))
    return urlunsplit(parts._replace(query=urlencode(query)))


def cluster_config(instance: str, lease: float | None, heartbeat: float | None) -> str:
    """The ``[cluster]`` table of a failover instance: one shard (one deliverer at a
    time); ``None`` leaves the lease or the heartbeat at its default (10 s, 1 s)."""
    lines = ["[cluster]", f'instance_id = "{instance}"', "shards = 1"]
    if lease is not None:
        lines.append(f"lease = {lease:g}")
    if heartbeat is not None:
        lines.append(f"heartbeat = {heartbeat:g}")
    return "\n".join(lines) + "\n"


@contextmanager
def postgres(ctx: Context) -> Iterator[str]:
    """A private PostgreSQL server (the test suite's fixture code) and a fresh database,
    or ``WSNMOM_BENCH_POSTGRES_URL`` (``bench.util.postgres``)."""
    with fresh_postgres() as url:
        yield url


def takes(server: ServerProcess) -> list[tuple[float, set[int]]]:
    """When (time.time()) the instance took which shards, by its log."""
    text = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
    out = []
    for stamp, shards in _TOOK.findall(text):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((at, {int(s) for s in shards.split(",")}))
    return out
