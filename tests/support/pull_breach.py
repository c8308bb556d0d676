"""A pull point fed by a subscription whose filter goes over its budget while answers
that took the feed's messages are on their way, as the pull tests play it on each
middleware: the filter (``CUBIC``, minutes of CPU on ``BIG``, far past any filter budget:
the subscription ends, its backlog goes to the dead letters), the feed, its messages, and
the waits and checks of its end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from wsnmom.core.adapter import AdapterError, OutboundMessage, SubscriptionHandle
from wsnmom.core.dead_letter_records import DEAD_LETTER_NAMESPACE
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.service import BrokerService

from tests.core.conftest import note, simple, sub_req
from tests.support.pull_answers import HeldAnswer, held_answer, pulled, wsgi_app
from tests.support.waiting import wait_until

XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: nested location paths: minutes of CPU on BIG, far past any filter budget
CUBIC = "count(//a[count(//a[count(//a) > 0]) > 0]) > 0"
BIG = "<r>" + "<a/>" * 3000 + "</r>"
#: a message the filter passes at once
EARLY = "<r><a/><e>early</e></r>"
#: the feed's topic
TOPIC = "t:e"


class BreachingFeed:
    """A new pull point (``pp_id``, read by ``reader``) and the subscription feeding it
    (``sub_id``) with the filter ``CUBIC``, on ``service``; ``app``: the gateway's WSGI
    application over it."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.app = wsgi_app(service)
        self.pp_id = service.create_pull_point(CreatePullPointRequest()).id
        self.reader = service.registry.pull_points[self.pp_id].reader
        content = ExpressionSource(XPATH10, CUBIC, {})
        address = service.pull_point_address(self.pp_id)
        request = sub_req(address, topic=simple(TOPIC), message_content=content)
        self.sub_id = service.subscribe(request).id

    def notify(self, *payloads: str) -> None:
        """Publish ``payloads`` on the feed's topic, in one Notify."""
        self.service.notify([note(p, simple(TOPIC)) for p in payloads])

    def held_answer(self) -> AbstractContextManager[HeldAnswer]:
        """A GetMessages answer of the pull point held on its way for the block."""
        return held_answer(self.app, self.pp_id)

    def ended(self) -> bool:
        return self.sub_id not in self.service.registry.subscriptions

    def wait_until_the_end_waits(self, or_else: Callable[[], object] | None = None) -> None:
        """Until the subscription's end waits for an answer on its way (the reader is
        ``settling`` it), or ``or_else`` says what the defect under test did instead."""
        wait_until(
            lambda: self.reader.settling(self.sub_id) or (or_else is not None and or_else()),
            30,
            what="the end waiting for the answer",
        )

    def wait_for_the_end(self) -> None:
        wait_until(self.ended, 30, what="the end")

    def check_handed_out_or_a_dead_letter_once(self, how: str) -> None:
        """An answer took ``EARLY`` before the breach and was settled ``how`` ("written"
        or "cut"): the subscription ends; ``BIG`` is a dead letter, and ``EARLY`` too
        when cut (once each); nothing is kept in the pull point's inbox."""
        service = self.service
        self.wait_for_the_end()
        bodies = [BIG.encode()[:20]] + ([EARLY.encode()[:20]] if how == "cut" else [])
        wait_until(lambda: len(service.dead_letters()) >= len(bodies), 15, what="the dead letters")
        service.notify_pull_point(self.pp_id, [note("<m>sentinel</m>")])
        assert pulled(service, self.pp_id, 1) == [b"<m>sentinel</m>"]  # nothing kept
        assert sorted(d.body[:20] for d in service.dead_letters()) == sorted(bodies)


def buffered_feed(service: BrokerService) -> tuple[BreachingFeed, PullBuffer]:
    """A ``BreachingFeed`` read through core's buffer (the default pull), ``EARLY`` in
    the buffer; the buffer."""
    feed = BreachingFeed(service)
    buffer = feed.reader
    assert isinstance(buffer, PullBuffer)
    feed.notify(EARLY)
    wait_until(lambda: buffer.buffered() == 1, 10, what="the early message buffered")
    return feed, buffer


def queued_feed(service: BrokerService, *payloads: str) -> tuple[BreachingFeed, SubscriptionHandle]:
    """A ``BreachingFeed`` read from the subscription's own queue (``pull = "get"``),
    ``payloads`` (one Notify) waiting in it; the subscription's handle."""
    feed = BreachingFeed(service)
    assert isinstance(feed.reader, PullReader)
    handle = service.registry.subscriptions[feed.sub_id].handle
    assert handle is not None
    feed.notify(*payloads)
    n = len(payloads)
    wait_until(lambda: handle.depth() == n, 10, what=f"{n} message(s) in the queue")
    return feed, handle


class GraveRefusal:
    """The middleware does not confirm the next ``refuse`` publishes of dead letters
    (``adapter.publish_many`` raising what an unconfirmed publish raises); ``tries``: the
    publishes of dead letters."""

    def __init__(self, service: BrokerService, refuse: int) -> None:
        self.refuse = refuse
        self.tries = 0
        adapter: Any = service.adapter
        real = adapter.publish_many

        def refused(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
            if any(m.topic.namespace == DEAD_LETTER_NAMESPACE for m in messages):
                self.tries += 1
                if self.refuse > 0:
                    self.refuse -= 1
                    raise AdapterError("dead letters not confirmed")
            return real(messages, timeout=timeout)

        adapter.publish_many = refused
