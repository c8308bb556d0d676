"""The ingress baseline: a bare Flask endpoint on waitress that parses the same SOAP
envelope with lxml, walks its NotificationMessages and returns a canned answer.

A second Notify endpoint, ``/wsn/serialising-broker``, also extracts each
NotificationMessage's payload and serialises it once with lxml: the least a gateway must
do with a message to store it.  The 100-message ingress target is measured against it
(docs/performance.md, scenario 1).

It also answers GetMessages at ``/wsn/pullpoints/<id>`` (the recovery scenario's baseline):
parse the request, read MaximumNumber, return a canned GetMessagesResponse holding one
NotificationMessage -- "receive, parse, answer" without any broker work.

It runs with the same WSGI server, host and thread count as ``wsnmom serve`` so that the
ratio wsnmom/baseline measures what the broker adds on top of "receive, parse, answer".
Run as ``python -m bench.baseline_app --port N --threads T``; prints READY when listening.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from typing import Self

from flask import Flask, Response, request
from lxml import etree

from bench import cpus
from bench.client import get_json_status
from bench.util import free_port, wait_until

WSNT = "{http://docs.oasis-open.org/wsn/b-2}"
#: the Notify endpoint that only parses and counts (the 1-message ingress baseline)
NOTIFY_PATH = "/wsn/broker"
#: the Notify endpoint that also serialises each payload once (the 100-message baseline)
SERIALISING_NOTIFY_PATH = "/wsn/serialising-broker"
_GET_MESSAGES_RESPONSE = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" '
    b'xmlns:wsa="http://www.w3.org/2005/08/addressing" '
    b'xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2"><s:Header>'
    b"<wsa:Action>http://docs.oasis-open.org/wsn/bw-2/PullPoint/GetMessagesResponse"
    b"</wsa:Action></s:Header><s:Body><wsnt:GetMessagesResponse><wsnt:NotificationMessage>"
    b'<wsnt:Message><b:event xmlns:b="urn:wsnmom:bench" seq="0" ts="0"/></wsnt:Message>'
    b"</wsnt:NotificationMessage></wsnt:GetMessagesResponse></s:Body></s:Envelope>"
)
_LOCAL = threading.local()


def thread_parser() -> etree.XMLParser:
    """This thread's parser: a shared lxml parser serialises the request threads."""
    parser: etree.XMLParser | None = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = etree.XMLParser(
            resolve_entities=False, no_network=True, huge_tree=False
        )
    return parser


def create_app() -> Flask:
    """The baseline Flask application."""
    app = Flask("wsnmom-bench-baseline")

    @app.post(NOTIFY_PATH)
    def notify() -> Response:
        root = etree.fromstring(request.get_data(), thread_parser())
        count = sum(1 for _ in root.iter(f"{WSNT}NotificationMessage"))
        if count == 0:
            return Response("no message", status=400)
        return Response(b"", status=202)

    @app.post(SERIALISING_NOTIFY_PATH)
    def notify_serialising() -> Response:
        root = etree.fromstring(request.get_data(), thread_parser())
        stored = 0
        for item in root.iter(f"{WSNT}NotificationMessage"):
            # wsnt:Message is the last child of a NotificationMessage (schema order);
            # indexing is done in C, where find() would run lxml's Python path engine
            message = item[-1] if len(item) else None
            if message is None or message.tag != f"{WSNT}Message" or not len(message):
                return Response("a NotificationMessage without payload", status=400)
            etree.tostring(message[0])
            stored += 1
        if stored == 0:
            return Response("no message", status=400)
        return Response(b"", status=202)

    @app.post("/wsn/pullpoints/<pull_point>")
    def get_messages(pull_point: str) -> Response:
        root = etree.fromstring(request.get_data(), thread_parser())
        if root.find(f".//{WSNT}MaximumNumber") is None or not pull_point:
            return Response("no GetMessages", status=400)
        return Response(_GET_MESSAGES_RESPONSE, status=200, content_type="application/soap+xml")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response("ok", status=200)

    return app


class BaselineServer:
    """The baseline app in a child process, on the CPUs of the process under test."""

    #: the module run with ``python -m``
    module = "bench.baseline_app"

    def __init__(self, threads: int, port: int | None = None) -> None:
        self.threads = threads
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        """The command-line arguments of the module."""
        return ["--port", str(self.port), "--threads", str(self.threads)]

    def start(self, timeout: float = 30.0) -> Self:
        """Start the process and wait for /readyz."""
        self.proc = subprocess.Popen(
            [*cpus.server_prefix(), sys.executable, "-m", self.module, *self.arguments()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_until(lambda: get_json_status(self.base_url + "/readyz") == 200, timeout):
            self.stop()
            raise RuntimeError(f"{self.module} did not start")
        return self

    def stop(self) -> None:
        """Terminate it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def main() -> None:
    """Entry point of ``python -m bench.baseline_app``."""
    parser = argparse.ArgumentParser(description="ingress baseline (bare Flask + lxml)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    import waitress

    print("READY", flush=True)
    waitress.serve(create_app(), host="127.0.0.1", port=args.port, threads=args.threads, ident=None)


if __name__ == "__main__":
    main()
