"""The last delivery attempts a channel keeps for operators (``ChannelStatus.attempts``,
shown on the admin page's subscription page and by the admin API)."""

from __future__ import annotations

import time

from wsnmom.core.backoff import Backoff
from wsnmom.core.channel_status import ATTEMPTS_KEPT
from wsnmom.core.ports import DeliveryFailed

from tests.support.channel_rig import Rig


def test_each_attempt_is_kept_with_its_outcome_newest_last() -> None:
    rig = Rig(backoff=Backoff(max_attempts=100, initial_delay=1.0))
    rig.channel.start()
    assert rig.channel.status().attempts == ()
    before = time.time()
    rig.failures.append(DeliveryFailed("consumer answered HTTP 503"))
    rig.deliver(1, 2)
    rig.run()  # fails
    rig.run()  # the retry succeeds
    attempts = rig.channel.status().attempts
    assert [(a.ok, a.messages, a.error) for a in attempts] == [
        (False, 2, "consumer answered HTTP 503"),
        (True, 2, None),
    ]
    assert before <= attempts[0].at <= attempts[1].at <= time.time()
    assert not any(a.deferred for a in attempts)


def test_a_batch_of_filtered_messages_is_no_attempt() -> None:
    rig = Rig(drop=lambda n: True)
    rig.channel.start()
    rig.deliver(1, 2)
    rig.run()
    assert rig.acks() == [1, 2] and rig.channel.status().attempts == ()


def test_only_the_last_ones_are_kept() -> None:
    rig = Rig(batch_size=1)
    rig.channel.start()
    for n in range(ATTEMPTS_KEPT + 5):
        rig.deliver(n)
        rig.run()
    attempts = rig.channel.status().attempts
    assert len(attempts) == ATTEMPTS_KEPT == 20
    assert all(a.ok and a.messages == 1 for a in attempts)
    assert rig.channel.delivered == ATTEMPTS_KEPT + 5
