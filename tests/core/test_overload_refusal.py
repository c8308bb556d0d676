"""Core's refusal for a connected but overloaded middleware (``MiddlewareBusy``): a
ResourceUnavailableFault of its own class and text, with the adapter's Retry-After, never
the "not reachable" refusal of a lost connection (issue 29)."""

from __future__ import annotations

from pathlib import Path

from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError, AdapterUnavailable, MiddlewareBusy
from wsnmom.core.availability import MiddlewareGate


def gate(tmp_path: Path) -> MiddlewareGate:
    return MiddlewareGate(EmbeddedAdapter(f"embedded://{tmp_path}"), retry_after=5.0)


def test_busy_middleware_is_refused_as_overloaded_with_its_retry_after(tmp_path: Path) -> None:
    refusal = gate(tmp_path).refusal(
        MiddlewareBusy("RabbitMQ did not answer within 10.0s", retry_after=12.4, backlog=80)
    )
    assert isinstance(refusal, errors.MiddlewareOverloaded)
    assert isinstance(refusal, errors.ResourceUnavailable)
    assert refusal.fault_name == "ResourceUnavailableFault"
    assert refusal.code == "Receiver"
    assert refusal.retry_after == 12.4
    assert "overloaded" in refusal.description
    assert "retry in 13 s" in refusal.description
    assert "not reachable" not in refusal.description


def test_busy_without_an_estimate_uses_the_gates_retry_after(tmp_path: Path) -> None:
    refusal = gate(tmp_path).fault(MiddlewareBusy("slow"), errors.UnableToGetMessages("x"))
    assert isinstance(refusal, errors.MiddlewareOverloaded)
    assert refusal.retry_after == 5.0


def test_lost_connection_stays_not_reachable_and_other_errors_keep_their_fault(
    tmp_path: Path,
) -> None:
    g = gate(tmp_path)
    lost = g.refusal(AdapterUnavailable("connection lost"))
    assert lost is not None and not isinstance(lost, errors.MiddlewareOverloaded)
    assert "not reachable" in lost.description
    assert lost.retry_after == 5.0
    assert g.refusal(AdapterError("refused")) is None
    other = errors.UnableToGetMessages("the middleware failed")
    assert g.fault(AdapterError("refused"), other) is other
