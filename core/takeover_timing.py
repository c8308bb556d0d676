"""Where a take-over's time goes: for each push subscription whose delivery this
instance opens because it took the subscription's shard (``core.ownership``), the
seconds from the take to each step of its first delivery, observed once per
subscription in ``wsnmom_takeover_seconds{stage}`` (docs/scale-out.md, "Failover at
scale").  The stages, in order:

* ``opening``: an opener thread begins the opening (the wait for an opener);
* ``channel``: the durable subscription is opened (declared, where the middleware
  needs it) and its delivery channel created;
* ``opened``: its consumer is started (the opening is done);
* ``read``: the first message arrived from the middleware (``Channel.on_message``);
* ``lane``: a delivery thread took the ready channel and asks for its place in the
  destination's lane (the wait for a thread);
* ``run``: the channel holds its place in the lane and runs (the wait in the lane);
* ``post``: the Notify is built and its post starts;
* ``answer``: the consumer answered (or the attempt failed).

The delivery engine also reads a channel's timing as "its first delivery after a take-over
is pending": such a delivery waits at the head of a full lane (``core.lanes``).

Each stage is observed once, when first reached.  A channel carries a
:class:`TakeoverTiming` only until its first attempt ends; every
other delivery pays one ``is None`` test per step.  The opener thread hands the timing
to the channel it opens through :func:`opening` (a thread-local), so no signature on the
way from ``Ownership`` to ``DeliveryEngine.open_channel`` changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from wsnmom.core import metrics

__all__ = ["STAGES", "TakeoverTiming", "current", "opening"]

STAGES = ("opening", "channel", "opened", "read", "lane", "run", "post", "answer")

_local = threading.local()
#: each stage's histogram, looked up once (``labels`` costs as much as an observation)
_BY_STAGE = {stage: metrics.TAKEOVER_SECONDS.labels(stage=stage) for stage in STAGES}


class TakeoverTiming:
    """The marks of one taken-over subscription's first delivery (monotonic seconds)."""

    __slots__ = ("marked", "taken")

    def __init__(self, taken: float) -> None:
        #: when this instance took the subscription's shard
        self.taken = taken
        #: the stages observed so far
        self.marked: set[str] = set()

    def mark(self, stage: str) -> None:
        """Observe ``stage`` the first time it is reached (later ones are not the first
        delivery's).  Observed at once, by the thread that reaches it: the opener thread
        may mark ``opened`` after the delivery thread marked ``answer``."""
        if stage not in self.marked:
            self.marked.add(stage)
            seconds = max(0.0, time.monotonic() - self.taken)
            _BY_STAGE[stage].observe(seconds)


@contextmanager
def opening(timing: TakeoverTiming | None) -> Iterator[None]:
    """Within: a channel opened on this thread carries ``timing`` (see :func:`current`)."""
    _local.timing = timing
    try:
        yield
    finally:
        _local.timing = None


def current() -> TakeoverTiming | None:
    """The timing of the opening under way on this thread, if it is a take-over's; it is
    handed out once."""
    timing: TakeoverTiming | None = getattr(_local, "timing", None)
    if timing is not None:
        _local.timing = None
    return timing
