"""Helpers for the robustness and abuse tests: real gateways (``wsnmom serve`` on loopback,
embedded middleware) with the settings a test needs, raw SOAP posts, and a prober that
measures how fast ``/healthz`` answers while a test attacks the gateway."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.fixtures.server import RunningServer, free_port
from tests.support.soap import content_type, envelope
from tests.support.threads import Background


def start_server(
    env: dict[str, str] | None = None, *, name: str = "embedded", wait_for: str = "/readyz"
) -> RunningServer:
    """A started embedded gateway with ``env`` settings (stop it with :func:`stop_server`);
    ``WSNMOM_ADAPTER_URL`` in ``env`` names another middleware."""
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-sec-"))
    env = dict(env or {})
    url = env.pop("WSNMOM_ADAPTER_URL", f"embedded://{data_dir / 'middleware'}")
    server = RunningServer(name, url, data_dir, free_port(), extra_env=env)
    try:
        server.start(wait_for=wait_for)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    return server


def stop_server(server: RunningServer) -> None:
    """Stop ``server`` and remove its data."""
    try:
        server.stop()
    finally:
        shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture
def gateway_factory() -> Iterator[Callable[..., RunningServer]]:
    """Start gateways with given settings; all are stopped after the test."""
    made: list[RunningServer] = []

    def make(env: dict[str, str] | None = None, wait_for: str = "/readyz") -> RunningServer:
        server = start_server(env, wait_for=wait_for)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            if server.running is False and server.process is not None:
                print(f"\n--- gateway log tail ---\n{server.log_tail()}")
            stop_server(server)


def post(
    url: str,
    body: str,
    *,
    version: str = "1.2",
    timeout: float = 10,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    """POST a SOAP envelope with ``body`` (``headers``: more HTTP headers, credentials)."""
    return requests.post(
        url,
        data=envelope(body, version=version),
        headers={"Content-Type": content_type(version), **(headers or {})},
        timeout=timeout,
    )


@dataclass
class HealthProbe(Background):
    """Calls ``/healthz`` in a loop on its own thread and records each latency; a request
    that fails or takes longer than ``timeout`` counts as ``timeout`` seconds."""

    base_url: str
    interval: float = 0.05
    timeout: float = 5.0
    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    def _join_within(self) -> float:
        return self.timeout + 2  # a request under way ends within its timeout

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                ok = (
                    session.get(f"{self.base_url}/healthz", timeout=self.timeout).status_code == 200
                )
            except requests.RequestException:
                ok = False
            elapsed = time.monotonic() - started
            if not ok:
                self.failures += 1
                elapsed = max(elapsed, self.timeout)
            self.latencies.append(elapsed)
            self._stop.wait(self.interval)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)


SOAP_TYPES = {
    "http://schemas.xmlsoap.org/soap/envelope/": "text/xml",
    "http://www.w3.org/2003/05/soap-envelope": "application/soap+xml",
}


@dataclass(frozen=True)
class Fault:
    """What a SOAP fault answer says."""

    version: str  # "1.1" or "1.2"
    code: str  # "Sender", "Receiver" or "VersionMismatch" (1.1 codes mapped)
    reason: str
    detail: str | None  # local name of the detail's first element


def soap_fault_of(status: int, content_type: str, body: bytes) -> Fault:
    """The fault a response carries; AssertionError when it is not a well-formed SOAP
    fault in the envelope version its Content-Type names, with a schema-valid detail."""
    from lxml import etree

    from tests.support.wsn_schemas import assert_body_valid

    env = etree.fromstring(body)
    ns = etree.QName(env).namespace
    assert etree.QName(env).localname == "Envelope" and ns in SOAP_TYPES, body[:300]
    assert content_type.split(";")[0].strip() == SOAP_TYPES[ns], (content_type, ns)
    fault = env.find(f"{{{ns}}}Body/{{{ns}}}Fault")
    assert fault is not None, body[:300]
    assert_body_valid(env)
    if ns == "http://schemas.xmlsoap.org/soap/envelope/":
        raw = (fault.findtext("faultcode") or "").split(":")[-1]
        code = {"Client": "Sender", "Server": "Receiver"}.get(raw, raw)
        reason = fault.findtext("faultstring") or ""
        details = fault.find("detail")
        version = "1.1"
    else:
        code = (fault.findtext(f"{{{ns}}}Code/{{{ns}}}Value") or "").split(":")[-1]
        reason = fault.findtext(f"{{{ns}}}Reason/{{{ns}}}Text") or ""
        details = fault.find(f"{{{ns}}}Detail")
        version = "1.2"
    first = (
        next((d for d in details if isinstance(d.tag, str)), None) if details is not None else None
    )
    assert status >= 400, status
    return Fault(version, code, reason, etree.QName(first).localname if first is not None else None)
