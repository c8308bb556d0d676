"""A feed's change that waits for the middleware holds no other feed's change
(``core.pull_feeds``): a Pause, an Unsubscribe or an operator's purge of a feed publishes
what reached its pull point into the pull point's inbox, and while the middleware is slow
to confirm that publish (up to the publish timeout) a Pause of a subscription feeding
another pull point is answered.  Run on the file-log reference adapter (core's pull
buffer) and on the embedded one (native pull)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from wsnmom.core.adapter import OutboundMessage
from wsnmom.core.codec import pull_point_inbox
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource, PullPoint, Subscription
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService

from tests.core.test_pull_feeds import FILELOG, XPATH, drain, payloads
from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req

#: a MessageContent filter every message passes: the subscription is read as a feed (a
#: subscription without one is routed into its pull point at publish time on the
#: embedded middleware, the sole publisher)
EVERY = ExpressionSource(XPATH, "true()", {})


@pytest.fixture(params=["buffer", "native"])
def fed_broker(request: pytest.FixtureRequest, make_broker: Callable[..., Broker]) -> Broker:
    """The file log (core's pull buffer) or the embedded middleware (native pull)."""
    url = FILELOG if request.param == "buffer" else None
    return make_broker(adapter_url=url, limits__max_age=None)


class HeldInbox:
    """The next publish into pull point ``pp_id``'s inbox waits (as one the middleware
    does not confirm waits, up to the publish timeout) until ``release`` is set, then
    goes through; ``entered`` is set once it waits.  The other publishes go through."""

    def __init__(self, service: BrokerService, pp_id: str) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        inbox = pull_point_inbox(pp_id)
        adapter: Any = service.adapter
        real = adapter.publish_many

        def held(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
            if any(m.topic == inbox for m in messages) and not self.entered.is_set():
                self.entered.set()
                self.release.wait(60)
            return real(messages, timeout=timeout)

        adapter.publish_many = held


def _feeding(service: BrokerService, topic: str) -> tuple[PullPoint, Subscription]:
    pp = service.create_pull_point(CreatePullPointRequest())
    address = service.pull_point_address(pp.id)
    sub = service.subscribe(sub_req(address, topic=simple(topic), message_content=EVERY))
    assert service.registry.subscriptions[sub.id].feed is not None
    return pp, sub


def _waiting(service: BrokerService, pp_id: str, sub_id: str, n: int) -> None:
    """Until ``n`` of the feed's messages reached the pull point (buffered, or waiting in
    the subscription's own queue for native pull)."""
    reader = service.registry.pull_points[pp_id].reader
    handle = service.registry.subscriptions[sub_id].handle
    assert handle is not None

    def there() -> bool:
        if isinstance(reader, PullBuffer):
            return bool(reader.buffered() == n)
        return bool(handle.depth() == n)

    wait_until(there, 10, what=f"{n} message(s) of the feed waiting")


@pytest.mark.parametrize("change", ["pause", "unsubscribe", "purge"])
def test_another_feeds_pause_is_answered_while_a_feeds_inbox_publish_waits(
    fed_broker: Broker, change: str
) -> None:
    """``change`` of a feed whose messages reached its pull point publishes them into the
    pull point's inbox, which the middleware is slow to confirm.  A Pause of a
    subscription feeding another pull point is answered meanwhile; once the publish went
    through, the kept messages come from the first pull point and the other feed,
    resumed, delivers.  Before, the publish was made under the lock that serialises
    every feed's changes: the Pause was answered only once the publish returned."""
    service = fed_broker.service
    assert service is not None
    pp, sub = _feeding(service, "t:a")
    other_pp, other = _feeding(service, "t:o")
    service.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(2)])
    _waiting(service, pp.id, sub.id, 2)
    held = HeldInbox(service, pp.id)
    act: Callable[[str], object] = {
        "pause": service.pause,
        "unsubscribe": service.unsubscribe,
        "purge": service.purge_subscription,
    }[change]
    with ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(act, sub.id)
            assert held.entered.wait(30), "no publish into the inbox"
            paused = pool.submit(service.pause, other.id)
            wait_until(paused.done, 20, what="the other feed's Pause answered")
            assert not first.done()  # all that while the inbox publish waited
        finally:
            held.release.set()
        paused.result()
        first.result(timeout=30)
    assert payloads(drain(service, pp.id, 2)) == [b"<m>0</m>", b"<m>1</m>"]
    service.resume(other.id)
    service.notify([note("<m>other</m>", simple("t:o"))])
    assert payloads(drain(service, other_pp.id, 1)) == [b"<m>other</m>"]
