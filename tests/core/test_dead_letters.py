"""Dead letters in core (``core.dead_letters``), on the real embedded adapter: nothing given
up is settled before the middleware confirmed its dead letter; list, show, replay (refused
for an ended subscription and for an address the outbound policy refuses) and purge;
disabled dead letters drop as before; a destination whose box cannot be opened refuses
the Subscribe rather than lose what the limits drop.  The same on every middleware,
through a running gateway: tests/e2e/test_dead_letters.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core import errors
from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
    PublishFailed,
    PublishReceipt,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.config import ConfigError, Settings, load_settings
from wsnmom.core.dead_letter_admin import ReplayFailed
from wsnmom.core.dead_letter_records import DEAD_LETTER_NAMESPACE, box_name
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.service import BrokerService
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.support.waiting import wait_until

from .conftest import (
    NS,
    Broker,
    FakeClock,
    RecordingOutbound,
    documentation_address,
    make_settings,
    note,
    simple,
    sub_req,
)

C = "http://127.0.0.1:9/consumer"
XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: nested location paths: minutes of CPU on BIG, far past the filter budget
CUBIC = "count(//a[count(//a[count(//a) > 0]) > 0]) > 0"
BIG = b"<r>" + b"<a/>" * 3000 + b"</r>"


class RefusingAdapter(EmbeddedAdapter):
    """The embedded adapter, refusing to publish dead letters while ``refuse`` is set
    (a middleware that does not confirm them)."""

    refuse = False
    refused = 0

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        if self.refuse and any(m.topic.namespace == DEAD_LETTER_NAMESPACE for m in messages):
            type(self).refused += 1
            raise PublishFailed("not confirmed")
        return super().publish_many(messages, timeout)


def embedded_service(
    adapter: EmbeddedAdapter,
    store_path: Path,
    settings: Settings,
    outbound: RecordingOutbound,
    clock: FakeClock,
) -> BrokerService:
    """A broker over ``adapter`` (opened here) and a SQLite store at ``store_path``."""
    adapter.open()
    return BrokerService(
        settings,
        adapter,
        SqliteStore(str(store_path)),
        outbound,
        topic_set=TopicSet(fixed=False),
        clock=clock,
        outbound_policy=OutboundPolicy(settings.outbound, resolver=documentation_address),
    )


def restartable(
    tmp_path: Path, settings: Settings, outbound: RecordingOutbound, clock: FakeClock
) -> tuple[
    Callable[[], tuple[BrokerService, EmbeddedAdapter]],
    Callable[[BrokerService, EmbeddedAdapter], None],
]:
    """How to start a broker on the same middleware directory and store each time, and
    how to stop it (its store and adapter closed)."""

    def start() -> tuple[BrokerService, EmbeddedAdapter]:
        adapter = EmbeddedAdapter(f"embedded://{tmp_path / 'mw'}")
        return embedded_service(adapter, tmp_path / "store.db", settings, outbound, clock), adapter

    def stop(service: BrokerService, adapter: EmbeddedAdapter) -> None:
        service.close()
        service.store.close()
        adapter.close()

    return start, stop


@pytest.fixture
def make_service(tmp_path: Path, outbound: RecordingOutbound, clock: FakeClock) -> Iterator[Any]:
    made: list[tuple[BrokerService, EmbeddedAdapter]] = []

    def make(adapter_cls: type[EmbeddedAdapter] = EmbeddedAdapter, **overrides: Any) -> Any:
        settings = make_settings(
            retry__max_attempts=2,
            retry__initial_delay=timedelta(seconds=0.01),
            retry__max_delay=timedelta(seconds=0.05),
            **overrides,
        )
        adapter = adapter_cls(f"embedded://{tmp_path / f'mw{len(made)}'}")
        store_path = tmp_path / f"store{len(made)}.db"
        service = embedded_service(adapter, store_path, settings, outbound, clock)
        made.append((service, adapter))
        return service

    yield make
    for service, adapter in made:
        service.close()
        service.store.close()
        adapter.close()


def publish(service: BrokerService, text: str) -> None:
    service.notify([note(f"<m>{text}</m>", simple("t:a"))])


def test_a_dead_letter_the_middleware_does_not_confirm_leaves_the_message_unsettled(
    make_service: Any, outbound: RecordingOutbound
) -> None:
    RefusingAdapter.refuse, RefusingAdapter.refused = True, 0
    service: BrokerService = make_service(RefusingAdapter)
    outbound.down.add(C)
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "kept")
    wait_until(lambda: RefusingAdapter.refused >= 2, 10, what="two refused dead letters")
    # not given up: the subscription lives and its message is still in the middleware
    assert sub.id in service.registry.subscriptions
    assert service.dead_letters() == []
    RefusingAdapter.refuse = False
    [letter] = wait_until(service.dead_letters, 10, what="the dead letter")
    assert letter.reason == "retries-exhausted" and letter.subscription_id == sub.id
    assert letter.attempts == 2 and letter.last_error == f"{C} is down"
    assert b"kept" in letter.body and letter.topic == f"{{{NS}}}a"
    wait_until(lambda: sub.id not in service.registry.subscriptions, 10, what="the end")


def test_list_show_replay_to_an_address_and_purge(
    make_service: Any, outbound: RecordingOutbound
) -> None:
    service: BrokerService = make_service(retry__give_up="end")
    outbound.down.add(C)
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "one")
    [first] = wait_until(service.dead_letters, 10, what="a dead letter")
    outbound.down.add(C + "/2")
    second_sub = service.subscribe(sub_req(C + "/2", topic=simple("t:b")))
    service.notify([note("<m>two</m>", simple("t:b"))])
    letters = wait_until(lambda: len(service.dead_letters()) == 2 and service.dead_letters(), 10)
    assert letters[0].id == first.id
    # the first subscription ended: replay to it is refused, the dead letter stays
    with pytest.raises(ReplayFailed, match="no longer exists"):
        service.replay_dead_letter(first.id)
    assert service.dead_letter(first.id).id == first.id
    # an address the outbound policy refuses is refused the same way as at Subscribe
    with pytest.raises(ReplayFailed, match="refused"):
        service.replay_dead_letter(first.id, "http://169.254.169.254/latest")
    # replay to another address: delivered, then removed
    other = "http://127.0.0.1:9/other"
    assert service.replay_dead_letter(first.id, other) == other
    assert [d.message.payload for d in outbound.wait_messages(other, 1)] == [b"<m>one</m>"]
    with pytest.raises(errors.ResourceUnknown):
        service.dead_letter(first.id)
    # purge everything that is left
    assert service.purge_dead_letters() == 1
    assert service.dead_letters() == []
    # the give-up ends the subscription once its dead letter is confirmed
    wait_until(lambda: second_sub.id not in service.registry.subscriptions, 10, what="the end")


def test_disabled_dead_letters_drop_as_before(
    make_service: Any, outbound: RecordingOutbound
) -> None:
    service: BrokerService = make_service(dead_letters__enabled=False)
    outbound.down.add(C)
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "dropped")
    wait_until(lambda: sub.id not in service.registry.subscriptions, 10, what="the end")
    assert service.dead_letters() == []


def test_headers_of_the_original_are_kept(make_service: Any, outbound: RecordingOutbound) -> None:
    service: BrokerService = make_service()
    outbound.down.add(C)
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "h")
    [letter] = wait_until(service.dead_letters, 10, what="a dead letter")
    assert letter.message_id  # the gateway's message id travels with it
    summary: Mapping[str, Any] = letter.summary()
    assert summary["size"] == len(b"<m>h</m>") and "body" not in summary


def test_a_pull_point_feed_over_its_filter_budget_leaves_a_dead_letter(make_broker: Any) -> None:
    """On a log-shaped middleware a subscription feeding a pull point is read by the pull
    point (core.pull_feeds), not by a delivery channel: its filter's give-up makes a dead
    letter too."""
    b: Broker = make_broker(adapter_url="filelog://{tmp}/log?partitions=1", filters__cpu_limit=0.3)
    service = b.service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    costly = service.subscribe(
        sub_req(
            service.pull_point_address(pp.id),
            topic=simple("t:a"),
            message_content=ExpressionSource(XPATH10, CUBIC, {}),
        )
    )
    service.notify([note(BIG, simple("t:a"))])
    [letter] = wait_until(service.dead_letters, 20, what="a dead letter")
    assert letter.reason == "filter-budget" and letter.subscription_id == costly.id
    assert letter.body == BIG


class UnreachableBoxAdapter(EmbeddedAdapter):
    """The embedded adapter, unable to open dead-letter destinations (a middleware that
    went away)."""

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        if spec.name.startswith("wsnmom-dead-letters-"):
            raise AdapterUnavailable("connection lost")
        return super().subscription(spec)


def test_listing_without_the_middleware_is_unavailable_not_a_crash(make_service: Any) -> None:
    service: BrokerService = make_service(UnreachableBoxAdapter)
    with pytest.raises(errors.ResourceUnavailable, match="not reachable"):
        service.dead_letters()


def test_an_invalid_default_destination_is_a_configuration_error(tmp_path: Path) -> None:
    environ = {"WSNMOM_DEAD_LETTERS__DESTINATION": "a/b", "HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"WSNMOM_DEAD_LETTERS__DESTINATION=a/b.*64 letters"):
        load_settings(environ=environ)
    ok = load_settings(
        environ={"WSNMOM_DEAD_LETTERS__DESTINATION": "ops-dlq", "HOME": str(tmp_path)}
    )
    assert ok.dead_letters.destination == "ops-dlq"


def test_dead_letters_survive_a_restart(
    tmp_path: Path, outbound: RecordingOutbound, clock: FakeClock
) -> None:
    settings = make_settings(retry__max_attempts=1)
    start, stop = restartable(tmp_path, settings, outbound, clock)

    service, adapter = start()
    outbound.down.add(C)
    service.subscribe(sub_req(C, topic=simple("t:a")))
    publish(service, "survives")
    [letter] = wait_until(service.dead_letters, 10, what="a dead letter")
    stop(service, adapter)
    service, adapter = start()
    try:
        [again] = wait_until(service.dead_letters, 10, what="the dead letter after a restart")
        assert again.id == letter.id and b"survives" in again.body
    finally:
        stop(service, adapter)


def test_what_the_limits_drop_keeps_its_context_across_a_restart(
    tmp_path: Path, outbound: RecordingOutbound, clock: FakeClock
) -> None:
    """The embedded store dead-letters what ``limits.max_messages`` drops
    (``native_dead_letters``); reason, subscription and time come from the adapter's
    ``wsnmom-dropped-*`` headers, so they are the same after a restart (the box's own
    clock has moved on)."""
    settings = make_settings(limits__max_messages=1)
    start, stop = restartable(tmp_path, settings, outbound, clock)

    service, adapter = start()
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    service.pause(sub.id)
    for text in ("one", "two", "three"):
        publish(service, text)
    found = wait_until(
        lambda: (d := service.dead_letters()) and len(d) == 2 and d, 10, what="two dead letters"
    )
    assert [d.reason for d in found] == ["overflow", "overflow"]
    assert {d.subscription_id for d in found} == {sub.id}
    assert b"one" in found[0].body and b"two" in found[1].body
    assert all(d.time and d.attempts == 0 and d.consumer == "" for d in found)
    stop(service, adapter)
    clock.advance(hours=1)
    service, adapter = start()
    try:
        again = wait_until(
            lambda: (d := service.dead_letters()) and len(d) == 2 and d, 10, what="after a restart"
        )
        assert [(d.reason, d.subscription_id, d.time) for d in again] == [
            (d.reason, d.subscription_id, d.time) for d in found
        ]
    finally:
        stop(service, adapter)


def test_a_box_that_cannot_be_opened_refuses_the_subscribe(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded store routes what it drops for the limits to the subscriptions of the
    dead-letter topic existing then: a Subscribe whose destination's box could not be
    opened would lose every drop, so it is refused (a fault naming the destination); the
    next Subscribe opens the box and what the limits drop is dead-lettered."""
    service: BrokerService = make_service(limits__max_messages=1)
    real = EmbeddedAdapter.subscription
    failures = [AdapterUnavailable("the store is busy")]

    def failing_once(self: EmbeddedAdapter, spec: SubscriptionSpec) -> SubscriptionHandle:
        if spec.name == box_name("spare") and failures:
            raise failures.pop()
        return real(self, spec)

    monkeypatch.setattr(EmbeddedAdapter, "subscription", failing_once)
    with pytest.raises(errors.WsnError) as refused:
        service.subscribe(sub_req(C, topic=simple("t:a"), dead_letters="spare"))
    assert "dead letters spare" in str(refused.value.description)
    assert service.registry.subscriptions == {}
    assert not failures
    sub = service.subscribe(sub_req(C, topic=simple("t:a"), dead_letters="spare"))
    service.pause(sub.id)
    for text in ("one", "two", "three"):
        publish(service, text)
    found = wait_until(
        lambda: (d := service.dead_letters("spare")) and len(d) == 2 and d,
        10,
        what="two dead letters",
    )
    assert [d.reason for d in found] == ["overflow", "overflow"]
    assert {d.subscription_id for d in found} == {sub.id}
    assert b"one" in found[0].body and b"two" in found[1].body
