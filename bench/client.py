"""Concurrent keep-alive HTTP clients for set-up work and fixed-count loads.

``run_requests`` spreads a list of POST requests over several worker processes, each with a
few threads that keep one persistent ``http.client`` connection apiece, so creating tens of
thousands of subscriptions is limited by the server, not by one Python client's GIL.  Only
what the caller asks for comes back (the status, the first ``wsa:Address``, or the number
of NotificationMessages), to keep the inter-process traffic small.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from bench import soap

Extract = Literal["status", "address", "notifications"]

#: one answer: (HTTP status or -1 on a transport error, extracted value)
Answer = tuple[int, str | int | None]


@dataclass(frozen=True, slots=True)
class Request:
    """A POST of ``body`` to ``url`` (absolute, http://127.0.0.1:PORT/path)."""

    url: str
    body: bytes


class KeepAliveClient:
    """One persistent HTTP/1.1 connection, re-opened after an error."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._netloc: str | None = None

    def _connection(self, netloc: str) -> http.client.HTTPConnection:
        if self._conn is None or self._netloc != netloc:
            self.close()
            host, _, port = netloc.partition(":")
            self._conn = http.client.HTTPConnection(host, int(port or 80), timeout=self.timeout)
            self._netloc = netloc
        return self._conn

    def post(
        self,
        url: str,
        body: bytes,
        content_type: str = soap.CONTENT_TYPE,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """POST and return (status, body); one retry on a dropped keep-alive connection."""
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in range(2):
            conn = self._connection(parts.netloc)
            try:
                conn.request("POST", path, body, {"Content-Type": content_type, **(headers or {})})
                resp = conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.close()
                return resp.status, data
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def get(self, url: str) -> tuple[int, bytes]:
        """GET and return (status, body)."""
        parts = urlsplit(url)
        conn = self._connection(parts.netloc)
        try:
            conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _extract(status: int, body: bytes, extract: Extract) -> Answer:
    if extract == "address":
        return status, soap.first_address(body) if status < 300 else soap.fault_summary(body)
    if extract == "notifications":
        return status, soap.count_notifications(body) if status < 300 else soap.fault_summary(body)
    return status, None


def _worker(requests: Sequence[Request], threads: int, extract: Extract) -> list[Answer]:
    """Run ``requests`` on ``threads`` keep-alive connections; answers in request order."""
    local = threading.local()
    clients: list[KeepAliveClient] = []
    lock = threading.Lock()

    def one(req: Request) -> Answer:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = KeepAliveClient()
            with lock:
                clients.append(client)
        try:
            status, body = client.post(req.url, req.body)
        except (OSError, http.client.HTTPException) as exc:
            return -1, str(exc)
        return _extract(status, body, extract)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        answers = list(pool.map(one, requests))
    for c in clients:
        c.close()
    return answers


def run_requests(
    requests: Sequence[Request],
    extract: Extract = "status",
    processes: int = 2,
    threads: int = 8,
) -> tuple[list[Answer], float]:
    """Run ``requests`` concurrently; returns (answers in order, elapsed seconds)."""
    if not requests:
        return [], 0.0
    started = time.perf_counter()
    if processes <= 1 or len(requests) < 200:
        answers = _worker(requests, threads, extract)
        return answers, time.perf_counter() - started
    chunk = (len(requests) + processes - 1) // processes
    parts = [requests[i : i + chunk] for i in range(0, len(requests), chunk)]
    with ProcessPoolExecutor(max_workers=len(parts)) as pool:
        futures = [pool.submit(_worker, part, threads, extract) for part in parts]
        answers = [a for f in futures for a in f.result()]
    return answers, time.perf_counter() - started


def get_json_status(url: str, timeout: float = 2.0) -> int:
    """HTTP status of a GET (or -1 when nothing answers); used for /readyz polling."""
    parts = urlsplit(url)
    host, _, port = parts.netloc.partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout)
    try:
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return -1
    finally:
        conn.close()
