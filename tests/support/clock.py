"""Moving a module's wall clock forward, for tests of message ages (``max_age``).

Sleeping until a message is old enough makes a test slow, and a test that sleeps and then
asserts that something is gone looks like a race even when it is not.  ``later(monkeypatch,
module, seconds)`` replaces the ``time`` module *as that module sees it* with one whose
``time()`` runs ``seconds`` ahead; every other function (``monotonic``, ``sleep``) and every
other module keep the real clock.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest

__all__ = ["later"]


class _Ahead:
    """The ``time`` module, with ``time()`` ahead by a fixed number of seconds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def time(self) -> float:
        return time.time() + self.seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def later(monkeypatch: pytest.MonkeyPatch, module: ModuleType, seconds: float) -> None:
    """From now on, ``module`` reads a wall clock ``seconds`` ahead of the real one."""
    monkeypatch.setattr(module, "time", _Ahead(seconds))
