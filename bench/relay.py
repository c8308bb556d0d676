"""The push-delivery baseline: a minimal relay, the least a gateway that forwards
notifications must do.

A bare Flask endpoint on waitress (the same WSGI server and thread count as ``wsnmom serve``)
that parses each incoming Notify with lxml, as any relay must to know what it holds, checks
that it carries NotificationMessages, and POSTs it to one consumer over a pooled keep-alive
urllib3 connection -- the library and call the gateway's own outbound path uses.  It answers
the publisher 202 once the consumer answered 2xx, 502 otherwise.

What it leaves out, on purpose: durability (nothing is stored; a message in flight is lost
when the relay stops), subscriptions and filtering, rendering an outbound Notify (the
received envelope is forwarded byte for byte), batching, retries.  The delivery scenario runs
it on the gateway's CPU with the gateway's consumer (docs/performance.md, scenario 2).

Run as ``python -m bench.relay --port N --threads T --forward URL``; the consumer URL must be
a loopback address.
"""

from __future__ import annotations

import argparse
import ipaddress
from urllib.parse import urlsplit

import urllib3
from flask import Flask, Response, request
from lxml import etree

from bench.baseline_app import NOTIFY_PATH, WSNT, BaselineServer, thread_parser

#: seconds to wait for the consumer (connect, then answer)
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 10.0


def is_loopback_url(url: str) -> bool:
    """True when ``url`` is http(s) to localhost or a loopback address."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https"):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(consumer_url: str, pool_size: int) -> Flask:
    """The relay application, forwarding every Notify to ``consumer_url``."""
    app = Flask("wsnmom-bench-relay")
    pool = urllib3.PoolManager(num_pools=4, maxsize=pool_size, retries=False)
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)

    @app.post(NOTIFY_PATH)
    def relay() -> Response:
        body = request.get_data()
        root = etree.fromstring(body, thread_parser())
        if not any(True for _ in root.iter(f"{WSNT}NotificationMessage")):
            return Response("no message", status=400)
        try:
            answer = pool.urlopen(
                "POST",
                consumer_url,
                body=body,
                headers={"Content-Type": request.content_type or "application/soap+xml"},
                timeout=timeout,
                redirect=False,
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Response(f"consumer unreachable: {type(exc).__name__}", status=502)
        if not 200 <= answer.status < 300:
            return Response(f"consumer answered {answer.status}", status=502)
        return Response(b"", status=202)

    @app.get("/readyz")
    def readyz() -> Response:
        return Response("ok", status=200)

    return app


class RelayServer(BaselineServer):
    """The relay in a child process, on the CPUs of the process under test."""

    module = "bench.relay"

    def __init__(self, threads: int, consumer_url: str, port: int | None = None) -> None:
        if not is_loopback_url(consumer_url):
            raise ValueError(f"the relay only forwards to loopback addresses, not {consumer_url}")
        super().__init__(threads, port)
        self.consumer_url = consumer_url

    @property
    def notify_url(self) -> str:
        """Where publishers send their Notifies."""
        return self.base_url + NOTIFY_PATH

    def arguments(self) -> list[str]:
        """The command-line arguments of the module."""
        return [*super().arguments(), "--forward", self.consumer_url]


def main() -> None:
    """Entry point of ``python -m bench.relay``."""
    parser = argparse.ArgumentParser(description="push-delivery baseline (minimal relay)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--forward", required=True, help="the consumer URL (loopback only)")
    args = parser.parse_args()
    if not is_loopback_url(args.forward):
        parser.error("the relay only forwards to loopback addresses")
    import waitress

    waitress.serve(
        create_app(args.forward, args.threads),
        host="127.0.0.1",
        port=args.port,
        threads=args.threads,
        ident=None,
    )


if __name__ == "__main__":
    main()
