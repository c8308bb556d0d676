"""An unordered channel that parks while one of its runs prepares a redelivered batch
(the budget's thread, a content filter being slow) keeps the failed attempts it carries
for those messages (issue 23, review of the carried counts): the run, of the generation
the park ended, settles nothing, and must take nothing carried either; the messages'
redelivery after the park takes their counts up.  Before, that run took the counts and
the redelivery started afresh: a message failing for good got attempts beyond the
policy's, one more round per park."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from wsnmom.core.adapter import HEADER_MESSAGE_ID, Received
from wsnmom.core.ports import DeliveryFailed

from tests.support.handles import Msg

from .test_unordered_channel import LATER, Rig


def test_a_run_the_park_ended_takes_none_of_the_counts_carried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(in_flight=2, monkeypatch=monkeypatch)
    rig.channel.backoff = LATER  # three attempts
    rig.fail["m1"] = [DeliveryFailed("down")] * 5
    channel = rig.channel

    def message() -> Msg:
        m = Msg(1, rig.journal)
        m.headers = {HEADER_MESSAGE_ID: "id-1"}
        return m

    def park_and_unpark() -> None:
        channel._parking = True  # what the budget asks of a channel holding too much
        assert channel._park()
        channel._unpark()

    channel.start()
    rig.handle.push(message())
    rig.run_ready()  # failure 1
    park_and_unpark()
    assert channel._carried == {"id-1": 1}
    prepare = channel.prepare

    def prepare_while_parked(batch: Sequence[Received]) -> Sequence[str | None]:
        channel.prepare = prepare
        park_and_unpark()  # the budget parks the channel meanwhile
        return prepare(batch)

    channel.prepare = prepare_while_parked
    rig.handle.push(message())  # redelivered after the first park
    rig.run_ready()
    assert channel._carried == {"id-1": 1}  # before: taken by the run the park ended
    rig.handle.push(message())  # redelivered after the second park
    rig.run_ready()  # its second attempt
    assert rig.letters == [] and channel.status().failures == 2  # before: 1
    rig.retry()  # its third: exhausted
    assert rig.letters == [([1], "retries-exhausted", 3)]
