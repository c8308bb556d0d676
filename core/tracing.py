"""Tracing hooks of core: OpenTelemetry spans for a Notify received, its publish to the
middleware and each delivery attempt, when ``[tracing] enabled`` is set (docs/operations.md,
"Tracing").

Core holds a :class:`Tracing` or None.  None (the default) costs one ``is None`` test per
Notify and per delivery attempt: nothing of OpenTelemetry is imported.  Enabled, the one
implementation is :class:`wsnmom.core.otel.OtelTracing` (the ``otel`` extra), imported here
only then.

A span continues the W3C trace context its messages carry (``traceparent``/``tracestate``
among their application headers, ``core.app_headers``): the gateway adds spans to the
publisher's trace and never rewrites the headers it carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from wsnmom.core.app_headers import AppHeaders
from wsnmom.core.config import ConfigError

__all__ = ["Tracing", "TracingUnavailable", "load_tracing"]


class TracingUnavailable(ConfigError):
    """Tracing is enabled but the OpenTelemetry packages (the ``otel`` extra) are missing
    (``wsnmom serve`` exits with status CONFIG)."""


class Tracing(Protocol):
    """The spans core opens; each is a context manager that records the outcome ("ok", or
    "error" with the exception) when it closes."""

    def receive(self, headers: Sequence[AppHeaders]) -> AbstractContextManager[None]:
        """A Notify of messages with these application headers, from its arrival in core
        to the middleware's confirmation."""

    def publish(self, headers: Sequence[AppHeaders]) -> AbstractContextManager[None]:
        """The publish of these messages to the middleware (inside :meth:`receive`)."""

    def attempt(
        self, headers: Sequence[AppHeaders], subscription_id: str, mode: str
    ) -> AbstractContextManager[None]:
        """One delivery attempt of a batch to a subscription's consumer (``mode``: "push"
        or "forward", into a pull point)."""


def load_tracing(enabled: bool) -> Tracing | None:
    """The tracing of a broker: None when disabled, else the OpenTelemetry one
    (:class:`TracingUnavailable` when its packages are not installed)."""
    if not enabled:
        return None
    try:
        from wsnmom.core.otel import OtelTracing
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing.enabled needs OpenTelemetry: pip install 'wsnmom[otel]'"
        ) from exc
    return OtelTracing()
