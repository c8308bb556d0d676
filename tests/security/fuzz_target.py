"""The gateway the fuzz runs hit (tests/security/test_fuzz.py without authentication,
test_fuzz_credentials.py with it) and what a run watches: every answer checked as the
fuzz modules' docstrings say (:meth:`Target.send`, :func:`check_answer`), ``/healthz``
probed throughout, the gateway's memory sampled, a loopback listener counting fetches of
an external DTD, canary resources made before the run and checked after it
(:func:`survived`), and the figures printed (and written to ``WSNMOM_TEST_FUZZ_REPORT``).
Each fuzz module starts its gateway once, module scoped, with :func:`make_target`.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from hypothesis import HealthCheck, settings
from lxml import etree

from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.abuse import PROMPT
from tests.support.soap import notify_body, subscribe_body
from tests.support.threads import serve
from tests.support.waiting import wait_until

from . import corpus
from .conftest import HealthProbe, post, soap_fault_of, start_server, stop_server

LONG = int(os.environ.get("WSNMOM_TEST_FUZZ_EXAMPLES", "0"))
#: examples per strategy in the bounded run
BOUNDED = {"mutated": 700, "xml": 150, "bytes": 150, "filters": 60, "specs": 120, "auth": 300}
MAX_REQUEST_BYTES = 2 * 1024 * 1024
NOT_SOAP_5XX_OK = {500, 503}


def fuzz_settings(name: str) -> Any:
    examples = LONG or BOUNDED[name]
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


# ------------------------------------------------------------------------------ the target
class _Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'<!ENTITY x "fetched">')

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Target:
    """The fuzzed gateway and what the run watches."""

    gateway: RunningServer
    sink: ConsumerServer
    canary: ConsumerServer
    dtd_url: str
    dtd_hits: list[str]
    urls: list[str]
    canary_subscription: str = ""
    canary_pull_point: str = ""
    canary_properties: bytes = b""
    #: authentication is on; ``auth`` are the admin's credentials for the run's own calls
    secured: bool = False
    auth: dict[str, str] = field(default_factory=dict)
    probe: HealthProbe | None = None
    stats: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    rss: list[int] = field(default_factory=list)
    #: the live subscriptions made by the hostile-filter run, oldest first
    hostile: deque[str] = field(default_factory=deque)
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)

    def rss_now(self) -> int:
        assert self.gateway.process is not None
        status = Path(f"/proc/{self.gateway.process.pid}/status").read_text()
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        return int(kb) * 1024

    def sample_memory(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.rss.append(self.rss_now())
            except (OSError, StopIteration):
                return

    def send(
        self,
        url: str,
        data: bytes,
        content_type: str | None,
        kind: str,
        headers: dict[str, Any] | None = None,
    ) -> requests.Response | None:
        """POST one input (with ``headers``: credentials) and check the answer (module
        docstring)."""
        headers = dict(headers if headers is not None else self.auth)
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            resp = requests.post(url, data=data, headers=headers, timeout=30)
        except requests.ConnectionError:
            # the gateway may close a connection on a request it refuses unread (a body
            # over the limit): it must still be up
            assert requests.get(self.gateway.base_url + "/healthz", timeout=5).ok
            self.stats[f"{kind}: connection closed"] += 1
            return None
        self.stats["inputs"] += 1
        self.stats[f"{kind}: inputs"] += 1
        self.stats[f"HTTP {resp.status_code}"] += 1
        try:
            if _malformed_head(headers):  # refused by the HTTP server, in plain text
                assert resp.status_code == 400 and resp.content.startswith(b"Bad Request")
                self.stats[f"{kind}: malformed HTTP head"] += 1
                return resp
            check_answer(resp, self)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- input ({len(data)} bytes) ---\n{data[:2000]!r}\n"
                f"--- gateway log ---\n{self.gateway.log_tail(60)}"
            ) from None
        return resp


def _malformed_head(headers: dict[str, Any]) -> bool:
    """Whether a header value holds a control character (RFC 9110 5.5: the HTTP server
    answers such a request ``400 Bad Request`` in plain text; it never reaches SOAP)."""
    for value in headers.values():
        raw = value if isinstance(value, bytes) else value.encode("latin-1", "replace")
        if any((b < 0x20 and b != 0x09) or b == 0x7F for b in raw):
            return True
    return False


def check_answer(resp: requests.Response, target: Target) -> None:
    status = resp.status_code
    if 200 <= status < 300:
        return
    ctype = resp.headers.get("Content-Type", "")
    if status == 413 and ctype.startswith("text/plain"):
        return  # documented: refused unread by the HTTP server
    refusals = (401, 403, 429) if target.secured else ()
    assert status in (400, 404, 405, 413, 415, *refusals, *NOT_SOAP_5XX_OK), (
        status,
        resp.content[:500],
    )
    fault = soap_fault_of(status, ctype, resp.content)
    target.faults[fault.detail or fault.code] += 1
    assert not (fault.detail == "BaseFault" and fault.code == "Receiver"), fault
    assert "internal error" not in fault.reason, fault
    if status == 503:
        assert fault.detail == "ResourceUnavailableFault", fault
    if status == 401:  # the same answer whatever went wrong, with the challenges
        assert "FailedAuthentication" in resp.text and fault.detail is None, fault
        assert resp.headers.get("WWW-Authenticate", "").startswith(("Basic", "Bearer")), resp
    if status == 429:
        assert fault.detail == "ResourceUnavailableFault" and resp.headers["Retry-After"], fault


def make_target(env: dict[str, str], *, secured: bool = False) -> Iterator[Target]:
    recorder = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    recorder.daemon_threads = True
    serve(recorder)
    hits: list[str] = []
    _Recorder.hits = hits
    sink, canary = ConsumerServer(), ConsumerServer()
    gateway = start_server(
        {
            # only loopback addresses, and no name lookups at all: fuzzed addresses
            # never make the gateway send traffic elsewhere
            "WSNMOM_OUTBOUND__ALLOW": "127.0.0.0/8,::1/128",
            "WSNMOM_OUTBOUND__DENY": "*",
            "WSNMOM_FILTERS__EXSLT_REGEX": "true",
            "WSNMOM_FILTERS__CPU_LIMIT": "0.2",
            "WSNMOM_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
            "WSNMOM_LOG_LEVEL": "WARNING",
            **env,
        }
    )
    t = Target(
        gateway,
        sink,
        canary,
        f"http://127.0.0.1:{recorder.server_port}/x.dtd",
        hits,
        [gateway.broker_url],
        secured=secured,
        auth={"Authorization": f"Bearer {ADMIN_TOKEN}"} if secured else {},
    )
    try:
        _canaries(t)
        _fuzz_resources(t, {"Authorization": ALICE} if secured else {})
        t.rss.append(t.rss_now())
        threading.Thread(target=t.sample_memory, daemon=True).start()
        with HealthProbe(gateway.base_url, interval=0.1, timeout=5) as probe:
            t.probe = probe
            yield t
    finally:
        t._stop.set()
        _report(t)
        stop_server(gateway)
        sink.close()
        canary.close()
        recorder.shutdown()


ADMIN_TOKEN = "fuzz-admin-token"
ALICE = "Basic " + base64.b64encode(b"alice:alice-pw").decode()
CAMERA_PASSWORD = "camera-pw"


def address_of(answer: requests.Response, kind: str) -> str:
    env = etree.fromstring(answer.content)
    for el in env.iter("{http://www.w3.org/2005/08/addressing}Address"):
        if f"/wsn/{kind}/" in (el.text or ""):
            return (el.text or "").strip()
    raise AssertionError(answer.content)


def _canaries(t: Target) -> None:
    broker, auth = t.gateway.broker_url, t.auth
    sub = post(broker, subscribe_body(t.canary.address(), "tns:Canary"), headers=auth)
    t.canary_subscription = address_of(sub, "subscriptions")
    pp = post(broker, "<wsnt:CreatePullPoint/>", headers=auth)
    t.canary_pull_point = address_of(pp, "pullpoints")
    assert post(broker, subscribe_body(t.canary_pull_point, "tns:Canary"), headers=auth).ok
    props = post(t.canary_subscription, "<wsrf-rp:GetResourcePropertyDocument/>", headers=auth)
    t.canary_properties = _stable(props.content)


def _fuzz_resources(t: Target, auth: dict[str, str]) -> None:
    """Resources the fuzzed requests address (made by ``auth``: not the admin)."""
    broker = t.gateway.broker_url
    npex = "http://www.example.org/NotificationProducerExample"
    sub = post(broker, subscribe_body(t.sink.address(), "tns:SomeTopic", ns=npex), headers=auth)
    pp = post(broker, "<wsnt:CreatePullPoint/>", headers=auth)
    reg = requests.post(
        broker,
        data=corpus.envelope(corpus.BODIES["RegisterPublisher"]).encode(),
        headers={"Content-Type": "application/soap+xml", **auth},
        timeout=10,
    )
    t.urls += [
        address_of(sub, "subscriptions"),
        address_of(pp, "pullpoints"),
        address_of(reg, "registrations"),
        t.gateway.base_url + "/wsn/subscriptions/no-such-id",
        t.gateway.base_url + "/wsn/pullpoints/no-such-id",
        t.gateway.base_url + "/wsn/registrations/no-such-id",
        t.gateway.base_url + "/wsn/elsewhere",
        t.gateway.base_url + "/wsn/subscriptions/a%00b",  # a long run's seed (issue 22)
    ]


def _stable(properties: bytes) -> bytes:
    """A property document without what changes by itself (current time)."""
    doc = etree.fromstring(properties)
    for el in list(doc.iter("{*}CurrentTime")):
        el.text = ""
    for el in list(doc.iter("{http://www.w3.org/2005/08/addressing}MessageID")):
        el.text = ""
    return etree.tostring(doc.find("{*}Body"))


def _report(t: Target) -> None:
    figures = {
        "inputs": t.stats["inputs"],
        "by kind and status": dict(sorted(t.stats.items())),
        "faults": dict(t.faults.most_common()),
        "healthz checks": len(t.probe.latencies) if t.probe else 0,
        "worst healthz seconds": round(t.probe.worst, 3) if t.probe else None,
        "rss start MiB": round(t.rss[0] / 2**20, 1) if t.rss else None,
        "rss max MiB": round(max(t.rss) / 2**20, 1) if t.rss else None,
        "seconds": round(time.monotonic() - t.started, 1),
    }
    print("\nfuzz figures:", json.dumps(figures, indent=1))
    path = os.environ.get("WSNMOM_TEST_FUZZ_REPORT")
    if path:
        Path(path).write_text(json.dumps(figures, indent=1))


def survived(target: Target) -> None:
    gateway, auth = target.gateway, target.auth
    assert gateway.running
    assert target.probe is not None
    assert target.probe.failures == 0
    assert target.probe.worst < PROMPT, sorted(target.probe.latencies)[-5:]
    assert max(target.rss) - target.rss[0] < 400 * 2**20, (target.rss[0], max(target.rss))
    assert target.dtd_hits == [], "the gateway fetched an external DTD or entity"
    # the canaries: deliveries, pull point, properties
    broker = gateway.broker_url
    random_text = f"canary-{random.randrange(10**9)}"
    answer = post(broker, notify_body(("tns:Canary", f"<m>{random_text}</m>")), headers=auth)
    assert answer.status_code == 202
    wait_until(
        lambda: any(m.findtext("{*}Message/m") == random_text for m in target.canary.messages()),
        timeout=10,
        what="the canary subscription's delivery",
    )
    got = wait_until(
        lambda: (
            (ans := post(target.canary_pull_point, "<wsnt:GetMessages/>", headers=auth)).ok
            and random_text.encode() in ans.content
        ),
        timeout=10,
        what="the canary pull point's message",
    )
    assert got
    props = post(target.canary_subscription, "<wsrf-rp:GetResourcePropertyDocument/>", headers=auth)
    assert _stable(props.content) == target.canary_properties
    log = gateway.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
