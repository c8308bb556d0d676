"""Two changes of one subscription through two instances within one store round trip
(issue 23): each instance reads the record, then writes it.  The write is conditional on
the revision read (``Store.update_subscription``), and a refused one is read again and
applied again (``core.subscriptions``), so that neither change is lost.  Before, the
later write kept its own copy of the fields the other change had set: a Renew through B
while a Pause went through A left the subscription active.

The other instance is played by a second store on the same database: a hook on the
broker's store runs the other instance's change (its own read and conditional write)
after the broker read the record and just before the broker's write, every time.  On
SQLite and on PostgreSQL (where the broker is a cluster's instance following the store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import pytest
from wsnmom.core import errors
from wsnmom.core.model import Subscription, SubscriptionState
from wsnmom.core.service import BrokerService
from wsnmom.core.store import Store
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.core.store_url import open_store
from wsnmom.core.subscriptions import CHANGE_ATTEMPTS

from tests.support.waiting import wait_until

from .conftest import Broker, RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"
LATER = timedelta(days=2)


@pytest.fixture(params=["sqlite", "postgresql"])
def broker(request: pytest.FixtureRequest, make_broker: Callable[..., Broker]) -> Broker:
    if request.param == "sqlite":
        return make_broker()
    return make_broker(store_url=request.getfixturevalue("postgres_store_url"))


@pytest.fixture
def other(broker: Broker) -> Iterator[Store]:
    """The other instance's store: the same database."""
    assert broker.service is not None
    url = broker.store_url
    store = SqliteStore(str(broker.tmp / "store.db")) if url is None else open_store(url)
    yield store
    store.close()


Change = Callable[[Store, str], None]


def pause(store: Store, sub_id: str) -> None:
    record = store.get_subscription(sub_id)
    assert record is not None
    record.state = SubscriptionState.PAUSED
    assert store.update_subscription(record)


def renew(store: Store, sub_id: str) -> None:
    record = store.get_subscription(sub_id)
    assert record is not None and record.termination_time is not None
    record.termination_time += LATER
    assert store.update_subscription(record)


def unsubscribe(store: Store, sub_id: str) -> None:
    assert store.delete_subscription(sub_id)


@pytest.fixture
def between(
    service: BrokerService, other: Store, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., list[Subscription]]:
    """``between(change, sub_id, every=False)``: the broker's next conditional write of a
    subscription (``every``: each one) is preceded by ``change`` through the other store;
    returns the records the broker tried to write, as it tried them."""
    store: Any = service.store
    real = store.update_subscription

    def arm(change: Change, sub_id: str, *, every: bool = False) -> list[Subscription]:
        tried: list[Subscription] = []
        armed = [True]

        def update(sub: Subscription) -> bool:
            if armed[0]:
                armed[0] = every
                change(other, sub_id)
            tried.append(Subscription(**{f: getattr(sub, f) for f in sub.__dataclass_fields__}))
            return bool(real(sub))

        monkeypatch.setattr(store, "update_subscription", update)
        return tried

    return arm


class Race(NamedTuple):
    """What each test here uses: the broker, the other instance's store, what the broker
    delivered, and ``between`` (above)."""

    service: BrokerService
    other: Store
    outbound: RecordingOutbound
    between: Callable[..., list[Subscription]]


@pytest.fixture
def race(
    service: BrokerService,
    other: Store,
    outbound: RecordingOutbound,
    between: Callable[..., list[Subscription]],
) -> Race:
    return Race(service, other, outbound, between)


def stored(store: Store, sub_id: str) -> Subscription:
    record = store.get_subscription(sub_id)
    assert record is not None
    return record


def delivering(service: BrokerService, outbound: RecordingOutbound) -> tuple[str, str]:
    """A subscription (delivering: its first message arrived) and a control one."""
    sub = service.subscribe(
        sub_req(VICTIM, topic=simple("t:a"), initial_termination_time=timedelta(hours=1))
    )
    control = service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    service.notify([note("<m>first</m>", simple("t:a"))])
    outbound.wait_messages(VICTIM, 1, timeout=15)
    outbound.wait_messages(CONTROL, 1, timeout=15)
    return sub.id, control.id


def held(service: BrokerService, outbound: RecordingOutbound, body: str) -> None:
    """A message published now reaches the control subscription (the sentinel) and not
    the victim, which holds it (or is gone)."""
    before = len(outbound.payloads_to(CONTROL))
    service.notify([note(body, simple("t:a"))])
    outbound.wait_messages(CONTROL, before + 1, timeout=15)
    assert body.encode() not in outbound.payloads_to(VICTIM)


def renewed_meanwhile(
    other: Store,
    between: Callable[..., list[Subscription]],
    sub_id: str,
    act: Callable[[], object],
) -> Subscription:
    """``act()`` through the broker while the other instance renews ``sub_id`` between
    the broker's read and its write: the record stored afterwards, which keeps that
    renewal (before: the broker wrote the old time back)."""
    before = stored(other, sub_id).termination_time
    assert before is not None
    between(renew, sub_id)
    act()
    record = stored(other, sub_id)
    assert record.termination_time == before + LATER
    return record


def test_a_renew_while_another_instance_pauses_keeps_the_pause(race: Race) -> None:
    service, other, outbound, between = race
    sub_id, _ = delivering(service, outbound)
    tried = between(pause, sub_id)
    renewed = service.renew(sub_id, timedelta(hours=5))
    assert [t.state for t in tried] == [SubscriptionState.ACTIVE, SubscriptionState.PAUSED]
    record = stored(other, sub_id)
    assert record.state is SubscriptionState.PAUSED  # before: written active again
    assert record.termination_time == renewed.termination_time
    assert record.revision == 3 and service.get_subscription(sub_id).revision == 3
    assert service.get_subscription(sub_id).state is SubscriptionState.PAUSED
    held(service, outbound, "<m>held</m>")


def test_a_pause_while_another_instance_renews_keeps_the_renewal(race: Race) -> None:
    service, other, outbound, between = race
    sub_id, _ = delivering(service, outbound)
    record = renewed_meanwhile(other, between, sub_id, lambda: service.pause(sub_id))
    assert record.state is SubscriptionState.PAUSED
    assert service.get_subscription(sub_id).termination_time == record.termination_time
    held(service, outbound, "<m>held</m>")


def test_a_resume_while_another_instance_renews_keeps_the_renewal_and_delivers(race: Race) -> None:
    service, other, outbound, between = race
    sub_id, _ = delivering(service, outbound)
    service.pause(sub_id)
    held(service, outbound, "<m>held</m>")
    record = renewed_meanwhile(other, between, sub_id, lambda: service.resume(sub_id))
    assert record.state is SubscriptionState.ACTIVE
    wait_until(
        lambda: b"<m>held</m>" in outbound.payloads_to(VICTIM), timeout=15, what="the resume"
    )


def test_a_renew_of_a_subscription_another_instance_destroyed_does_not_bring_it_back(
    race: Race,
) -> None:
    service, other, outbound, between = race
    sub_id, _ = delivering(service, outbound)
    between(unsubscribe, sub_id)
    with pytest.raises(errors.ResourceUnknown):
        service.renew(sub_id, timedelta(hours=5))
    assert other.get_subscription(sub_id) is None  # before: written back, alive again
    assert sub_id not in service.registry.subscriptions
    assert service.engine.channel(sub_id) is None
    held(service, outbound, "<m>after</m>")


def test_a_change_refused_on_every_attempt_is_a_503_and_memory_follows_the_store(
    race: Race,
) -> None:
    service, other, outbound, between = race
    sub_id, _ = delivering(service, outbound)
    tried = between(renew, sub_id, every=True)
    with pytest.raises(errors.ResourceUnavailable):
        service.pause(sub_id)
    assert len(tried) == CHANGE_ATTEMPTS
    record = stored(other, sub_id)
    assert record.state is SubscriptionState.ACTIVE and record.revision == 1 + CHANGE_ATTEMPTS
    live = service.get_subscription(sub_id)
    assert live.state is SubscriptionState.ACTIVE  # the undone pauses: delivering
    assert live.termination_time == record.termination_time
    service.notify([note("<m>after</m>", simple("t:a"))])
    wait_until(lambda: b"<m>after</m>" in outbound.payloads_to(VICTIM), timeout=15)
