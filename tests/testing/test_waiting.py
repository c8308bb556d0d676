"""The suite's one polling helper (tests/support/waiting.py) and its one port picker
(wsnmom.testing.gateway.free_port)."""

from __future__ import annotations

import socket

import pytest

from tests.support.waiting import wait_until
from wsnmom.testing.gateway import PORT_RANGE, free_port


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([0, [], "ready"])
    assert wait_until(lambda: next(values), 5, what="readiness") == "ready"


def test_wait_until_names_what_it_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last: \[\]"):
        wait_until(list, 0.05, what="the answer")


def test_wait_until_retries_the_named_errors_only() -> None:
    calls = iter([ConnectionError("refused"), ConnectionError("refused"), "up"])

    def check() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(check, 5, errors=(ConnectionError,)) == "up"

    def refused() -> str:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="ConnectionError: refused"):
        wait_until(refused, 0.05, errors=(OSError,))
    with pytest.raises(KeyError):
        wait_until(lambda: {}["missing"], 5)


def test_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    port = free_port()
    assert PORT_RANGE[0] <= port <= PORT_RANGE[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
