"""OpenTelemetry spans (``[tracing] enabled``, ``core.otel``) with the SDK's in-memory
exporter, on the core with the embedded adapter: a Notify gives a receive span and a publish
span that continue its ``traceparent``; each delivery attempt gives a deliver span with the
subscription id and the outcome (a consumer that is down: "error" per attempt, then "ok"
once it is up); a natively carried context is continued by the deliveries; without the
setting no tracing object exists and nothing of OpenTelemetry is imported by core."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from wsnmom.core import errors
from wsnmom.core.adapter import OutboundMessage
from wsnmom.core.filters import XPATH10
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource, InboundNotification
from wsnmom.topic_mapping.model import Topic

from tests.support.threads import serve
from tests.support.waiting import wait_until

from .conftest import NSMAP, Broker, RecordingOutbound, note, simple, sub_req

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UP = "http://127.0.0.1:9/up"
FLAKY = "http://127.0.0.1:9/flaky"
NS = NSMAP["t"]


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the process's SDK tracer provider (set here if none is)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[Callable[[], list[ReadableSpan]]]:
    exporter.clear()
    yield lambda: list(exporter.get_finished_spans())
    exporter.clear()


def traced(payload: str, topic: str, *headers: tuple[str, str]) -> InboundNotification:
    base = note(payload, simple(topic))
    return InboundNotification(payload=base.payload, topic=base.topic, headers=headers)


def named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def test_notify_publish_and_deliveries_continue_the_incoming_trace(
    make_broker: Callable[..., Broker],
    outbound: RecordingOutbound,
    spans: Callable[[], list[ReadableSpan]],
) -> None:
    broker = make_broker(tracing__enabled=True, retry__max_attempts=20)
    service = broker.service
    assert service is not None and service._ctx.tracing is not None
    outbound.down.add(FLAKY)
    up = service.subscribe(sub_req(UP, topic=simple("t:tr")))
    flaky = service.subscribe(sub_req(FLAKY, topic=simple("t:tr")))
    service.notify(
        [
            traced("<a/>", "t:tr", ("traceparent", TRACEPARENT), ("tracestate", "v=1")),
            traced("<b/>", "t:tr", ("traceparent", OTHER)),
        ]
    )
    (receive,) = named(spans(), "wsnmom.receive")
    (publish,) = named(spans(), "wsnmom.publish")
    assert receive.kind is SpanKind.SERVER and publish.kind is SpanKind.PRODUCER
    # receive continues the first message's context; publish is its child
    assert receive.parent is not None and receive.parent.span_id == int(PARENT_ID, 16)
    assert receive.context.trace_id == int(TRACE_ID, 16)
    assert receive.context.trace_state.get("v") == "1"
    assert publish.parent is not None and publish.parent.span_id == receive.context.span_id
    assert receive.attributes["messaging.batch.message_count"] == 2
    assert receive.attributes["wsnmom.outcome"] == "ok"
    assert publish.attributes["wsnmom.outcome"] == "ok"

    outbound.wait_messages(UP, 2)
    # two failed attempts to the flaky consumer, then it comes up
    wait_until(
        lambda: len([s for s in named(spans(), "wsnmom.deliver") if _sub(s) == flaky.id]) >= 2,
        what="two failed attempts",
    )
    outbound.down.discard(FLAKY)
    outbound.wait_messages(FLAKY, 2)
    wait_until(
        lambda: any(
            _sub(s) == flaky.id and s.attributes["wsnmom.outcome"] == "ok"
            for s in named(spans(), "wsnmom.deliver")
        ),
        what="the successful attempt's span",
    )
    delivers = named(spans(), "wsnmom.deliver")
    to_up = [s for s in delivers if _sub(s) == up.id]
    to_flaky = [s for s in delivers if _sub(s) == flaky.id]
    assert [s.attributes["wsnmom.outcome"] for s in to_up] == ["ok"] * len(to_up)
    outcomes = [s.attributes["wsnmom.outcome"] for s in to_flaky]
    assert outcomes[-1] == "ok" and outcomes.count("error") >= 2, outcomes
    for span in delivers:
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes["wsnmom.delivery.mode"] == "push"
        # a delivery continues the publisher's trace (the first message's, the other linked)
        assert span.context.trace_id == int(TRACE_ID, 16)
        assert span.parent is not None and span.parent.span_id == int(PARENT_ID, 16)
    batched = [s for s in delivers if s.attributes["messaging.batch.message_count"] == 2]
    assert all(
        [link.context.span_id for link in s.links] == [int(OTHER.split("-")[2], 16)]
        for s in batched
    )
    failed = next(s for s in to_flaky if s.attributes["wsnmom.outcome"] == "error")
    assert failed.status.status_code is StatusCode.ERROR
    assert "down" in (failed.status.description or "")
    assert any(e.name == "exception" for e in failed.events)


def test_a_refused_notify_is_an_error_span_and_native_messages_keep_their_trace(
    make_broker: Callable[..., Broker], spans: Callable[[], list[ReadableSpan]]
) -> None:
    broker = make_broker(
        tracing__enabled=True, requires_registration=True, filters__isolation="inline"
    )
    service = broker.service
    assert service is not None
    with pytest.raises(errors.PublisherRegistrationRejected):
        service.notify([traced("<no/>", "t:x", ("traceparent", TRACEPARENT))])
    (receive,) = named(spans(), "wsnmom.receive")
    assert receive.attributes["wsnmom.outcome"] == "error"
    assert receive.status.status_code is StatusCode.ERROR
    assert not named(spans(), "wsnmom.publish")  # refused before anything was published

    # a message published natively (no wsnmom headers) with its own trace context: a push
    # delivery and its reaching a pull point (a MessageContent filter makes the pull point
    # read the subscription, not routing at publish time) continue it
    pushed = service.subscribe(sub_req(UP, topic=simple("t:nat")))
    pp = service.create_pull_point(CreatePullPointRequest(None))
    fed = service.subscribe(
        sub_req(
            service.pull_point_address(pp.id),
            topic=simple("t:nat"),
            message_content=ExpressionSource(XPATH10, "true()", {}),
        )
    )
    broker.adapter.publish(
        OutboundMessage(
            Topic(NS, ("nat",)), b"<n/>", "native-1", {"traceparent": OTHER}, "application/xml"
        )
    )
    taken: list[object] = []

    def both() -> bool:
        taken.extend(service.get_messages(pp.id, None))  # a native pull reads it now
        return {_sub(s) for s in named(spans(), "wsnmom.deliver")} >= {pushed.id, fed.id}

    wait_until(both, what="both deliveries' spans")
    assert len(taken) == 1
    by_sub = {_sub(s): s for s in named(spans(), "wsnmom.deliver")}
    assert by_sub[pushed.id].attributes["wsnmom.delivery.mode"] == "push"
    assert by_sub[fed.id].attributes["wsnmom.delivery.mode"] == "forward"
    for span in (by_sub[pushed.id], by_sub[fed.id]):
        assert span.context.trace_id == int(OTHER.split("-")[1], 16)
        assert span.attributes["wsnmom.outcome"] == "ok"


def test_disabled_tracing_imports_nothing_of_opentelemetry(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker()
    assert broker.service is not None and broker.service._ctx.tracing is None
    # a fresh interpreter: core and the gateway's assembly, tracing at its default
    code = (
        "import sys\n"
        "from wsnmom.core.config import Settings\n"
        "from wsnmom.core.tracing import load_tracing\n"
        "import wsnmom.server, wsnmom.core.service\n"
        "assert load_tracing(Settings().tracing.enabled) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def _sub(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("wsnmom.subscription.id")


def test_enabled_without_opentelemetry_is_a_configuration_error() -> None:
    # a fresh interpreter in which the opentelemetry packages cannot be imported
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from wsnmom.core.config import ConfigError\n"
        "from wsnmom.core.tracing import load_tracing\n"
        "try:\n"
        "    load_tracing(True)\n"
        "except ConfigError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.startswith("refused: tracing.enabled needs OpenTelemetry"), out.stdout


def test_without_a_provider_the_gateway_exports_over_otlp_http() -> None:
    """A process with no tracer provider gets the SDK's, exporting to the OTLP/HTTP endpoint
    the standard variables name (here a loopback server of the test's own)."""
    posts: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    serve(server)
    code = (
        "from opentelemetry import trace\n"
        "from wsnmom.core.otel import OtelTracing\n"
        "t = OtelTracing()\n"
        f"with t.attempt([(('traceparent', {TRACEPARENT!r}),)], 'sub-otlp', 'push'):\n"
        "    pass\n"
        "trace.get_tracer_provider().shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SERVICE_NAME"] = "gw-7"
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    finally:
        server.shutdown()
        server.server_close()
    ((path, body),) = posts
    assert path == "/v1/traces"
    for text in (b"gw-7", b"wsnmom.deliver", b"sub-otlp", bytes.fromhex(TRACE_ID)):
        assert text in body, text
