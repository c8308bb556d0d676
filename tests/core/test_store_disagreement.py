"""The store is right when this instance's memory and the store disagree about a
subscription (review of issue 23's revisions): a Pause, Resume or Renew whose store write
failed is undone in memory; a stored state or termination time at the revision held here
(a failed write, a writer that does not bump revisions) is followed; the sweep reads the
store before it expires a subscription whose memory says it is over; a pull point whose
record could not be deleted keeps its messages.

An old writer is played by writing the row's document behind the broker's back, its
revision left as it was.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
)
from wsnmom.core.service import BrokerService
from wsnmom.core.store import StoreUnavailable
from wsnmom.core.store_documents import subscription_to_json

from tests.support.waiting import wait_until

from .conftest import Broker, FakeClock, RecordingOutbound, note, simple, sub_req

VICTIM = "http://127.0.0.1:9/victim"
CONTROL = "http://127.0.0.1:9/control"


def publish(service: BrokerService, body: str) -> None:
    service.notify([note(body, simple("t:a"))])


def stored(service: BrokerService, sub_id: str) -> Subscription:
    record = service.store.get_subscription(sub_id)
    assert record is not None
    return record


@pytest.fixture
def failing_writes(service: BrokerService) -> Iterator[Callable[[int], None]]:
    """``fail(n)``: the next ``n`` subscription writes raise as a store that stopped
    answering does."""
    store: Any = service.store
    real_put, real_update = store.put_subscription, store.update_subscription
    left = [0]

    def refuse() -> None:
        if left[0] > 0:
            left[0] -= 1
            raise StoreUnavailable("connection lost")

    def put(sub: Subscription) -> None:
        refuse()
        real_put(sub)

    def update(sub: Subscription) -> bool:
        refuse()
        return bool(real_update(sub))

    store.put_subscription = put
    store.update_subscription = update

    def fail(n: int) -> None:
        left[0] = n

    yield fail
    del store.put_subscription
    del store.update_subscription


def write_behind(broker: Broker, record: Subscription) -> None:
    """Write ``record`` to its row as a writer without revisions does: the document and
    termination time change, the revision stays."""
    with sqlite3.connect(broker.tmp / "store.db") as conn:
        changed = conn.execute(
            "UPDATE subscriptions SET termination_time = ?, data = ? WHERE id = ?",
            (
                record.termination_time.isoformat() if record.termination_time else None,
                json.dumps(subscription_to_json(record)),
                record.id,
            ),
        ).rowcount
    assert changed == 1


def test_a_pause_whose_store_write_failed_is_undone(
    service: BrokerService, outbound: RecordingOutbound, failing_writes: Callable[[int], None]
) -> None:
    sub = service.subscribe(sub_req(VICTIM, topic=simple("t:a")))
    failing_writes(1)
    with pytest.raises(errors.ResourceUnavailable):
        service.pause(sub.id)
    # as the store has it: active, and delivering
    assert service.get_subscription(sub.id).state is SubscriptionState.ACTIVE
    assert stored(service, sub.id).state is SubscriptionState.ACTIVE
    publish(service, "<m>after</m>")
    assert [d.message.payload for d in outbound.wait_messages(VICTIM, 1)] == [b"<m>after</m>"]
    # the retry pauses
    service.pause(sub.id)
    assert stored(service, sub.id).state is SubscriptionState.PAUSED


def test_a_resume_whose_store_write_failed_is_undone(
    service: BrokerService, outbound: RecordingOutbound, failing_writes: Callable[[int], None]
) -> None:
    sub = service.subscribe(sub_req(VICTIM, topic=simple("t:a")))
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    service.pause(sub.id)
    failing_writes(1)
    with pytest.raises(errors.ResourceUnavailable):
        service.resume(sub.id)
    assert service.get_subscription(sub.id).state is SubscriptionState.PAUSED
    publish(service, "<m>held</m>")
    outbound.wait_messages(CONTROL, 1)  # the sentinel: the paused one held its copy
    assert outbound.payloads_to(VICTIM) == []
    # the retry resumes (before: a no-op, this instance thought it active)
    service.resume(sub.id)
    assert stored(service, sub.id).state is SubscriptionState.ACTIVE
    assert [d.message.payload for d in outbound.wait_messages(VICTIM, 1)] == [b"<m>held</m>"]


def test_a_renew_whose_store_write_failed_keeps_the_stored_termination_time(
    service: BrokerService, failing_writes: Callable[[int], None]
) -> None:
    sub = service.subscribe(
        sub_req(VICTIM, topic=simple("t:a"), initial_termination_time=timedelta(minutes=5))
    )
    failing_writes(1)
    with pytest.raises(errors.ResourceUnavailable):
        service.renew(sub.id, timedelta(hours=1))
    assert service.get_subscription(sub.id).termination_time == sub.termination_time
    assert stored(service, sub.id).termination_time == sub.termination_time


def test_a_change_at_the_held_revision_is_followed(
    broker: Broker, service: BrokerService, outbound: RecordingOutbound, clock: FakeClock
) -> None:
    sub = service.subscribe(sub_req(VICTIM, topic=simple("t:a")))
    service.subscribe(sub_req(CONTROL, topic=simple("t:a")))
    held = service.get_subscription(sub.id)
    later: datetime = clock() + timedelta(hours=2)
    write_behind(broker, replace(held, state=SubscriptionState.PAUSED, termination_time=later))
    assert stored(service, sub.id).revision == held.revision
    service.follower.load("subscription", sub.id)
    now = service.get_subscription(sub.id)
    assert (now.state, now.termination_time) == (SubscriptionState.PAUSED, later)
    publish(service, "<m>held</m>")
    outbound.wait_messages(CONTROL, 1)
    assert outbound.payloads_to(VICTIM) == []
    # an equal record at the same revision changes nothing
    service.follower.load("subscription", sub.id)
    assert service.get_subscription(sub.id).state is SubscriptionState.PAUSED


def test_the_sweep_keeps_a_subscription_renewed_in_the_store(
    broker: Broker, service: BrokerService, clock: FakeClock
) -> None:
    sub = service.subscribe(
        sub_req(VICTIM, topic=simple("t:a"), initial_termination_time=timedelta(seconds=10))
    )
    gone = service.subscribe(
        sub_req(CONTROL, topic=simple("t:a"), initial_termination_time=timedelta(seconds=10))
    )
    later = clock() + timedelta(hours=1)
    # renewed by an instance this one has not followed (or one without revisions)
    write_behind(broker, replace(service.get_subscription(sub.id), termination_time=later))
    clock.advance(seconds=30)
    service.sweep()
    assert stored(service, sub.id).termination_time == later
    assert service.get_subscription(sub.id).termination_time == later
    # the one the store also has expired is destroyed
    assert service.store.get_subscription(gone.id) is None
    with pytest.raises(errors.ResourceUnknown):
        service.get_subscription(gone.id)


def test_a_pull_point_whose_record_delete_failed_keeps_its_messages(
    broker: Broker, service: BrokerService
) -> None:
    pp = service.create_pull_point(CreatePullPointRequest()).id
    consumer = EndpointReference(service.pull_point_address(pp))
    service.subscribe(SubscribeRequest(consumer, topic=simple("t:a")))
    publish(service, "<m>kept</m>")
    store: Any = service.store
    real = store.delete_pull_point

    def refuse(pp_id: str, *, intent: bool = False) -> bool:
        raise StoreUnavailable("connection lost")

    store.delete_pull_point = refuse
    try:
        with pytest.raises(errors.ResourceUnavailable):
            service.destroy_pull_point(pp)
    finally:
        store.delete_pull_point = real
    # the record stays, so do the pull point (here too) and what reached it (before: the
    # middleware's side was deleted in a ``finally``)
    assert service.store.get_pull_point(pp) is not None
    assert service.get_pull_point(pp).id == pp
    service = broker.restart()
    got: list[bytes] = []

    def pulled() -> bool:
        got.extend(m.payload for m in service.get_messages(pp, None))
        return bool(got)

    wait_until(pulled, what="the message at the pull point")
    assert got == [b"<m>kept</m>"]
    service.destroy_pull_point(pp)
    assert service.store.get_pull_point(pp) is None


def test_a_resume_whose_start_failed_here_is_followed_again(
    broker: Broker,
    service: BrokerService,
    outbound: RecordingOutbound,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review finding 5: the follower recorded the revision and the state before starting
    the channel; when starting failed, the next loads saw nothing newer and the
    subscription stayed recorded active without delivering."""
    from wsnmom.adapters.embedded.adapter import EmbeddedHandle
    from wsnmom.core.adapter import AdapterError

    sub = service.subscribe(sub_req(VICTIM, topic=simple("t:a")))
    service.pause(sub.id)
    publish(service, "<m>held</m>")
    # resumed through another instance: a newer revision
    write_behind(broker, replace(service.get_subscription(sub.id), state=SubscriptionState.ACTIVE))
    with sqlite3.connect(broker.tmp / "store.db") as conn:
        conn.execute("UPDATE subscriptions SET revision = revision + 1 WHERE id = ?", (sub.id,))
    real = EmbeddedHandle.start
    refused: list[bool] = []

    def start(self: EmbeddedHandle, *args: Any, **kwargs: Any) -> None:
        if not refused:
            refused.append(True)
            raise AdapterError("middleware busy")
        real(self, *args, **kwargs)

    monkeypatch.setattr(EmbeddedHandle, "start", start)
    with pytest.raises(AdapterError):
        service.follower.load("subscription", sub.id)
    assert service.get_subscription(sub.id).state is SubscriptionState.PAUSED
    # the next load (the next change, a request naming it) applies it again
    service.follower.load("subscription", sub.id)
    assert service.get_subscription(sub.id).state is SubscriptionState.ACTIVE
    assert [d.message.payload for d in outbound.wait_messages(VICTIM, 1)] == [b"<m>held</m>"]
