"""A pull point's message past ``limits.max_age`` at GetMessages, where core enforces it
(the file log, Kafka: core/pull_points.py, core/limits.py): a dead letter ("max-age"), never
handed out; a fed one its subscription's, one of the pull point's inbox the pull point's.
Before, both were dropped without a dead letter.  A dead letter the middleware does not
confirm cuts the answer there: the message is handed out again, first, by the next
GetMessages, which tries its dead letter again.  An answer that is not written gives back
what it handed out, not what it made dead letters: those are settled all the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wsnmom.core.adapter import AdapterError, OutboundMessage
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService

from tests.support.pull_answers import cut, pulled_until_sentinel, written, written_up_to, wsgi_app
from tests.support.pull_breach import GraveRefusal
from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req
from .test_pull_feed_stall import aged, expired_count

__all__ = ["aged"]  # the fixture, used by name


def _buffered(service: BrokerService, pp_id: str, count: int) -> None:
    """Wait until the pull point's buffer holds ``count`` messages."""
    reader = service.registry.pull_points[pp_id].reader
    assert isinstance(reader, PullBuffer)
    wait_until(lambda: reader.buffered() == count, 10, what=f"{count} buffered")


def _old_in_inbox(b: Broker) -> tuple[BrokerService, str]:
    """A pull point whose inbox holds ``old``, past max_age, then the sentinel."""
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<m>old</m>")])
    b.clock.advance(minutes=2)
    service.notify_pull_point(pp.id, [note("<m>sentinel</m>")])
    _buffered(service, pp.id, 2)
    return service, pp.id


def test_a_pull_points_own_message_past_max_age_is_its_dead_letter(aged: Broker) -> None:
    service, pp_id = _old_in_inbox(aged)
    assert pulled_until_sentinel(service, pp_id) == [b"<m>sentinel</m>"]
    wait_until(service.dead_letters, 10, what="old's dead letter")
    [letter] = service.dead_letters()
    assert letter.body == b"<m>old</m>" and letter.reason == "max-age"
    assert letter.subscription_id == pp_id and letter.attempts == 0


def test_a_fed_message_that_aged_in_the_buffer_is_its_subscriptions_dead_letter(
    aged: Broker,
) -> None:
    """``old`` was fresh when its feed prepared it (buffered), and is past max_age when
    GetMessages takes it."""
    service: BrokerService = aged.service
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    service.notify([note("<m>old</m>", simple("t:a"))])
    _buffered(service, pp.id, 1)
    aged.clock.advance(minutes=2)
    service.notify([note("<m>sentinel</m>", simple("t:a"))])
    assert pulled_until_sentinel(service, pp.id) == [b"<m>sentinel</m>"]
    wait_until(service.dead_letters, 10, what="old's dead letter")
    [letter] = service.dead_letters()
    assert letter.body == b"<m>old</m>" and letter.reason == "max-age"
    assert letter.subscription_id == sub.id


def test_a_refused_dead_letter_at_get_messages_loses_nothing(aged: Broker) -> None:
    """``old``'s dead letter is refused: the answer stops before it (nothing handed out,
    the sentinel behind it kept too), and the next GetMessages makes it a dead letter
    once the middleware confirms it, then hands out the sentinel, once."""
    service, pp_id = _old_in_inbox(aged)
    refusal = GraveRefusal(service, refuse=1)
    expired_before = expired_count()
    assert service.get_messages(pp_id, None) == []
    assert refusal.tries == 1
    assert expired_count() == expired_before  # not gone yet: not counted
    _buffered(service, pp_id, 2)  # both handed out again, first
    assert pulled_until_sentinel(service, pp_id) == [b"<m>sentinel</m>"]
    assert refusal.tries == 2
    wait_until(service.dead_letters, 10, what="old's dead letter")
    [letter] = service.dead_letters()
    assert letter.body == b"<m>old</m>" and letter.reason == "max-age"
    assert expired_count() - expired_before == 1  # once, when its dead letter was confirmed


def test_an_answer_cut_at_a_refused_dead_letter_settles_what_it_took_before(
    aged: Broker,
) -> None:
    """Two messages past max_age, the pull point's own ``old1`` then the fed ``old2``: the
    dead letter of ``old2`` is refused once.  The answer stops there: ``old1`` is a dead
    letter (the pull point's) and settled, ``old2`` and the sentinel are handed out again,
    first: ``old2`` is then its subscription's dead letter, each once, and the sentinel is
    handed out once."""
    service: BrokerService = aged.service
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    service.notify_pull_point(pp.id, [note("<m>old1</m>")])
    _buffered(service, pp.id, 1)
    service.notify([note("<m>old2</m>", simple("t:a"))])
    _buffered(service, pp.id, 2)
    aged.clock.advance(minutes=2)
    service.notify_pull_point(pp.id, [note("<m>sentinel</m>")])
    _buffered(service, pp.id, 3)
    adapter: Any = service.adapter
    confirmed = adapter.publish_many

    def refused_once(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
        if any(m.body == b"<m>old2</m>" for m in messages) and not refused:
            refused.append(True)
            raise AdapterError("dead letters not confirmed")
        return confirmed(messages, timeout=timeout)

    refused: list[bool] = []
    adapter.publish_many = refused_once
    assert service.get_messages(pp.id, None) == []
    assert refused  # old2's refused; old1's confirmed (below)
    _buffered(service, pp.id, 2)  # old2 and the sentinel, first again
    assert pulled_until_sentinel(service, pp.id) == [b"<m>sentinel</m>"]
    wait_until(lambda: len(service.dead_letters()) == 2, 10, what="both dead letters")
    letters = {letter.body: letter for letter in service.dead_letters()}
    assert sorted(letters) == [b"<m>old1</m>", b"<m>old2</m>"]
    assert letters[b"<m>old1</m>"].subscription_id == pp.id
    assert letters[b"<m>old2</m>"].subscription_id == sub.id
    assert {letter.reason for letter in letters.values()} == {"max-age"}


def test_an_unwritten_answer_gives_back_its_messages_not_its_dead_letters(aged: Broker) -> None:
    """``old`` (past max_age) then the sentinel in the inbox; the answer holding the
    sentinel is not written (its client went away: the server took its body, and its
    write never returned).  ``old``'s dead letter was confirmed before the answer was
    made, so ``old`` is settled all the same: only the sentinel comes again, and ``old``
    is one dead letter.  Before, the give-back returned ``old`` too and the next
    GetMessages made it a dead letter again (two of one message, one answer's worth)."""
    service, pp_id = _old_in_inbox(aged)
    app = wsgi_app(service)
    expired_before = expired_count()
    assert cut(app, pp_id) == ["sentinel"]
    assert expired_count() - expired_before == 1
    assert written(app, pp_id) == ["sentinel"]  # given back, first again
    assert expired_count() - expired_before == 1  # old was not buried again
    # a later dead letter as a barrier: once it is listed, so would be a second of old's
    service.notify_pull_point(pp_id, [note("<m>later</m>")])
    aged.clock.advance(minutes=2)
    service.notify_pull_point(pp_id, [note("<m>sentinel2</m>")])
    assert written_up_to(app, pp_id, "sentinel2") == ["sentinel2"]
    wait_until(
        lambda: any(d.body == b"<m>later</m>" for d in service.dead_letters()),
        10,
        what="the barrier's dead letter",
    )
    letters = service.dead_letters()
    assert [d.body for d in letters] == [b"<m>old</m>", b"<m>later</m>"]
    assert {d.reason for d in letters} == {"max-age"}
