"""What tracing costs per Notify and per delivery attempt, in-process (``timeit``).

Three measurements of the code core runs around a Notify (``wsnmom.receive`` with
``wsnmom.publish`` inside) and around one delivery attempt (``wsnmom.deliver``), each over
a message that carries a ``traceparent``:

* disabled: ``ctx.tracing`` is None, the one test core makes;
* enabled, spans to the SDK with a batch processor and an exporter that drops them (the
  cost of making, ending and queueing the spans; an OTLP exporter adds its own work on its
  thread);
* enabled with no SDK (the API's no-op tracer: the ``otel`` extra without a provider).

Needs the ``otel`` extra.  Usage::

    python -m bench.tracing_cost [--number 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider
from wsnmom.core.otel import OtelTracing
from wsnmom.core.tracing import Tracing

HEADERS = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _notify(tracing: Tracing | None) -> Callable[[], None]:
    def run() -> None:
        if tracing is not None:
            with tracing.receive([HEADERS]), tracing.publish([HEADERS]):
                pass

    return run


def _attempt(tracing: Tracing | None) -> Callable[[], None]:
    def run() -> None:
        if tracing is not None:
            with tracing.attempt([HEADERS], "sub-1", "push"):
                pass

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    sdk = TracerProvider()
    sdk.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=1 << 16))
    sides: dict[str, Tracing | None] = {
        "disabled": None,
        "enabled, SDK": OtelTracing(sdk.get_tracer("wsnmom")),
        "enabled, no-op API": OtelTracing(NoOpTracerProvider().get_tracer("wsnmom")),
    }
    print(f"{'':22} {'per Notify (µs)':>16} {'per attempt (µs)':>17}")
    for name, tracing in sides.items():
        figures = []
        for make in (_notify, _attempt):
            best = min(timeit.repeat(make(tracing), number=args.number, repeat=args.repeat))
            figures.append(best / args.number * 1e6)
        print(f"{name:22} {figures[0]:16.2f} {figures[1]:17.2f}")
    sdk.shutdown()


if __name__ == "__main__":
    main()
