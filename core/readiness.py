"""Whether the broker can serve and, when it cannot, which dependency is missing and why
(``/readyz``, the admin page): its state restored from the store, the middleware and the
store answering, the data directory's disk not low.

The text of :func:`unready_reason` is its first line, the first cause found ("the
middleware does not answer"), then one ``dependency: why`` line per missing dependency
(``middleware: rabbitmq: cannot connect to RabbitMQ at ...: connection refused``,
``store: the PostgreSQL store is not answering: ...``), each as the dependency says it
(``Adapter.unavailable_reason``, ``Store.unavailable_reason``), shown through the one
redaction rule (``availability.shown_reason``).
"""

from __future__ import annotations

from wsnmom.core.availability import MiddlewareGate, middleware_reason, store_reason
from wsnmom.core.context import BrokerContext
from wsnmom.core.disk import storage_full_text

__all__ = ["disk_low", "missing", "unready_reason"]


def unready_reason(ctx: BrokerContext, *, closing: bool) -> str:
    """Why the broker is not ready ("" when it is): the first cause, then a
    ``dependency: why`` line per missing dependency (``closing``: the broker is being
    closed)."""
    if closing:
        return "the broker is stopping"
    causes: list[str] = []
    if not ctx.gate.ready:
        causes.append("the broker is starting: its middleware has not answered yet")
    disk = ctx.gate.disk
    low = disk.low() if disk is not None else None
    if low is not None:
        causes.append(storage_full_text(low))
    lines = missing(ctx)
    causes += [f"the {name} does not answer" for name, _ in lines]
    if not causes:
        return ""
    return "\n".join([causes[0], *(f"{name}: {why}" for name, why in lines)])


def missing(ctx: BrokerContext, ping_timeout: float = 1.0) -> list[tuple[str, str]]:
    """("middleware" | "store", why) for each of them that does not answer a ping now,
    the middleware's why starting with the adapter's name."""
    out: list[tuple[str, str]] = []
    adapter = ctx.adapter
    try:
        answers = bool(adapter.ping(ping_timeout))
    except Exception:
        answers = False
    if not answers:
        # before the broker started, the adapter may not be open: why its opening failed
        opening = "" if ctx.gate.ready else ctx.gate.open_error
        why = opening or middleware_reason(adapter)
        why = why or f"no answer to a ping within {ping_timeout:g} s"
        out.append(("middleware", f"{adapter.name}: {why}"))
    try:
        stored = bool(ctx.store.ping())
    except Exception:
        stored = False
    if not stored:
        out.append(("store", store_reason(ctx.store) or "no answer to a ping"))
    return out


def disk_low(gate: MiddlewareGate) -> str:
    """Why the data directory's disk refuses new work ("" when it does not)."""
    disk = gate.disk
    low = disk.low() if disk is not None else None
    return storage_full_text(low) if low is not None else ""
