"""Native pull (embedded) and a feed's filter going over its budget while answers that
took the feed's messages are on their way: each message such an answer took before the
breach is handed out (the answer written) or a dead letter (not written), once.  The
embedded middleware's backlog burial takes what is handed out and unsettled too, so the
end waits for those answers (``PullReader.wait_settled``); before, a written answer's
message was also a dead letter, an unwritten one's twice, and the answer that met the
breach settled what it took at once (lost when it was not written)."""

from __future__ import annotations

from typing import Any

import pytest
from wsnmom.core.pull_reader import PullReader

from tests.support.pull_breach import BIG, EARLY, BreachingFeed


@pytest.mark.parametrize("taken", ["by the answer that meets the breach", "by an earlier answer"])
@pytest.mark.parametrize("answer", ["written", "cut"])
def test_what_an_answer_took_before_the_breach_is_handed_out_or_a_dead_letter_once(
    make_broker: Any, answer: str, taken: str
) -> None:
    b = make_broker(filters__cpu_limit=0.2, filters__costly_nice=0, limits__max_age=None)
    service = b.service
    feed = BreachingFeed(service)
    assert isinstance(feed.reader, PullReader)
    if taken == "by the answer that meets the breach":
        feed.notify(EARLY, BIG)
    else:
        feed.notify(EARLY)
    with feed.held_answer() as held:  # takes EARLY (and meets BIG)
        if taken == "by an earlier answer":
            feed.notify(BIG)
            assert service.get_messages(feed.pp_id, None) == []  # meets BIG
        # the end waits for the answer, or (the defect) buried the backlog with EARLY
        feed.wait_until_the_end_waits(or_else=feed.ended)
        held.settle(answer)
    assert held.holds(b"early"), held.data
    feed.check_handed_out_or_a_dead_letter_once(answer)
