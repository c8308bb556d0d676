"""A demand-based publisher registration changed through the instance that does not lead,
before that instance followed the leader's last save of its subscription at the publisher
(docs/scale-out.md, "Periodic work once"), on two instances on one PostgreSQL store:

* DestroyRegistration unsubscribes the subscription at the publisher that the store held
  as the record was deleted, not the one the instance asked knew (none);
* SetTerminationTime writes the termination time alone: the leader's subscription at the
  publisher stays in the store, and the leader, following the change, neither forgets it
  nor subscribes again;
* the leader's save of a change of demand writes its subscription alone: a termination
  time set through the other instance stays;
* a change the leader follows while its Subscribe at the publisher waits for the answer
  does not make it forget that subscription once it has the answer;
* a registration whose termination time was set later through the other instance is
  not destroyed by the leader's sweep at the time the leader knew;
* a leader deposed while its Subscribe at the publisher waits for the answer does not
  save that subscription (its leadership epoch is not the store's any more): it
  unsubscribes it, and the store keeps the new leader's.

The cluster polls its change log every 30 s, and each test replaces the store's trigger
function by one that sends no NOTIFY (``SILENT``) while the leader saves: the instance
that does not lead then holds its old copy of the registration, for as long as the test
needs, without any timing.  Each test asserts the count of live subscriptions each
publisher holds (made by a Subscribe, not ended by an Unsubscribe), after a sentinel: a
second publisher's Subscribe by the leader once it followed the change.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
import pytest
import requests

from tests.cluster.conftest import Cluster
from tests.cluster.test_operate import status
from tests.cluster.test_periodic_once import HeldPublisher, leader_and_follower, silenced
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.rabbitmq]

NS = "urn:cluster:demand-races"
#: one shard, and a follow thread that polls the change log only every 30 s: with the
#: NOTIFY silenced, an instance does not follow a change for that long
SETTINGS = {
    "WSNMOM_CLUSTER__SHARDS": "1",
    "WSNMOM_CLUSTER__POLL": "30",
    "WSNMOM_TERMINATION__SWEEP_INTERVAL": "0.2",
    # a Subscribe the publisher holds while its caller is stopped and deposed is still
    # answered within the call's timeout
    "WSNMOM_RETRY__TIMEOUT": "30",
}
#: seconds a registration lives that the leader's sweep is to see expire: the time the
#: other instance has to set a later one (two requests) before the sweep comes
LIFETIME = 5

S12 = "http://www.w3.org/2003/05/soap-envelope"
IBM = "http://www.ibm.com/xmlns/stdwip/web-services/"


def topic(name: str) -> str:
    return "{" + NS + "}" + name


def live(publisher: ConsumerServer, path: str) -> int:
    """The subscriptions the publisher at ``path`` holds: made by a Subscribe there (the
    n-th Subscribe it answered is ``/publisher-subscriptions/n``) and not unsubscribed."""
    made = [p for op, p in publisher.control if op == "Subscribe"]
    ended = {p for op, p in publisher.control if op == "Unsubscribe"}
    return sum(
        1
        for n, p in enumerate(made, 1)
        if p == path and f"/publisher-subscriptions/{n}" not in ended
    )


def stored(c: Cluster, registration_id: str) -> dict[str, Any] | None:
    """The registration's document in the store (None: no row)."""
    with psycopg.connect(c.store_url) as store:
        row = store.execute(
            "SELECT data FROM registrations WHERE id = %s", (registration_id,)
        ).fetchone()
    return None if row is None else dict(row[0])


def admin_registrations(gateway: Gateway) -> dict[str, dict[str, Any]]:
    """The registrations ``gateway`` holds (its admin API), by id."""
    answer = requests.get(f"{gateway.base_url}/wsn/admin/api/registrations", timeout=5)
    answer.raise_for_status()
    return {r["id"]: r for r in answer.json()["registrations"]}


def set_termination_time(c: Cluster, gateway: Gateway, address: str, when: datetime) -> None:
    """WS-ResourceLifetime's SetTerminationTime of a registration (WS-N 1.0's way to renew
    one), sent to ``gateway``."""
    to = c.via(gateway, address)
    envelope = (
        f'<s12:Envelope xmlns:s12="{S12}" '
        'xmlns:wsa="http://schemas.xmlsoap.org/ws/2003/03/addressing" '
        f'xmlns:wsrl="{IBM}WS-ResourceLifetime"><s12:Header>'
        f"<wsa:Action>{IBM}WS-Notification/SetTerminationTime</wsa:Action>"
        f'<wsa:To s12:mustUnderstand="1">{to}</wsa:To>'
        f"<wsa:MessageID>uuid:{uuid.uuid4()}</wsa:MessageID></s12:Header><s12:Body>"
        "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>"
        f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime></s12:Body></s12:Envelope>"
    )
    reply = requests.post(
        to,
        data=envelope.encode(),
        headers={"Content-Type": "application/soap+xml; charset=utf-8"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    assert b"SetTerminationTimeResponse" in reply.content, reply.text


def terminates(gateway: Gateway, registration_id: str) -> datetime | None:
    """The termination time ``gateway`` holds for the registration (None: none known)."""
    found = admin_registrations(gateway).get(registration_id)
    if found is None or found["terminates"] is None:
        return None
    return datetime.fromisoformat(found["terminates"].replace("Z", "+00:00"))


def later(hours: int) -> datetime:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(microsecond=0)


@pytest.fixture
def publisher() -> Iterator[ConsumerServer]:
    server = ConsumerServer()
    try:
        yield server
    finally:
        server.close()


def sentinel(c: Cluster, via: Gateway, publisher: ConsumerServer, path: str, wanted: str) -> Any:
    """A second demand-based publisher registered through ``via`` on a wanted topic: its
    Subscribe comes from the leader once it followed every change written before (it
    follows the change log in order, and calls the publishers of one pass in the order of
    their registration)."""
    registration = c.client(via).register_publisher(publisher.address(path), [wanted], demand=True)
    wait_until(
        lambda: ("Subscribe", path) in publisher.control,
        20,
        what=f"the leader's Subscribe at {path} (the sentinel)",
    )
    return registration


class Demanded(NamedTuple):
    """A demand-based registration the leader subscribed for at its publisher."""

    leader: Gateway
    follower: Gateway
    topic: str
    registration: Any
    #: the subscription at the broker that makes the demand
    demand: Any
    #: the leader's subscription at the publisher, as the store holds it
    saved: Any


def demanded(
    c: Cluster, consumer: ConsumerServer, publisher: ConsumerServer, name: str, *, silent: bool
) -> Demanded:
    """A demand-based registration of ``publisher`` at ``/name`` made through the leader
    and followed by the other instance, then demand for it (a subscription to its topic);
    returns once the leader saved its subscription at the publisher (``silent``: a save
    the other instance has not followed, its NOTIFY silenced)."""
    leader, follower = leader_and_follower(c)
    wanted = topic(name)
    registration = c.client(leader).register_publisher(
        publisher.address(f"/{name}"), [wanted], demand=True
    )
    wait_until(
        lambda: registration.id in admin_registrations(follower),
        20,
        what="the other instance following the registration",
    )
    with silenced(c) if silent else contextlib.nullcontext():
        sub = c.client(leader).subscribe(consumer.address(f"/{name}-demand"), wanted)
        saved = wait_until(
            lambda: (stored(c, registration.id) or {}).get("demand_subscription"),
            20,
            what="the leader's save of its subscription at the publisher",
        )
    return Demanded(leader, follower, wanted, registration, sub, saved)


def test_a_destroy_through_an_instance_behind_the_leader_unsubscribes_at_the_publisher(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, publisher: ConsumerServer
) -> None:
    """The instance asked has followed the registration but not the leader's save of its
    subscription at the publisher: it unsubscribes the one the store held as it deleted
    the record.  Before, it knew none and sent nothing, and the leader dropped its copy
    when it followed: the publisher sent to the broker for good."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower, wanted, registration, sub, _ = demanded(
        c, consumer, publisher, "destroyed", silent=True
    )
    with silenced(c):
        c.client(follower).destroy_registration(
            EndpointReference(c.via(follower, registration.reference.address))
        )
        assert stored(c, registration.id) is None
        wait_until(
            lambda: live(publisher, "/destroyed") == 0,
            20,
            what="the Unsubscribe at the publisher by the instance asked",
        )
    other = sentinel(c, follower, publisher, "/destroyed-sentinel", wanted)
    assert live(publisher, "/destroyed") == 0, publisher.control
    assert [op for op, p in publisher.control if p == "/destroyed"] == ["Subscribe"]
    c.client(leader).subscription(EndpointReference(c.via(leader, sub.address))).unsubscribe()
    c.client(leader).destroy_registration(EndpointReference(c.via(leader, other.reference.address)))


def test_a_set_termination_time_through_an_instance_behind_the_leader_keeps_its_subscription(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, publisher: ConsumerServer
) -> None:
    """SetTerminationTime through the instance that has not followed the leader's save:
    the store keeps the leader's subscription at the publisher, and the leader, following
    the new termination time, subscribes no second time.  Before, the whole stale record
    was written back, the leader forgot its reference and subscribed again: one
    subscription was left at the publisher."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower, wanted, registration, sub, saved = demanded(
        c, consumer, publisher, "renewed", silent=True
    )
    # the NOTIFY is back: the leader follows the write of the other instance at once
    when = later(5)
    set_termination_time(c, follower, registration.reference.address, when)
    wait_until(
        lambda: terminates(leader, registration.id) == when,
        20,
        what="the leader following the new termination time",
    )
    other = sentinel(c, follower, publisher, "/renewed-sentinel", wanted)
    assert live(publisher, "/renewed") == 1, publisher.control
    after = stored(c, registration.id)
    assert after is not None
    assert after["demand_subscription"] == saved
    assert datetime.fromisoformat(after["termination_time"]) == when
    c.client(leader).subscription(EndpointReference(c.via(leader, sub.address))).unsubscribe()
    for gone in (registration, other):
        c.client(leader).destroy_registration(
            EndpointReference(c.via(leader, gone.reference.address))
        )
    wait_until(lambda: live(publisher, "/renewed") == 0, 20, what="the last Unsubscribe")


def test_the_leader_s_demand_save_keeps_a_termination_time_set_through_the_other_instance(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, publisher: ConsumerServer
) -> None:
    """SetTerminationTime through the instance that does not lead, which the leader has
    not followed; then demand goes, the leader pauses its subscription at the publisher
    and saves that: the new termination time stays in the store.  Before, the leader
    wrote its whole record back, with the old termination time."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower, _, registration, sub, _ = demanded(
        c, consumer, publisher, "paused", silent=False
    )
    when = later(6)
    with silenced(c):
        set_termination_time(c, follower, registration.reference.address, when)
        c.client(leader).subscription(EndpointReference(c.via(leader, sub.address))).unsubscribe()
        wait_until(
            lambda: (stored(c, registration.id) or {}).get("demand_paused"),
            20,
            what="the leader's save of the pause at the publisher",
        )
        after = stored(c, registration.id)
        assert after is not None
        assert datetime.fromisoformat(after["termination_time"]) == when
        assert terminates(leader, registration.id) != when  # it had not followed
    c.client(leader).destroy_registration(
        EndpointReference(c.via(leader, registration.reference.address))
    )
    wait_until(lambda: live(publisher, "/paused") == 0, 20, what="the Unsubscribe")


def test_a_change_followed_while_the_leader_subscribes_at_the_publisher_is_not_forgotten(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    """The publisher holds its answer to the leader's Subscribe until the leader followed a
    SetTerminationTime through the other instance; then the leader keeps the subscription
    it got: one at the publisher, after the sentinel.  Before, following put a new record
    (without that subscription) in the leader's registry, and the leader subscribed
    again."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower = leader_and_follower(c)
    wanted = topic("held")
    publisher = HeldPublisher()
    try:
        registration = c.client(leader).register_publisher(
            publisher.address("/held"), [wanted], demand=True
        )
        sub = c.client(leader).subscribe(consumer.address("/held-demand"), wanted)
        wait_until(lambda: publisher.calls, 20, what="the leader's Subscribe at the publisher")
        when = later(7)
        set_termination_time(c, follower, registration.reference.address, when)
        wait_until(
            lambda: terminates(leader, registration.id) == when,
            20,
            what="the leader following the new termination time",
        )
        publisher.answer.set()
        wait_until(
            lambda: (stored(c, registration.id) or {}).get("demand_subscription"),
            20,
            what="the leader's save of its subscription at the publisher",
        )
        other = sentinel(c, follower, publisher, "/held-sentinel", wanted)
        assert live(publisher, "/held") == 1, publisher.control
        c.client(leader).subscription(EndpointReference(c.via(leader, sub.address))).unsubscribe()
        for gone in (registration, other):
            c.client(leader).destroy_registration(
                EndpointReference(c.via(leader, gone.reference.address))
            )
        wait_until(lambda: live(publisher, "/held") == 0, 20, what="the last Unsubscribe")
    finally:
        publisher.answer.set()
        publisher.close()


def test_a_leader_deposed_while_it_subscribes_at_the_publisher_does_not_save_its_subscription(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    """The publisher holds its answer to the leader's Subscribe; meanwhile the leader is
    stopped (SIGSTOP) and its leadership's store connection ended, the other instance
    takes the leadership, subscribes and saves its own subscription at the publisher.
    Then the deposed leader is continued and gets its answer: its save is refused (its
    leadership epoch is no longer the store's) and it unsubscribes what it made, so one
    subscription stays at the publisher and the store names it.  Before, the deposed
    leader's save overwrote the new leader's reference: two stayed, one of them known
    to nobody."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower = leader_and_follower(c)
    deposed = c.instance_of(leader)
    wanted = topic("deposed")
    publisher = HeldPublisher(caller=deposed)
    assert leader.process is not None
    pid = leader.process.pid
    try:
        registration = c.client(leader).register_publisher(
            publisher.address("/deposed"), [wanted], demand=True
        )
        wait_until(
            lambda: registration.id in admin_registrations(follower),
            20,
            what="the other instance following the registration",
        )
        sub = c.client(follower).subscribe(consumer.address("/deposed-demand"), wanted)
        wait_until(lambda: publisher.calls, 20, what="the leader's Subscribe at the publisher")
        os.kill(pid, signal.SIGSTOP)
        try:
            with psycopg.connect(c.store_url, autocommit=True) as store:
                ended = store.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    (f"{deposed}/leader",),
                ).fetchone()
            assert ended == (1,)
            wait_until(lambda: status(follower)["leader"], 20, what="the other instance leading")
            ours = wait_until(
                lambda: (stored(c, registration.id) or {}).get("demand_subscription"),
                20,
                what="the new leader's save of its subscription at the publisher",
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        publisher.answer.set()
        wait_until(
            lambda: ("Subscribe", "/deposed") in publisher.control[1:],
            20,
            what="the answer to the deposed leader's Subscribe",
        )
        wait_until(
            lambda: ("Unsubscribe", "/publisher-subscriptions/2") in publisher.control,
            20,
            what=f"the deposed leader's Unsubscribe; the publisher had {publisher.control}, "
            f"the store {stored(c, registration.id)}",
        )
        wait_until(
            lambda: not status(leader)["leader"], 20, what="the deposed instance not leading"
        )
        other = sentinel(c, leader, publisher, "/deposed-sentinel", wanted)
        assert live(publisher, "/deposed") == 1, publisher.control
        made = [p for op, p in publisher.control if op == "Subscribe"]
        assert made[:2] == ["/deposed", "/deposed"], publisher.control
        # the first answered is the new leader's; the deposed leader's (the second) ended
        assert ours["address"] == publisher.address("/publisher-subscriptions/1"), ours
        after = stored(c, registration.id)
        assert after is not None and after["demand_subscription"] == ours, after
        refused = f"demand: registration {registration.id}: save refused"
        assert leader.log_path.read_text().count(refused) == 1
        wf = c.client(follower)
        wf.subscription(EndpointReference(c.via(follower, sub.address))).unsubscribe()
        for gone in (registration, other):
            c.client(follower).destroy_registration(
                EndpointReference(c.via(follower, gone.reference.address))
            )
        wait_until(lambda: live(publisher, "/deposed") == 0, 20, what="the last Unsubscribe")
    finally:
        publisher.answer.set()
        publisher.close()


def test_a_registration_set_to_live_on_through_an_instance_behind_the_leader_is_not_swept(
    shared_cluster: Callable[..., Cluster], publisher: ConsumerServer
) -> None:
    """The leader's record says the registration ends in a few seconds, the store (a
    SetTerminationTime through the other instance, which the leader has not followed)
    hours later: the leader's sweep reads the store and keeps it.  Before, it destroyed
    it at the time it knew.  The sentinel: a registration made after it with the same
    lifetime, which the sweep destroys."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower = leader_and_follower(c)
    wanted = topic("lifetime")
    kept = c.client(leader).register_publisher(publisher.address("/kept"), [wanted])
    wait_until(
        lambda: kept.id in admin_registrations(follower),
        20,
        what="the other instance following the registration",
    )
    with silenced(c):
        soon = datetime.now(UTC) + timedelta(seconds=LIFETIME)
        set_termination_time(c, leader, kept.reference.address, soon)
        ended = c.client(leader).register_publisher(
            publisher.address("/ended"),
            [wanted],
            initial_termination_time=timedelta(seconds=LIFETIME),
        )
        when = later(8)
        set_termination_time(c, follower, kept.reference.address, when)
        wait_until(
            lambda: stored(c, ended.id) is None,
            LIFETIME + 20,
            what="the leader's sweep of the registration left to end",
        )
        assert stored(c, kept.id) is not None
        assert terminates(leader, kept.id) == when
    c.client(leader).destroy_registration(EndpointReference(c.via(leader, kept.reference.address)))
