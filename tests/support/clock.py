"""Moving a module's wall clock forward, for tests of message ages (``max_age``).

Sleeping until a message is old enough makes a test slow, and a test that sleeps and then
asserts that something is gone looks like a race even when it is not.  ``later(monkeypatch,
module, seconds)`` replaces the ``time`` module *as that module sees it* with one whose
``time()`` runs ``seconds`` ahead; every other function (``monotonic``, ``sleep``) and every
other module keep the real clock.  ``module`` may be a tuple of modules: the embedded
engine reads the clock in several (:data:`EMBEDDED_ENGINE`).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest
from wsnmom.adapters.embedded import dead_letters, limits, publish, queues

__all__ = ["EMBEDDED_ENGINE", "later"]

#: the modules of the embedded engine that read the wall clock: publish times, expiry
#: (``max_age``), peeks and the time a dead letter was dropped
EMBEDDED_ENGINE = (publish, queues, limits, dead_letters)


class _Ahead:
    """The ``time`` module, with ``time()`` ahead by a fixed number of seconds."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def time(self) -> float:
        return time.time() + self.seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def later(
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType | tuple[ModuleType, ...],
    seconds: float,
) -> None:
    """From now on, ``module`` (or each of the modules) reads a wall clock ``seconds``
    ahead of the real one."""
    for m in module if isinstance(module, tuple) else (module,):
        monkeypatch.setattr(m, "time", _Ahead(seconds))
