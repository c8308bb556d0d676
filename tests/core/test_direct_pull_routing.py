"""Subscriptions feeding a pull point on a middleware with no other publisher
(``Capabilities.sole_publisher``, the embedded adapter) are routed into the pull point when
a notification is published: no durable subscription of their own, nothing to forward, and
the same WS-N behaviour as a subscription with its own queue (filters, one copy per
subscription, pause accumulates, unsubscribe stops, restart keeps everything)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from lxml import etree
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    SubscribeRequest,
    SubscriptionState,
)
from wsnmom.core.service import BrokerService
from wsnmom.core.store_documents import subscription_from_json, subscription_to_json

from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, wait_idle

XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"


def texts(service: BrokerService, pp_id: str) -> list[str]:
    return [etree.fromstring(m.payload).text or "" for m in service.get_messages(pp_id, None)]


def feed(
    service: BrokerService, pp_id: str, topic: str | None = "t:a", **kw: Any
) -> tuple[str, str]:
    consumer = EndpointReference(service.pull_point_address(pp_id))
    sub = service.subscribe(
        SubscribeRequest(consumer, topic=simple(topic) if topic else None, **kw)
    )
    return sub.id, service.subscription_address(sub.id)


def new_pp(service: BrokerService) -> str:
    return service.create_pull_point(CreatePullPointRequest()).id


def native_names(broker: Broker) -> list[str]:
    assert broker.adapter is not None
    return broker.adapter.subscription_names()


def test_routed_at_publish_time_without_own_durable_subscription(broker: Broker) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, sub_address = feed(s, pp)
    assert sub_id not in native_names(broker)
    assert s.registry.subscriptions[sub_id].direct
    s.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(3)])
    s.notify([note("<m>other</m>", simple("t:b"))])
    # no forwarding step: the copies are in the pull point when Notify returns
    got = s.get_messages(pp, None)
    assert [etree.fromstring(m.payload).text for m in got] == ["0", "1", "2"]
    assert all(m.subscription_reference is not None for m in got)
    assert {m.subscription_reference.address for m in got if m.subscription_reference} == {
        sub_address
    }
    assert {m.topic_dialect for m in got} == {
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
    }


def test_one_copy_per_matching_subscription_and_filters_apply(broker: Broker) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    _, first = feed(s, pp, "t:a")
    _, everything = feed(s, pp, None)
    content = ExpressionSource(XPATH, "boolean(/m[@k='yes'])", {})
    filtered_id, filtered = feed(s, pp, "t:a", message_content=content)
    # a MessageContent filter is never evaluated on the publishing thread: that
    # subscription has a durable subscription and a channel of its own
    assert not s.registry.subscriptions[filtered_id].direct
    assert filtered_id in native_names(broker)
    s.notify([note("<m k='no'>1</m>", simple("t:a"))])
    s.notify([note("<m k='yes'>2</m>", simple("t:a"))])
    s.notify([note("<m>3</m>", simple("t:b"))])
    # the barrier: a sentinel every subscription takes, the filtered one included
    s.notify([note("<m k='yes'>sentinel</m>", simple("t:a"))])
    by_sub: dict[str, list[str]] = {}

    def sentinels() -> bool:
        for m in s.get_messages(pp, None):
            assert m.subscription_reference is not None
            by_sub.setdefault(m.subscription_reference.address, []).append(
                etree.fromstring(m.payload).text or ""
            )
        return all("sentinel" in by_sub.get(sub, []) for sub in (first, everything, filtered))

    wait_until(sentinels, 10, what="the sentinel in each subscription")
    assert by_sub == {
        first: ["1", "2", "sentinel"],
        everything: ["1", "2", "3", "sentinel"],
        filtered: ["2", "sentinel"],
    }


def test_topicless_subscription_does_not_see_other_pull_points_inboxes(
    broker: Broker,
) -> None:
    s = broker.service
    assert s is not None
    pp, other = new_pp(s), new_pp(s)
    feed(s, pp, None)
    s.notify_pull_point(other, [note("<m>private</m>")])
    assert texts(s, pp) == []
    assert texts(s, other) == ["private"]


def test_unsubscribe_and_expiry_stop_routing(broker: Broker) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    s.notify([note("<m>before</m>", simple("t:a"))])
    s.unsubscribe(sub_id)
    s.notify([note("<m>after</m>", simple("t:a"))])
    # what was routed before the Unsubscribe is the pull point's, like any delivery
    assert texts(s, pp) == ["before"]
    assert len(s.delivery.direct.index) == 0
    short, _ = feed(s, pp, initial_termination_time=broker.clock() + timedelta(seconds=5))
    broker.clock.advance(seconds=10)
    s.notify([note("<m>late</m>", simple("t:a"))])
    assert texts(s, pp) == []
    s.sweep()
    assert short not in s.registry.subscriptions


def test_destroying_the_pull_point_destroys_routed_subscriptions(broker: Broker) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    s.destroy_pull_point(pp)
    assert sub_id not in s.registry.subscriptions and len(s.delivery.direct.index) == 0
    assert s.store.get_subscription(sub_id) is None
    s.notify([note("<m>x</m>", simple("t:a"))])  # routes nowhere, fails nothing


def test_pause_accumulates_in_an_own_durable_subscription_and_resume_delivers_in_order(
    broker: Broker,
) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    s.notify([note("<m>0</m>", simple("t:a"))])
    s.pause(sub_id)
    state = s.registry.subscriptions[sub_id]
    assert not state.direct and state.record.queued and state.handle is not None
    assert sub_id in native_names(broker)
    stored = s.store.get_subscription(sub_id)
    assert stored is not None and stored.queued and stored.state is SubscriptionState.PAUSED
    # the barrier: a witness with its own durable subscription (paused and resumed) feeds
    # another pull point through the same delivery engine
    witness_pp = new_pp(s)
    witness, _ = feed(s, witness_pp)
    s.pause(witness)
    s.resume(witness)
    s.notify([note(f"<m>{i}</m>", simple("t:a")) for i in (1, 2)])
    seen: list[str] = []

    def witnessed() -> bool:
        seen.extend(texts(s, witness_pp))
        return len(seen) >= 2

    wait_until(witnessed, 5, what="both messages at the witness")
    assert seen == ["1", "2"]
    assert texts(s, pp) == ["0"]
    s.unsubscribe(witness)
    s.resume(sub_id)
    got: list[str] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += texts(s, pp)
        time.sleep(0.02)
    assert got == ["1", "2"]
    # it keeps its own durable subscription from now on, also across a restart
    s.notify([note("<m>3</m>", simple("t:a"))])
    wait_idle(s)
    s = broker.restart()
    state = s.registry.subscriptions[sub_id]
    assert not state.direct and state.record.queued
    got = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        got += texts(s, pp)
        time.sleep(0.02)
    assert got == ["3"]


def test_pause_resume_while_publishing_loses_and_duplicates_nothing(broker: Broker) -> None:
    """The PublishGate keeps a publish from being routed directly *and* stored in the new
    durable subscription (duplicate), or neither (loss)."""
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    total = 400
    done = threading.Event()

    def publish() -> None:
        for i in range(total):
            s.notify([note(f"<m>{i}</m>", simple("t:a"))])
        done.set()

    publisher = threading.Thread(target=publish)
    publisher.start()
    time.sleep(0.01)
    s.pause(sub_id)
    time.sleep(0.02)
    s.resume(sub_id)
    publisher.join(30)
    assert done.is_set()
    got: list[str] = []
    deadline = time.monotonic() + 10
    while len(got) < total and time.monotonic() < deadline:
        got += texts(s, pp)
        time.sleep(0.02)
    # everything routed before the pause is in the pull point first; from the pause on,
    # the subscription's own durable subscription keeps the rest in order
    assert got == [str(i) for i in range(total)]
    assert s.registry.subscriptions[sub_id].record.queued


def test_restart_keeps_routing_and_pull_point_content(broker: Broker) -> None:
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    s.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(3)])
    s = broker.restart()
    assert s.registry.subscriptions[sub_id].direct and sub_id not in native_names(broker)
    s.notify([note("<m>3</m>", simple("t:a"))])
    assert texts(s, pp) == ["0", "1", "2", "3"]


def test_subscription_with_a_leftover_durable_subscription_keeps_using_it(
    broker: Broker,
) -> None:
    """A pull-point subscription stored before publish-time routing existed (or whose
    pause was cut short by a crash) still has a durable subscription that may hold
    messages: at start-up it keeps using it instead of being routed directly."""
    s = broker.service
    assert s is not None
    pp = new_pp(s)
    sub_id, _ = feed(s, pp)
    s.pause(sub_id)
    s.notify([note("<m>held</m>", simple("t:a"))])
    # make the stored record look like an old one: active, no "queued" field
    record = s.store.get_subscription(sub_id)
    assert record is not None
    data = subscription_to_json(record)
    data["state"] = SubscriptionState.ACTIVE.value
    del data["queued"]
    s.store.put_subscription(subscription_from_json(data))
    s = broker.restart()
    state = s.registry.subscriptions[sub_id]
    assert not state.direct and state.record.queued
    stored = s.store.get_subscription(sub_id)
    assert stored is not None and stored.queued
    got: list[str] = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        got += texts(s, pp)
        time.sleep(0.02)
    assert got == ["held"]
