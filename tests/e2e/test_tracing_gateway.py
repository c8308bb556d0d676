"""``wsnmom serve`` with ``[tracing] enabled`` (the ``otel`` extra): a Notify carrying a
``traceparent`` gives ``wsnmom.receive``, ``wsnmom.publish`` and ``wsnmom.deliver`` spans in
that trace, exported over OTLP/HTTP to a collector on loopback (the test's own server,
decoding the protobuf requests), with the subscription id and the outcome of each delivery
attempt: one to a consumer that answers a fault is an error, one that succeeds is ok."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.soap import content_type, envelope, notify_body
from tests.support.threads import serve
from tests.support.waiting import wait_until

from .conftest import Wsn

pytestmark = pytest.mark.e2e

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Collector:
    """An OTLP/HTTP trace endpoint on loopback that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service.name, Span)
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with outer.lock:
                    for resource_spans in request.resource_spans:
                        attrs = {
                            a.key: a.value.string_value for a in resource_spans.resource.attributes
                        }
                        for scope in resource_spans.scope_spans:
                            outer.spans.extend(
                                (attrs.get("service.name", ""), s) for s in scope.spans
                            )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serve(self.server)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[Any]:
        with self.lock:
            return [s for _, s in self.spans if s.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def traced_gateway() -> Iterator[tuple[RunningServer, Collector]]:
    collector = Collector()
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-e2e-otel-"))
    server = RunningServer(
        "embedded",
        f"embedded://{data_dir / 'middleware'}",
        data_dir,
        extra_env={
            "WSNMOM_TRACING__ENABLED": "true",
            "WSNMOM_RETRY__MAX_ATTEMPTS": "20",  # the failing consumer never runs them out
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_SERVICE_NAME": "wsnmom-e2e",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_TRACES_EXPORTER": "otlp",
        },
    )
    server.start()
    try:
        yield server, collector
    finally:
        server.stop()
        collector.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def _attr(span: Any, key: str) -> Any:
    for a in span.attributes:
        if a.key == key:
            value = a.value
            return value.string_value if value.HasField("string_value") else value.int_value
    return None


def test_spans_of_a_notify_and_its_delivery_attempts_reach_the_collector(
    traced_gateway: tuple[RunningServer, Collector], consumer_factory: Any
) -> None:
    server, collector = traced_gateway
    wsn = Wsn(server, "urn:test:otel")
    good: ConsumerServer = consumer_factory()
    failing: ConsumerServer = consumer_factory()
    failing.mode = "error"  # answers with a fault until the first attempt has come
    ok_sub = wsn.subscribe(good.address(), "tns:traced")
    retried = wsn.subscribe(failing.address(), "tns:traced")
    body = notify_body(("tns:traced", "<v>1</v>"), ns=wsn.ns)
    resp = wsn.http.post(
        wsn.broker,
        data=envelope(body),
        headers={"Content-Type": content_type(), "traceparent": TRACEPARENT},
    )
    assert resp.status_code in (200, 202), resp.content
    good.wait_for_messages(1, timeout=15)
    wait_until(lambda: failing.received, timeout=15, what="the failing consumer's attempt")
    failing.mode = "ok"

    def attempts(sub_id: str) -> list[Any]:
        return [
            s
            for s in collector.named("wsnmom.deliver")
            if _attr(s, "wsnmom.subscription.id") == sub_id
        ]

    wait_until(
        lambda: (
            attempts(ok_sub.id)
            and any(_attr(s, "wsnmom.outcome") == "ok" for s in attempts(retried.id))
        ),
        timeout=30,
        what="the deliveries' spans at the collector",
    )
    (receive,) = collector.named("wsnmom.receive")
    (publish,) = collector.named("wsnmom.publish")
    trace_id = bytes.fromhex(TRACE_ID)
    assert receive.trace_id == trace_id and publish.trace_id == trace_id
    assert publish.parent_span_id == receive.span_id
    assert _attr(receive, "wsnmom.outcome") == "ok"
    assert {name for name, _ in collector.spans} == {"wsnmom-e2e"}
    (to_good,) = attempts(ok_sub.id)
    assert _attr(to_good, "wsnmom.outcome") == "ok" and to_good.trace_id == trace_id
    outcomes = [_attr(s, "wsnmom.outcome") for s in attempts(retried.id)]
    assert outcomes[-1] == "ok" and set(outcomes[:-1]) == {"error"}, outcomes
    assert all(s.trace_id == trace_id for s in attempts(retried.id))
