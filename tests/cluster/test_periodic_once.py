"""Work that a cluster does once, whichever instance is asked (issue 23 §2, "periodic work
once"; docs/scale-out.md, "Periodic work once"), on two instances on one PostgreSQL store:

* a subscription the gateway ends (its consumer unreachable past the retry policy) gets
  one SubscriptionEnd, ended by one instance, and an expired one gets none (on RabbitMQ,
  Kafka and MQTT: each middleware sends the backlog to the dead letters its own way
  before the end);
* a demand-based publisher gets one call per change of demand (Subscribe, Pause, Resume),
  from the leader only, and one Unsubscribe at DestroyRegistration, from the instance
  asked, and the publisher's subscription the leader made while the registration was
  being destroyed through the other instance is unsubscribed (RabbitMQ: the core's work,
  the same on every middleware);
* with every NOTIFY of the store lost, the follow thread's polling alone still brings a
  change made through one instance to the deliverer within 1 s (RabbitMQ).

The tests only send requests (the last one changes the store's trigger function and puts
it back): on each middleware they share one cluster of two instances on one shard
(``shared_cluster``), each on topics and consumer paths of its own.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
import requests
from lxml import etree

from tests.cluster.conftest import ALL, INSTANCE, Cluster
from tests.cluster.test_any_instance import FOLLOW, delivering, detail_of, obeyed_after, received
from tests.cluster.test_operate import status
from tests.fixtures.server import ConsumerServer, Received
from tests.support.ports import closed_port
from tests.support.waiting import wait_until
from wsnmom.client.errors import ResourceUnknownFault
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "urn:cluster:once"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
NATO = "http://nc3a.nato.int/ces/wsn/extension"
WSA = "http://www.w3.org/2005/08/addressing"

#: one shard (one instance delivers every push subscription), and a retry policy that gives
#: up on an unreachable consumer within about a second
SETTINGS = {
    "WSNMOM_CLUSTER__SHARDS": "1",
    "WSNMOM_TERMINATION__SWEEP_INTERVAL": "0.2",
    "WSNMOM_RETRY__MAX_ATTEMPTS": "2",
    "WSNMOM_RETRY__INITIAL_DELAY": "0.2",
    "WSNMOM_RETRY__MAX_DELAY": "0.5",
    "WSNMOM_RETRY__TIMEOUT": "3",
}


def topic(name: str) -> str:
    return "{" + NS + "}" + name


def leader_and_follower(c: Cluster) -> tuple[Gateway, Gateway]:
    """The instance that runs the periodic work, and the other (by both one's account)."""
    a, b = c.gateways
    leads = wait_until(
        lambda: (found := [status(g)["leader"] for g in (a, b)]).count(True) == 1 and found,
        20,
        what="one leader",
    )
    return (a, b) if leads[0] else (b, a)


def ends_named(requests: list[Received]) -> list[str]:
    """The subscription addresses the SubscriptionEnd messages among ``requests`` name."""
    out = []
    for rec in requests:
        for message in rec.body_child.iterfind(f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Message"):
            end = message.find(f"{{{NATO}}}SubscriptionEnd")
            if end is not None:
                out.append(end.findtext(f"{{{NATO}}}SubscriptionReference/{{{WSA}}}Address"))
    return [a.strip() for a in out if a]


def sentinels(requests: list[Received]) -> list[str]:
    """The ``instance`` texts of the ``<sentinel>`` messages among ``requests``."""
    return [
        "".join(m.itertext()).strip()
        for rec in requests
        for m in rec.body_child.iterfind(
            f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Message/sentinel"
        )
    ]


@pytest.mark.parametrize("middleware", ALL, indirect=True)
def test_a_subscription_the_gateway_ends_gets_one_subscription_end_and_an_expired_one_none(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    c = shared_cluster(2, **SETTINGS)
    a, b = c.gateways
    ends, quiet = topic("ends"), topic("quiet")
    c.client(a).subscribe(consumer.address("/ends"), ends)
    with closed_port() as closed:
        dead = f"http://127.0.0.1:{closed}/gone"
        doomed = [
            c.client(g).subscribe(dead, topic("doomed"), subscription_end_topic=ends)
            for g in (a, b, a, b)
        ]
        expiring = [
            c.client(g).subscribe(
                consumer.address("/expiring"),
                quiet,
                subscription_end_topic=ends,
                initial_termination_time=timedelta(seconds=2),
            )
            for g in (a, b)
        ]
        c.client(b).notify('<n xmlns="urn:n">1</n>', topic("doomed"))
        got = lambda: [r for r in consumer.notifies() if r.path == "/ends"]  # noqa: E731
        wait_until(
            lambda: set(ends_named(got())) >= {s.address for s in doomed},
            30,
            what="a SubscriptionEnd for each subscription whose consumer is down",
        )

    def gone_everywhere() -> bool:
        for gateway in (a, b):
            for sub in doomed + expiring:
                try:
                    c.client(gateway).subscription(
                        EndpointReference(c.via(gateway, sub.address))
                    ).properties()
                except ResourceUnknownFault:
                    continue
                return False
        return True

    wait_until(gone_everywhere, 20, what="the ended and the expired ones gone on both instances")
    wait_until(
        lambda: all(
            any(f"subscription {s.id} expired" in g.log_path.read_text() for g in (a, b))
            for s in expiring
        ),
        10,
        what="the sweep's log lines of the expired ones",
    )
    # the sentinels: published through each instance after every end and expiry, they come
    # after any SubscriptionEnd published before them (one queue, in order)
    for gateway in (a, b):
        c.client(gateway).notify(f"<sentinel>{c.instance_of(gateway)}</sentinel>", ends)
    wait_until(
        lambda: sorted(sentinels(got())) == ["g0", "g1"], 20, what="the sentinel of each instance"
    )
    named = collections.Counter(ends_named(got()))
    assert named == collections.Counter({s.address: 1 for s in doomed}), named
    # ended on one instance, each once: the one that delivered it
    logs = [g.log_path.read_text() for g in (a, b)]
    for sub in doomed:
        assert sum(text.count(f"ending subscription {sub.id}:") for text in logs) == 1, sub.id
    for rec in got():
        assert rec.headers.get(INSTANCE) in ("g0", "g1"), rec.headers


class Publisher(ConsumerServer):
    """Demand-based publishers that note each call (operation, path, caller's instance)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        super().__init__()

    def _handle(self, handler, data: bytes) -> None:  # type: ignore[no-untyped-def]
        op = ""
        try:
            body = etree.fromstring(data).find("{*}Body")
            op = etree.QName(next(iter(body))).localname if body is not None else ""
        except (etree.XMLSyntaxError, StopIteration):
            pass
        self.calls.append((op, handler.path, handler.headers.get(INSTANCE, "")))
        super()._handle(handler, data)


@pytest.mark.rabbitmq
def test_a_demand_based_publisher_is_called_once_per_change_by_the_leader_only(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    """Every change of demand goes through the instance that does not lead; each call at
    the publisher is the sentinel of the one before (a second instance's copy of a call
    would come between them)."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower = leader_and_follower(c)
    by_leader, by_follower = c.instance_of(leader), c.instance_of(follower)
    wanted = topic("demand")
    publisher = Publisher()
    try:
        wf = c.client(follower)
        registration = wf.register_publisher(publisher.address("/producer"), [wanted], demand=True)

        def via(address: str) -> EndpointReference:
            return EndpointReference(c.via(follower, address))

        def called(*calls: tuple[str, str, str]) -> None:
            wait_until(
                lambda: len(publisher.calls) >= len(calls),
                20,
                what=f"the call {calls[-1]} at the publisher",
            )
            assert publisher.calls == list(calls)

        subscribe = ("Subscribe", "/producer", by_leader)
        pause = ("PauseSubscription", "/publisher-subscriptions/1", by_leader)
        resume = ("ResumeSubscription", "/publisher-subscriptions/1", by_leader)
        first = wf.subscribe(consumer.address("/demand1"), wanted)
        called(subscribe)
        wf.subscription(via(first.address)).unsubscribe()
        called(subscribe, pause)
        second = wf.subscribe(consumer.address("/demand2"), wanted)
        called(subscribe, pause, resume)
        wf.subscription(via(second.address)).pause()
        called(subscribe, pause, resume, pause)
        # DestroyRegistration: the instance asked unsubscribes at the publisher
        wf.destroy_registration(via(registration.reference.address))
        gone = ("Unsubscribe", "/publisher-subscriptions/1", by_follower)
        called(subscribe, pause, resume, pause, gone)
        # the sentinel: a second publisher's Subscribe, by the leader once it followed
        # the registration, the resume and, before them, the destruction
        other = wf.register_publisher(publisher.address("/other"), [wanted], demand=True)
        wf.subscription(via(second.address)).resume()
        called(subscribe, pause, resume, pause, gone, ("Subscribe", "/other", by_leader))
        wf.subscription(via(second.address)).unsubscribe()
        wf.destroy_registration(via(other.reference.address))
    finally:
        publisher.close()


class HeldPublisher(Publisher):
    """A publisher that holds its answer to each Subscribe until :attr:`answer` is set
    (``caller``: only to the Subscribes of that instance)."""

    def __init__(self, caller: str | None = None) -> None:
        self.answer = threading.Event()
        self._caller = caller
        super().__init__()

    def _handle(self, handler, data: bytes) -> None:  # type: ignore[no-untyped-def]
        caller = handler.headers.get(INSTANCE, "")
        if b"Subscribe>" in data and b"Unsubscribe" not in data and self._caller in (None, caller):
            self.calls.append(("Subscribe (held)", handler.path, caller if self._caller else ""))
            self.answer.wait(30)
        super()._handle(handler, data)


def registrations(gateway: Gateway) -> set[str]:
    """The ids of the registrations ``gateway`` holds (its admin API)."""
    answer = requests.get(f"{gateway.base_url}/wsn/admin/api/registrations", timeout=5)
    answer.raise_for_status()
    return {r["id"] for r in answer.json()["registrations"]}


@pytest.mark.rabbitmq
def test_a_registration_destroyed_while_the_leader_subscribes_at_its_publisher_leaves_nothing(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    """DestroyRegistration through the instance that does not lead, answered while the
    leader's Subscribe at the publisher waits for its answer: once the leader has the
    answer, it unsubscribes at the publisher (nobody else knows that subscription), and
    the registration stays destroyed in the store.  Before, the publisher's subscription
    stayed, sending to the broker for a registration that no longer exists."""
    c = shared_cluster(2, **SETTINGS)
    leader, follower = leader_and_follower(c)
    wanted = topic("held-demand")
    publisher = HeldPublisher()
    try:
        wf = c.client(follower)
        registration = wf.register_publisher(publisher.address("/held"), [wanted], demand=True)
        sub = wf.subscribe(consumer.address("/held-demand"), wanted)
        wait_until(lambda: publisher.calls, 20, what="the leader's Subscribe at the publisher")
        wf.destroy_registration(EndpointReference(c.via(follower, registration.reference.address)))
        wait_until(
            lambda: registration.id not in registrations(leader),
            20,
            what="the leader following the destruction",
        )
        publisher.answer.set()
        wait_until(
            lambda: any(op == "Unsubscribe" for op, _, _ in publisher.calls),
            20,
            what="the leader's Unsubscribe of the subscription it made at the publisher",
        )
        assert [(op, path) for op, path, _ in publisher.calls] == [
            ("Subscribe (held)", "/held"),
            ("Subscribe", "/held"),
            ("Unsubscribe", "/publisher-subscriptions/1"),
        ]
        with psycopg.connect(c.store_url) as store:
            row = store.execute(
                "SELECT count(*) FROM registrations WHERE id = %s", (registration.id,)
            ).fetchone()
        assert row == (0,)
        wf.subscription(EndpointReference(c.via(follower, sub.address))).unsubscribe()
    finally:
        publisher.answer.set()
        publisher.close()


#: the trigger function of the store's change log (migration 7) without its NOTIFY
SILENT = """CREATE OR REPLACE FUNCTION wsnmom_note_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE rid TEXT; writer TEXT := current_setting('application_name');
BEGIN
    IF TG_OP = 'DELETE' THEN rid := OLD.id; ELSE rid := NEW.id; END IF;
    INSERT INTO wsnmom_changes (kind, id, origin) VALUES (TG_ARGV[0], rid, writer);
    RETURN NULL;
END $$"""


@contextlib.contextmanager
def silenced(c: Cluster) -> Iterator[None]:
    """The store's writes logged without a NOTIFY while inside (the trigger function put
    back after)."""
    with psycopg.connect(c.store_url, autocommit=True) as store:
        original = store.execute(
            "SELECT pg_get_functiondef('wsnmom_note_change'::regproc)"
        ).fetchone()
        assert original is not None
        store.execute(SILENT)
        try:
            yield
        finally:
            store.execute(original[0])


@pytest.mark.rabbitmq
def test_with_every_notify_lost_polling_alone_brings_a_change_within_1_s(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    """The store's trigger function replaced by one that logs each change and sends no
    NOTIFY: an Unsubscribe and a Pause through the instance that does not deliver are each
    reported by the deliverer's admin API within 1 s (``cluster.poll`` 0.5 s), and held
    to (a control subscription's copy of the next message is the sentinel)."""
    c = shared_cluster(2, **SETTINGS)
    a, b = c.gateways
    wa = c.client(a)
    bound = topic("polled")
    control = wa.subscribe(consumer.address("/polled-control"), bound)
    wa.notify('<n xmlns="urn:n">start</n>', bound)
    first = wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/polled-control"],
        10,
        what="the first delivery",
    )
    deliverer, other = (a, b) if first[0].headers[INSTANCE] == c.instance_of(a) else (b, a)
    wo = c.client(other)
    with silenced(c):
        took: list[float] = []
        for i in range(3):
            gone = wa.subscribe(consumer.address(f"/polled-gone{i}"), bound)
            held = wa.subscribe(consumer.address(f"/polled-held{i}"), bound)
            for sub in (gone, held):
                wait_until(
                    lambda s=sub: detail_of(deliverer, s.id) is not None,  # type: ignore[misc]
                    10,
                    what=f"the deliverer knowing {sub.id}",
                )
            wo.subscription(EndpointReference(c.via(other, gone.address))).unsubscribe()
            took.append(
                obeyed_after(
                    time.monotonic(),
                    lambda s=gone: detail_of(deliverer, s.id) is None,  # type: ignore[misc]
                    f"round {i}: the deliverer forgetting the unsubscribed one",
                )
            )
            wo.subscription(EndpointReference(c.via(other, held.address))).pause()
            took.append(
                obeyed_after(
                    time.monotonic(),
                    lambda s=held: delivering(deliverer, s.id) is False,  # type: ignore[misc]
                    f"round {i}: the deliverer stopping the paused one",
                )
            )
            wo.notify(f'<n xmlns="urn:n">{i}</n>', bound)
            wait_until(
                lambda i=i: str(i) in received(consumer, control.address),  # type: ignore[misc]
                10,
                what=f"the control subscription's copy of {i} (the sentinel)",
            )
            assert str(i) not in received(consumer, gone.address)
            assert str(i) not in received(consumer, held.address)
            wa.subscription(EndpointReference(c.via(a, held.address))).unsubscribe()
    assert max(took) <= FOLLOW, took
    wa.subscription(EndpointReference(c.via(a, control.address))).unsubscribe()
