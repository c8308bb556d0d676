"""Core's refusal for a connected but overloaded middleware (``MiddlewareBusy``): a
ResourceUnavailableFault of its own class and text, with the adapter's Retry-After, never
the "not reachable" refusal of a lost connection (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest
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


class _Unreachable(EmbeddedAdapter):
    """An embedded adapter that says its middleware is down, and why, with a password in
    the reason (as a careless adapter's connection error might carry)."""

    def available(self) -> bool:
        return False

    def unavailable_reason(self) -> str | None:
        return "cannot connect to amqp://gateway:s3cret@10.0.0.7:5672/ (connection refused)"


def test_the_refusal_names_the_middleware_and_what_failed_without_its_password(
    tmp_path: Path,
) -> None:
    g = MiddlewareGate(_Unreachable(f"embedded://{tmp_path}"), grace=0.0)
    g.ready = True
    with pytest.raises(errors.ResourceUnavailable) as refused:
        g.require_middleware()
    text = refused.value.description
    assert text.startswith("the middleware (embedded) is not reachable: cannot connect to ")
    assert "(connection refused)" in text
    assert "s3cret" not in text
    assert refused.value.retry_after == g.retry_after
    # a cause raised mid-operation is the reason, the same way
    lost = g.refusal(AdapterUnavailable("connection lost"))
    assert lost is not None
    assert (
        lost.description
        == "the middleware (embedded) is not reachable: connection lost; retry later"
    )
