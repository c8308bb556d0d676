"""Whether the broker can serve and, when it cannot, which dependency is missing (``/readyz``,
the admin page): its state restored from the store, the middleware and the store
answering, the data directory's disk not low."""

from __future__ import annotations

from wsnmom.core.availability import MiddlewareGate
from wsnmom.core.context import BrokerContext
from wsnmom.core.disk import storage_full_text

__all__ = ["disk_low", "unready_reason"]


def unready_reason(ctx: BrokerContext, *, closing: bool) -> str:
    """Why the broker is not ready ("" when it is): which dependency is missing
    (``closing``: the broker is being closed)."""
    if closing:
        return "the broker is stopping"
    if not ctx.gate.ready:
        return "the broker is starting: its middleware has not answered yet"
    disk = ctx.gate.disk
    low = disk.low() if disk is not None else None
    if low is not None:
        return storage_full_text(low)
    try:
        answers = bool(ctx.adapter.ping())
    except Exception:
        answers = False
    if not answers:
        return "the middleware does not answer"
    try:
        stored = ctx.store.ping()
    except Exception:
        stored = False
    return "" if stored else "the store does not answer"


def disk_low(gate: MiddlewareGate) -> str:
    """Why the data directory's disk refuses new work ("" when it does not)."""
    disk = gate.disk
    low = disk.low() if disk is not None else None
    return storage_full_text(low) if low is not None else ""
