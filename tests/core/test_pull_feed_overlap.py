"""A feed's end here overlapping its end through another instance (``core.pull_feeds``):
the subscription's filter goes over its budget while an answer holding one of the feed's
messages is on its way, and as the end here stops the feed (before its backlog goes to
its dead letters), this instance follows the subscription's end through another instance
(its record deleted from the store: ``SubscriptionChanges.forget`` ->
``PullFeeds.detach(here=False)``), before the stop or during it.  The message is handed
out once, and not also a dead letter.  Run on the file-log reference adapter (core's pull
buffer) and on the embedded one (native pull, whose burial of a backlog takes what is
handed out and unsettled too)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_fed import Unsettled
from wsnmom.core.pull_feeds import PullFeeds
from wsnmom.core.pull_reader import PullReader

from tests.core.test_pull_feeds import FILELOG
from tests.support.pull_answers import pulled
from tests.support.pull_breach import BIG, EARLY, BreachingFeed
from tests.support.waiting import wait_until

from .conftest import Broker, note


@pytest.mark.parametrize("when", ["before the stop", "during the stop"])
@pytest.mark.parametrize("pull", ["buffer", "native"])
def test_an_answer_on_its_way_when_both_ends_overlap_is_handed_out_and_not_a_dead_letter(
    make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch, pull: str, when: str
) -> None:
    """Before, the end here did not wait for the answer when the followed end had
    removed the feed (before its stop, or during it: ``wait_settled`` found no feed),
    and buried the backlog while the answer held the message: a dead letter, and handed
    out once the answer was written."""
    url = FILELOG if pull == "buffer" else None
    b = make_broker(
        adapter_url=url, filters__cpu_limit=0.2, filters__costly_nice=0, limits__max_age=None
    )
    service = b.service
    assert service is not None
    feed = BreachingFeed(service)
    reader = feed.reader
    feed.notify(EARLY)
    if isinstance(reader, PullBuffer):
        wait_until(lambda: reader.buffered() == 1, 10, what="the early message buffered")

    def follow_the_other_end() -> None:
        assert service.store.delete_subscription(feed.sub_id)
        assert service.follower.load("subscription", feed.sub_id) is None

    ender: list[threading.Thread] = []
    real_stop = PullFeeds.stop

    def stop(self: PullFeeds, state: Any) -> bool:
        if state.record.id == feed.sub_id:
            ender.append(threading.current_thread())  # the end here (its give-up thread)
            if when == "before the stop":
                follow_the_other_end()
        return bool(real_stop(self, state))

    monkeypatch.setattr(PullFeeds, "stop", stop)
    kind = type(reader)
    real_suspend = kind.suspend_feed

    followed: list[bool] = []

    def suspend(self: PullBuffer | PullReader, name: str, **kwargs: Any) -> Any:
        # the end here's suspension of the feed (the follow's removal suspends it too)
        ending = ender and threading.current_thread() is ender[0] and name == feed.sub_id
        if when == "during the stop" and ending and not followed:
            followed.append(True)
            follow_the_other_end()
        return real_suspend(self, name, **kwargs)

    monkeypatch.setattr(kind, "suspend_feed", suspend)
    waiting: set[threading.Thread] = set()
    real_wait = Unsettled.wait

    def wait(self: Unsettled, timeout: float) -> bool:
        waiting.add(threading.current_thread())
        return bool(real_wait(self, timeout))

    monkeypatch.setattr(Unsettled, "wait", wait)
    with feed.held_answer() as held:  # takes EARLY
        feed.notify(BIG)  # over the budget: the subscription ends here
        if isinstance(reader, PullReader):
            assert service.get_messages(feed.pp_id, None) == []  # meets BIG
        # the end here waits for the answer, or (the defect) buried the backlog
        wait_until(
            lambda: (ender and ender[0] in waiting) or service.dead_letters(),
            30,
            what="the end here waiting for the answer",
        )
        held.write()
    assert held.holds(b"early"), held.data
    ender[0].join(30)
    assert not ender[0].is_alive(), "the end here did not finish"
    assert EARLY.encode()[:20] not in [d.body[:20] for d in service.dead_letters()]
    service.notify_pull_point(feed.pp_id, [note("<m>sentinel</m>")])
    assert pulled(service, feed.pp_id, 1) == [b"<m>sentinel</m>"]  # nothing kept
