"""Garbage collection of a serving gateway.

CPython's cyclic collector runs a full (generation 2) collection whenever the objects that
survived two younger collections grow by a quarter, and a full collection walks every
tracked object: the modules, classes and functions loaded at start-up (about 50,000
objects in a gateway on Kafka) on each pass.  Under 100-message Notifies a gateway on
Kafka ran 11 full collections in 5 s, 45-85 ms each on the loaded 2-core machine, holding
the GIL all the while: every request and every delivery in flight waited, which showed
as the delivery latency's 99th percentile.  Young collections ran 1,300 times in the same
5 s (one per 700 net allocations of tracked objects: each Notify allocates thousands).

After start-up ``tune`` moves everything that exists then into the permanent generation
(``gc.freeze``: never walked again, and never freed if it becomes cyclic garbage, which
start-up objects do not), and lets the youngest generation grow to ``YOUNG`` objects
before it is collected.  Cyclic garbage is still collected, just in fewer, larger passes;
reference counting frees everything else at once as before.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG", "tune"]

#: objects allocated (net) before a young collection; CPython's default is 700
YOUNG = 10_000


def tune() -> None:
    """Freeze the start-up heap and collect young objects less often (once, after
    start-up; see the module docstring)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
