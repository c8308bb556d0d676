"""OpenTelemetry spans of core (``core.tracing``), imported only when ``[tracing] enabled``
is set; needs the ``otel`` extra (``opentelemetry-api`` and ``-sdk``).

Spans (instrumentation scope ``wsnmom``):

``wsnmom.receive`` (SERVER)
    A Notify in core, from validation to the middleware's confirmation; its parent is the
    trace context of the first message that carries one (the HTTP ``traceparent`` of the
    request, or the message's own ``wsnmom:Messages`` header).
``wsnmom.publish`` (PRODUCER)
    The publish of the Notify's messages to the middleware, a child of the receive span
    (a publish without one, a Notify to a pull point or a SubscriptionEnd notification,
    continues its messages' context as the receive span does).
``wsnmom.deliver`` (CONSUMER)
    One delivery attempt of a batch to a subscription's consumer (``mode`` "push"), or a
    feeding subscription's message reaching its pull point (``mode`` "forward"); its
    parent is the trace context of the first message of the batch that carries one, the
    others are links.  Attributes ``wsnmom.subscription.id``, ``wsnmom.delivery.mode``.

Every span has ``messaging.batch.message_count`` and ``wsnmom.outcome`` ("ok" or
"error"); an error also sets the span's status and records the exception.

The spans go to the process's tracer provider.  When none is set (``opentelemetry-instrument``
or an embedding application sets one), :func:`ensure_provider` sets the SDK's, exporting
over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``, configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables; ``OTEL_TRACES_EXPORTER=none``: none) with
``service.name`` ``wsnmom`` unless ``OTEL_SERVICE_NAME`` names another.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from wsnmom.core.app_headers import AppHeaders

__all__ = ["OtelTracing", "ensure_provider"]

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_COUNT = "messaging.batch.message_count"
_OUTCOME = "wsnmom.outcome"


def ensure_provider() -> None:
    """Set the SDK's tracer provider, exporting over OTLP, unless one is set already."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or "wsnmom"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        trace.set_tracer_provider(provider)  # spans are made, none is exported
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "tracing: no OTLP exporter (opentelemetry-exporter-otlp-proto-http): spans are "
            "made but not exported"
        )
    else:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def _carrier(headers: AppHeaders) -> dict[str, str] | None:
    carrier = {name.lower(): value for name, value in headers if name.lower() == "traceparent"}
    if not carrier:
        return None
    for name, value in headers:
        if name.lower() == "tracestate":
            carrier["tracestate"] = value
    return carrier


def _contexts(headers: Sequence[AppHeaders]) -> list[trace.SpanContext]:
    """The valid W3C trace contexts among the messages' headers, in order."""
    out: list[trace.SpanContext] = []
    for h in headers:
        carrier = _carrier(h)
        if carrier is None:
            continue
        span_context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
        if span_context.is_valid:
            out.append(span_context)
    return out


class OtelTracing:
    """:class:`wsnmom.core.tracing.Tracing` with OpenTelemetry."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        if tracer is None:
            ensure_provider()
            tracer = trace.get_tracer("wsnmom")
        self._tracer = tracer

    @contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        headers: Sequence[AppHeaders],
        attributes: dict[str, str | int],
        *,
        parent_from_messages: bool,
    ) -> Iterator[None]:
        parent: otel_context.Context | None = None
        links: list[Link] = []
        if parent_from_messages:
            found = _contexts(headers)
            if found:
                parent = trace.set_span_in_context(trace.NonRecordingSpan(found[0]))
                links = [Link(c) for c in found[1:] if c.trace_id != found[0].trace_id]
        attributes[_COUNT] = len(headers)
        with self._tracer.start_as_current_span(
            name,
            context=parent,
            kind=kind,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except BaseException as exc:
                span.set_attribute(_OUTCOME, "error")
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            span.set_attribute(_OUTCOME, "ok")

    def receive(self, headers: Sequence[AppHeaders]) -> AbstractContextManager[None]:
        return self._span("wsnmom.receive", SpanKind.SERVER, headers, {}, parent_from_messages=True)

    def publish(self, headers: Sequence[AppHeaders]) -> AbstractContextManager[None]:
        # inside receive: the current span is its parent; alone, the messages' context is
        current = trace.get_current_span().get_span_context().is_valid
        return self._span(
            "wsnmom.publish", SpanKind.PRODUCER, headers, {}, parent_from_messages=not current
        )

    def attempt(
        self, headers: Sequence[AppHeaders], subscription_id: str, mode: str
    ) -> AbstractContextManager[None]:
        attributes: dict[str, str | int] = {
            "wsnmom.subscription.id": subscription_id,
            "wsnmom.delivery.mode": mode,
        }
        return self._span(
            "wsnmom.deliver", SpanKind.CONSUMER, headers, attributes, parent_from_messages=True
        )
