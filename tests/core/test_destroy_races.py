"""A subscription destroyed while this instance is about to open or restart its delivery
stays destroyed (issue 23, review of the conditional writes): a shard gained, a change
of another instance being followed, and a lookup that loads the subscription from the
store must not bring back, in memory and in the middleware, one an Unsubscribe removed.

Each race is played in one order, the one that lost the subscription before: the test
runs the Unsubscribe exactly at the point where the other party has looked the
subscription up and not yet acted on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from wsnmom.core.model import SubscriptionState
from wsnmom.core.ownership import Ownership
from wsnmom.core.service import BrokerService

from .conftest import RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"


def _assert_gone(service: BrokerService, outbound: RecordingOutbound, sub_id: str) -> None:
    assert sub_id not in service.registry.subscriptions
    assert service.engine.channel(sub_id) is None
    assert service.store.get_subscription(sub_id) is None
    service.notify([note("<m>after</m>", simple("t:a"))])
    outbound.wait_messages(CONTROL, 1)  # the sentinel: published after, delivered
    assert outbound.payloads_to(VICTIM) == []


def test_a_shard_gained_while_its_subscription_is_destroyed_does_not_bring_it_back(
    service: BrokerService, outbound: RecordingOutbound, ownership: Ownership
) -> None:
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    service.engine.close_channel(sub_id)  # its shard was lost a moment ago
    looked_up = ownership._of

    def of_then_unsubscribe(shards: set[int]) -> list[Any]:
        found = looked_up(shards)
        service.unsubscribe(sub_id)  # between the look-up and the opening
        return found

    ownership._of = of_then_unsubscribe  # type: ignore[method-assign]
    ownership.gained(set(range(service.settings.cluster.shards)))
    assert ownership.settled()  # the openings are made by the opener threads
    _assert_gone(service, outbound, sub_id)


def test_a_resume_followed_while_the_subscription_is_destroyed_does_not_restart_it(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    service.pause(sub_id)
    # another instance resumed it: the store has it active, at a higher revision
    other = service.store.get_subscription(sub_id)
    assert other is not None
    other = replace(other, state=SubscriptionState.ACTIVE)
    assert service.store.update_subscription(other)
    subscriptions = service.subscriptions
    adopt = subscriptions.adopt

    def unsubscribe_then_adopt(live: Any, stored: Any, *, force: bool = False) -> None:
        service.unsubscribe(sub_id)  # after the follower looked both up, before it applies
        adopt(live, stored, force=force)

    subscriptions.adopt = unsubscribe_then_adopt  # type: ignore[method-assign]
    try:
        service.follower.load("subscription", sub_id)
    finally:
        del subscriptions.adopt
    _assert_gone(service, outbound, sub_id)


def test_a_lookup_loading_a_subscription_being_destroyed_does_not_bring_it_back(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    """A lookup of the subscription (a second Unsubscribe, a GetCurrentMessage) while its
    Unsubscribe runs finds it in neither the registry nor the store; before, the store
    was emptied last and the lookup loaded it again, its durable subscription made anew
    and never deleted."""
    sub_id = service.subscribe(sub_req(VICTIM, topic=simple("t:a"))).id
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    adapter: Any = service.adapter
    delete = adapter.delete_subscription
    loaded: list[object] = []

    def delete_then_look_up(name: str) -> None:
        delete(name)
        loaded.append(service.follower.load("subscription", sub_id))

    adapter.delete_subscription = delete_then_look_up
    try:
        service.unsubscribe(sub_id)
    finally:
        del adapter.delete_subscription
    assert loaded == [None]
    _assert_gone(service, outbound, sub_id)
