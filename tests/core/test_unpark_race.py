"""A channel the memory budget unparks while a Pause stops it ends stopped (review of
the channel's start/stop lock, issue 23): the budget's thread saw the channel parked,
the Pause then stopped it (a parked channel is no longer to be unparked), and the
unpark started it anyway, a paused subscription delivering.

The budget's thread is a thread of the test; its start waits until the test lets it go.
"""

from __future__ import annotations

import threading

from wsnmom.core.unordered import UnorderedChannel

from .test_unordered_channel import Rig


class HeldStart(UnorderedChannel[str]):
    """Its next start waits for ``release`` once ``hold`` is set."""

    hold = False
    entered: threading.Event
    release: threading.Event

    def start(self) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(10)
        super().start()


def test_a_pause_while_the_budget_unparks_the_channel_leaves_it_stopped() -> None:
    rig = Rig()
    channel = HeldStart(
        rig.engine, "sub-u", rig.handle, rig.prepare, rig.send, rig.ended.append, 1, False
    )
    channel.entered = threading.Event()
    channel.release = threading.Event()
    channel.start()
    channel._parking = True  # the budget parks it
    assert channel._park()
    assert channel.active  # parked counts as consuming
    channel.hold = True
    unparking = threading.Thread(target=channel._unpark, daemon=True)
    unparking.start()
    try:
        assert channel.entered.wait(10)  # the budget's thread saw it parked
        pausing = threading.Thread(target=channel.stop, daemon=True)  # the Pause
        pausing.start()
        pausing.join(1)  # it either waits for the unpark or (before) went ahead of it
    finally:
        channel.release.set()
    unparking.join(10)
    pausing.join(10)
    assert not unparking.is_alive() and not pausing.is_alive()
    assert not channel.active  # before: started again by the unpark
    assert len(rig.handle.starts) == rig.handle.stops  # the handle stopped last
