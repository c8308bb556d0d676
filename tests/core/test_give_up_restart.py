"""A channel whose give-up could not be completed (its dead letter not confirmed) starts
again after the longest retry delay, to try the give-up again; a Pause or a close in the
meantime stops it for good (review of the channel's start/stop paths, issue 23).  Before,
the stop of the already stopped channel did nothing and the timer started it anyway: a
paused subscription delivered again.  The timer is the test's: it fires when told."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from wsnmom.core.ports import DeliveryFailed

from .test_unordered_channel import Rig


class Timers:
    """``core.later.later`` for the channel module: records, calls on ``fire``."""

    def __init__(self) -> None:
        self.due: list[Callable[[], None]] = []

    def __call__(self, delay: float, fn: Callable[[], None]) -> None:
        self.due.append(fn)

    def fire(self) -> None:
        due, self.due = self.due, []
        for fn in due:
            fn()


def _given_up_unconfirmed(monkeypatch: pytest.MonkeyPatch) -> tuple[Rig, Timers]:
    timers = Timers()
    monkeypatch.setattr("wsnmom.core.channel_give_up.later", timers)
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.confirm = False
    rig.fail["m1"] = [DeliveryFailed("down")] * 5
    rig.channel.start()
    rig.deliver(1)
    rig.channel._run(rig.engine.take_ready() or 0)
    rig.retry()
    rig.retry()
    assert rig.letters == [([1], "retries-exhausted", 3)] and rig.ended == []
    assert len(timers.due) == 1 and not rig.channel.active
    return rig, timers


def test_the_start_after_an_unconfirmed_give_up_tries_the_give_up_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, timers = _given_up_unconfirmed(monkeypatch)
    timers.fire()
    assert rig.channel.active  # started again: the give-up is tried again


@pytest.mark.parametrize("how", ["stop", "close"])
def test_a_pause_or_close_before_that_start_keeps_the_channel_stopped(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    rig, timers = _given_up_unconfirmed(monkeypatch)
    getattr(rig.channel, how)()  # a Pause (or the subscription destroyed)
    starts = len(rig.handle.starts)
    timers.fire()
    assert not rig.channel.active  # before: started by the timer after the Pause
    assert len(rig.handle.starts) == starts
