"""What a client sees while the stop of a feed whose end another instance made waits for
an answer on its way (``PullFeeds.detach(here=False)``: the feed's handle stops, and the
adapter forgets the durable subscription, once the answer settled, at most
``pull_fed.SETTLE_WAIT`` later, on a thread of its own).  The answer settles when the
server closes its body after writing it whole (``soap_frontend.settled_answers``: the end
of ``held_answer``'s block here), and the stop ends then, not ``SETTLE_WAIT`` later.
Meanwhile the feed is out of its pull point's reader, its handle still consuming: a new
subscription to the same pull point is read at once, and what it and the held answer hand
out comes once; a DestroyPullPoint meanwhile leaves that stop to finish as before.  The
other instance is played by the store (the subscription's record deleted there, this
instance following it as its follow thread does).  Run on the file-log reference adapter
(core's buffer) and on the embedded one (native pull)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from wsnmom.core import errors
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_fed import SETTLE_WAIT
from wsnmom.core.service import BrokerService

from tests.core.test_pull_feeds import FILELOG, XPATH
from tests.support.pull_answers import held_answer, pulled_until_sentinel, wsgi_app
from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req

#: a MessageContent filter every message passes: read as a feed on either middleware
EVERY = ExpressionSource(XPATH, "true()", {})


@pytest.fixture(params=["buffer", "native"])
def service(request: pytest.FixtureRequest, make_broker: Callable[..., Broker]) -> BrokerService:
    url = FILELOG if request.param == "buffer" else None
    svc = make_broker(adapter_url=url, limits__max_age=None).service
    assert svc is not None
    return svc


def _stop_of(sub_id: str) -> threading.Thread | None:
    """The thread stopping the ended feed's handle once its answers settled."""
    for thread in threading.enumerate():
        if thread.name == f"feed-end-{sub_id[:8]}":
            return thread
    return None


def _ended_once_settled(stop: threading.Thread, caplog: pytest.LogCaptureFixture) -> None:
    """The stop ended soon after the held answer settled (its body closed), well before
    ``SETTLE_WAIT``, and without the warning of a stop that gave up waiting."""
    stop.join(SETTLE_WAIT / 2)
    assert not stop.is_alive(), "the stop still waits after the answer settled"
    gave_up = [r.getMessage() for r in caplog.records if "still on its way" in r.getMessage()]
    assert gave_up == []


def _followed_end_waiting(service: BrokerService, pp_id: str, topic: str) -> str:
    """A subscription feeding ``pp_id`` on ``topic``, its message ``<m>0</m>`` waiting,
    and ended through another instance (its record deleted in the store, followed here)
    while the caller holds an answer that took the message: its id."""
    address = service.pull_point_address(pp_id)
    sub = service.subscribe(sub_req(address, topic=simple(topic), message_content=EVERY))
    service.notify([note("<m>0</m>", simple(topic))])
    reader = service.registry.pull_points[pp_id].reader
    handle = service.registry.subscriptions[sub.id].handle
    assert handle is not None
    if isinstance(reader, PullBuffer):
        wait_until(lambda: reader.buffered() == 1, 10, what="<m>0</m> buffered")
    else:
        wait_until(lambda: handle.depth() == 1, 10, what="<m>0</m> in the subscription")
    return str(sub.id)


def test_a_new_subscription_to_the_pull_point_while_the_stop_waits_hands_out_once(
    service: BrokerService, caplog: pytest.LogCaptureFixture
) -> None:
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    old = _followed_end_waiting(service, pp.id, "t:w")
    caplog.set_level(logging.WARNING, logger="wsnmom")
    with held_answer(app, pp.id) as held:  # takes <m>0</m>
        assert service.store.delete_subscription(old)
        assert service.follower.load("subscription", old) is None
        stop = _stop_of(old)
        assert stop is not None and stop.is_alive()  # the window: the stop waits
        with pytest.raises(errors.ResourceUnknown):
            service.unsubscribe(old)  # gone here too
        address = service.pull_point_address(pp.id)
        service.subscribe(sub_req(address, topic=simple("t:w"), message_content=EVERY))
        service.notify([note("<m>1</m>", simple("t:w")), note("<m>sentinel</m>", simple("t:w"))])
        assert pulled_until_sentinel(service, pp.id) == [b"<m>1</m>", b"<m>sentinel</m>"]
        assert stop.is_alive()  # all that while the stop waited
        held.write()
    assert held.holds(b"<m>0</m>"), held.data
    _ended_once_settled(stop, caplog)
    # the old feed's handle stopped and forgotten: the new subscription alone delivers
    service.notify([note("<m>2</m>", simple("t:w")), note("<m>sentinel</m>", simple("t:w"))])
    assert pulled_until_sentinel(service, pp.id) == [b"<m>2</m>", b"<m>sentinel</m>"]


def test_a_destroy_of_the_pull_point_while_the_stop_waits_leaves_it_to_finish(
    service: BrokerService, caplog: pytest.LogCaptureFixture
) -> None:
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    old = _followed_end_waiting(service, pp.id, "t:d")
    with held_answer(app, pp.id) as held:  # takes <m>0</m>
        assert service.store.delete_subscription(old)
        assert service.follower.load("subscription", old) is None
        stop = _stop_of(old)
        assert stop is not None and stop.is_alive()
        service.destroy_pull_point(pp.id)
        assert pp.id not in service.registry.pull_points
        caplog.set_level(logging.WARNING, logger="wsnmom")
        held.write()
        assert stop.is_alive()  # written, its body not closed yet: not settled
    # closed: the written answer's settlement acknowledged <m>0</m> and counted it down
    _ended_once_settled(stop, caplog)
    assert held.holds(b"<m>0</m>"), held.data
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == []
