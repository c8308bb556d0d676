"""A notification consumer for the benchmarks: a small asyncio HTTP/1.1 server in its own
process that answers every POST with 200 and counts what arrived.

Run as ``python -m bench.consumer --port N``; it prints ``READY`` once listening.  The
benchmark reads its counters over HTTP:

``GET /_stats``            counts: requests, messages, distinct paths, first/last arrival
``GET /_stats?latency=1``  the same plus every end-to-end latency in ms (from ``ts``)
``POST /_reset``           zero the counters

Push subscriptions of the fan-out and recovery scenarios use a distinct path per
subscription (``/c/<n>``), so "every subscription got its message" is "distinct paths == n".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from typing import Any

from bench import soap
from bench.client import KeepAliveClient
from bench.util import free_port, wait_until


class Counters:
    """What the consumer saw since the last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything."""
        self.requests = 0
        self.messages = 0
        self.paths: dict[str, int] = {}
        self.first: float | None = None
        self.last: float | None = None
        self.latencies_ms: list[float] = []

    def record(self, path: str, body: bytes) -> None:
        """Count one delivery request."""
        now = time.time()
        self.requests += 1
        n = soap.count_notifications(body) or 1
        self.messages += n
        self.paths[path] = self.paths.get(path, 0) + n
        if self.first is None:
            self.first = now
        self.last = now
        for ts in soap.timestamps(body):
            if ts > 0:
                self.latencies_ms.append((now - ts) * 1000.0)

    def snapshot(self, latency: bool) -> dict[str, Any]:
        """The counters as JSON-able data."""
        data: dict[str, Any] = {
            "requests": self.requests,
            "messages": self.messages,
            "distinct_paths": len(self.paths),
            "first": self.first,
            "last": self.last,
        }
        if latency:
            data["latencies_ms"] = self.latencies_ms
        return data


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counters: Counters
) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                lname = name.strip().lower()
                if lname == "content-length":
                    length = int(value.strip() or 0)
                elif lname == "connection" and value.strip().lower() == "close":
                    close = True
            body = await reader.readexactly(length) if length else b""
            status = b"200 OK"
            out = b""
            if target.startswith("/_stats"):
                out = json.dumps(counters.snapshot("latency=1" in target)).encode()
            elif target.startswith("/_reset"):
                counters.reset()
            elif method == "POST":
                counters.record(target, body)
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Length: "
                + str(len(out)).encode()
                + b"\r\nContent-Type: application/json\r\n\r\n"
                + out
            )
            await writer.drain()
            if close:
                return
    except (ConnectionError, asyncio.CancelledError):
        return
    finally:
        writer.close()


async def _serve(port: int) -> None:
    counters = Counters()
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, counters), "127.0.0.1", port, backlog=1024, limit=1 << 24
    )
    print("READY", flush=True)
    async with server:
        await server.serve_forever()


class ConsumerProcess:
    """A consumer server in a child process, with its counters read over HTTP."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._client = KeepAliveClient(timeout=30)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ConsumerProcess:
        """Start the process and wait until it listens."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.consumer", "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if b"READY" not in line:
            raise RuntimeError(f"consumer did not start: {line!r}")
        return self

    def stats(self, latency: bool = False) -> dict[str, Any]:
        """The counters (with every latency in ms when ``latency``)."""
        status, body = self._client.get(
            self.base_url + ("/_stats?latency=1" if latency else "/_stats")
        )
        if status != 200:
            raise RuntimeError(f"consumer stats answered {status}")
        data: dict[str, Any] = json.loads(body)
        return data

    def reset(self) -> None:
        """Zero the counters."""
        self._client.post(self.base_url + "/_reset", b"")

    def stop(self) -> None:
        """Terminate the process."""
        self._client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class ConsumerPool:
    """Several consumer processes; address ``i`` goes to consumer ``i % len``."""

    def __init__(self, count: int) -> None:
        self.consumers = [ConsumerProcess() for _ in range(count)]

    def start(self) -> ConsumerPool:
        """Start them all."""
        for c in self.consumers:
            c.start()
        return self

    def address(self, i: int) -> str:
        """The consumer address of subscription ``i`` (distinct path per subscription)."""
        return f"{self.consumers[i % len(self.consumers)].base_url}/c/{i}"

    def totals(self) -> dict[str, Any]:
        """Summed counters; ``last`` is the latest arrival over all consumers."""
        stats = [c.stats() for c in self.consumers]
        lasts = [s["last"] for s in stats if s["last"] is not None]
        firsts = [s["first"] for s in stats if s["first"] is not None]
        return {
            "requests": sum(s["requests"] for s in stats),
            "messages": sum(s["messages"] for s in stats),
            "distinct_paths": sum(s["distinct_paths"] for s in stats),
            "first": min(firsts) if firsts else None,
            "last": max(lasts) if lasts else None,
        }

    def wait_paths(self, n: int, timeout: float, poll: float = 0.02) -> dict[str, Any] | None:
        """Wait until ``n`` distinct paths got something; the totals then, or None."""
        found: dict[str, Any] = {}

        def done() -> bool:
            found.update(self.totals())
            return bool(found["distinct_paths"] >= n)

        return found if wait_until(done, timeout, poll) else None

    def reset(self) -> None:
        """Zero every consumer's counters."""
        for c in self.consumers:
            c.reset()

    def stop(self) -> None:
        """Stop every consumer."""
        for c in self.consumers:
            c.stop()


def main() -> None:
    """Entry point of ``python -m bench.consumer``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port))


if __name__ == "__main__":
    main()
