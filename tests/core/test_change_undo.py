"""A Pause whose store write fails or is refused leaves the subscription as the store has
it: delivering (issue 23, review of the conditional writes).  For a subscription routed
into its pull point at publish time, the Pause first gives it a durable subscription of
its own (kept: a restart keeps using one it finds); the write failing then left it
paused in memory, its delivery never started, while the store said active.  And a
middleware failure while a refused change takes the stored record over is the change's
fault, not an error of the gateway."""

from __future__ import annotations

from typing import Any

import pytest
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    SubscribeRequest,
    SubscriptionState,
)
from wsnmom.core.service import BrokerService

from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"


class StoreDown(Exception):
    """The store failing a write."""


def _texts(service: BrokerService, pp_id: str) -> list[str]:
    return [etree.fromstring(m.payload).text or "" for m in service.get_messages(pp_id, None)]


@pytest.mark.parametrize("failure", ["raises", "refused"])
def test_a_pause_of_a_routed_subscription_whose_write_fails_keeps_delivering(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    s = broker.service
    assert s is not None
    pp = s.create_pull_point(CreatePullPointRequest()).id
    consumer = EndpointReference(s.pull_point_address(pp))
    sub_id = s.subscribe(SubscribeRequest(consumer, topic=simple("t:a"))).id
    assert s.registry.subscriptions[sub_id].direct
    store: Any = s.store
    real = store.update_subscription

    def update(sub: Any) -> bool:
        if failure == "raises":
            raise StoreDown("the store is down")
        other = store.get_subscription(sub.id)  # another instance wrote it meanwhile
        assert real(other)
        return bool(real(sub))

    monkeypatch.setattr(store, "update_subscription", update)
    with pytest.raises(StoreDown if failure == "raises" else errors.ResourceUnavailable):
        s.pause(sub_id)
    monkeypatch.undo()
    stored = s.store.get_subscription(sub_id)
    assert stored is not None and stored.state is SubscriptionState.ACTIVE
    assert s.get_subscription(sub_id).state is SubscriptionState.ACTIVE  # before: paused
    s.notify([note("<m>after</m>", simple("t:a"))])
    got: list[str] = []

    def arrived() -> bool:
        got.extend(_texts(s, pp))
        return bool(got)

    wait_until(arrived, 10, what="the message through the subscription's own delivery")
    assert got == ["after"]


class StartFails:
    """Wraps a subscription handle: its starts after the first raise AdapterError."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.starts = 0

    def start(self, on_message: Any, prefetch: int) -> None:
        self.starts += 1
        if self.starts > 1:
            raise AdapterError("the middleware refuses the consumer")
        self.real.start(on_message, prefetch=prefetch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_middleware_failure_while_a_refused_resume_takes_the_store_over_is_a_fault(
    service: BrokerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Resume's write is refused (another instance resumed it too): this instance
    stops its delivery again, reads the store (active) and starts it as the store says;
    that start failing is ResumeFailed, not an AdapterError (before: a 500)."""
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    service.pause(sub_id)
    channel = service.engine.channel(sub_id)
    assert channel is not None
    handle = StartFails(channel.handle)
    channel.handle = handle  # type: ignore[assignment]
    store: Any = service.store
    real = store.update_subscription

    def update(sub: Any) -> bool:
        other = store.get_subscription(sub.id)  # the other instance's Resume, meanwhile
        other.state = SubscriptionState.ACTIVE
        assert real(other)
        return bool(real(sub))

    monkeypatch.setattr(store, "update_subscription", update)
    with pytest.raises(errors.ResumeFailed):
        service.resume(sub_id)
    assert handle.starts == 2  # its own start, then the store's
