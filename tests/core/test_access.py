"""Ownership, topic ACLs and quotas at service level (issue 16, findings 4 and 5): who
created a resource owns it, only it or an admin may act on or read it, a non-owner gets
exactly the answer of an unknown id; topic ACLs bound Subscribe/Notify/RegisterPublisher;
per-identity and global quotas refuse creations with precise faults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.access import ANONYMOUS, IdentityQuotas, Principal, bound_principal
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    RegisterPublisherRequest,
)
from wsnmom.core.service import BrokerService
from wsnmom.soap_frontend.credentials import parse_acl
from wsnmom.topic_mapping.dialects import ONVIF_CONCRETE_SET
from wsnmom.topic_mapping.model import DEEP, PathPattern, pattern_covers

from .conftest import NS, NSMAP, Broker, ExpressionSource, concrete, full, note, simple, sub_req

ALICE = Principal("alice", method="basic")
BOB = Principal("bob", method="basic")
ROOT = Principal("root", admin=True, method="basic")


@contextmanager
def as_(principal: Principal) -> Iterator[None]:
    with bound_principal(principal):
        yield


def _fault_text(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    with pytest.raises(errors.WsnError) as info:
        call()
    return type(info.value), str(info.value)


def test_non_owner_gets_the_unknown_id_answer_for_every_operation(service: BrokerService) -> None:
    with as_(ALICE):
        sub = service.subscribe(sub_req(topic=simple("t:own")))
        pp = service.create_pull_point(CreatePullPointRequest())
        reg = service.register_publisher(RegisterPublisherRequest(None, (simple("t:own"),)))
    assert (sub.owner, service.get_pull_point(pp.id).owner) == ("alice", "alice")
    unknown = "0" * 32
    calls: list[tuple[Callable[[str], Any], str, str]] = [
        (service.get_subscription, sub.id, "subscription"),
        (lambda i: service.renew(i, timedelta(minutes=1)), sub.id, "subscription"),
        (service.pause, sub.id, "subscription"),
        (service.resume, sub.id, "subscription"),
        (service.unsubscribe, sub.id, "subscription"),
        (service.get_pull_point, pp.id, "pull point"),
        (lambda i: service.get_messages(i, 1), pp.id, "pull point"),
        (lambda i: service.notify_pull_point(i, [note("<x/>")]), pp.id, "pull point"),
        (service.destroy_pull_point, pp.id, "pull point"),
        (service.get_registration, reg.id, "registration"),
        (service.destroy_registration, reg.id, "registration"),
    ]
    for principal in (BOB, ANONYMOUS):
        with as_(principal):
            for call, rid, _ in calls:
                kind, text = _fault_text(lambda c=call, r=rid: c(r))
                assert kind is errors.ResourceUnknown
                # exactly what an id that does not exist gets, with the id swapped
                _, text_unknown = _fault_text(lambda c=call: c(unknown))
                assert text == text_unknown.replace(unknown, rid)
    # nothing changed: alice still has everything, unpaused
    with as_(ALICE):
        assert service.get_subscription(sub.id).state.value == "active"
        service.pause(sub.id)
        service.resume(sub.id)
        service.renew(sub.id, timedelta(minutes=5))
        assert service.get_messages(pp.id, 5) == []
        service.destroy_registration(reg.id)
    with as_(ROOT):  # an admin may act on anything
        service.unsubscribe(sub.id)
        service.destroy_pull_point(pp.id)


def test_third_party_pause_is_a_setting(make_broker: Callable[..., Broker]) -> None:
    service = make_broker(auth__third_party_pause=True).service
    with as_(ALICE):
        sub = service.subscribe(sub_req(topic=simple("t:p")))
    with as_(BOB):
        service.pause(sub.id)
        service.resume(sub.id)
        with pytest.raises(errors.ResourceUnknown):
            service.unsubscribe(sub.id)
    with as_(ANONYMOUS), pytest.raises(errors.ResourceUnknown):  # authenticated ones only
        service.pause(sub.id)


def test_owners_survive_a_restart(broker: Broker) -> None:
    service = broker.service
    assert service is not None
    with as_(ALICE):
        sub = service.subscribe(sub_req(topic=simple("t:keep")))
        pp = service.create_pull_point(CreatePullPointRequest())
        reg = service.register_publisher(RegisterPublisherRequest(None, (simple("t:keep"),)))
    service = broker.restart()
    for call, rid in (
        (service.get_subscription, sub.id),
        (service.get_pull_point, pp.id),
        (service.get_registration, reg.id),
    ):
        with as_(BOB), pytest.raises(errors.ResourceUnknown):
            call(rid)
        with as_(ALICE):
            assert call(rid).owner == "alice"
    assert service.registry.subscriptions.owned_by("alice") == 1


def test_records_without_an_owner_are_anonymous_ones(broker: Broker) -> None:
    """Records written before owners existed (no "owner" key) load as anonymous-owned:
    anonymous callers keep managing them, identities do not, admins do."""
    service = broker.service
    assert service is not None
    with as_(ANONYMOUS):
        pp = service.create_pull_point(CreatePullPointRequest())
    store = service.store
    conn: Any = store._conn  # type: ignore[attr-defined]
    rows = conn.execute("SELECT id, data FROM pull_points").fetchall()
    import json

    for rid, data in rows:
        doc = json.loads(data)
        doc.pop("owner")
        conn.execute("UPDATE pull_points SET data = ? WHERE id = ?", (json.dumps(doc), rid))
    service = broker.restart()
    with as_(ALICE), pytest.raises(errors.ResourceUnknown):
        service.get_messages(pp.id, 1)
    with as_(ANONYMOUS):
        assert service.get_messages(pp.id, 1) == []
    with as_(ROOT):
        service.destroy_pull_point(pp.id)


def test_named_pull_points_are_per_owner(service: BrokerService) -> None:
    with as_(ALICE):
        mine = service.create_pull_point(CreatePullPointRequest(name="inbox"))
        assert service.create_pull_point(CreatePullPointRequest(name="inbox")).id == mine.id
    with as_(BOB):
        theirs = service.create_pull_point(CreatePullPointRequest(name="inbox"))
    assert theirs.id != mine.id


def test_a_subscription_feeds_only_its_owners_pull_point(service: BrokerService) -> None:
    with as_(ALICE):
        pp = service.create_pull_point(CreatePullPointRequest())
    address = service.pull_point_address(pp.id)
    # for bob it is just an address: one of the gateway's own endpoints, refused as any
    # other would be (a delivery loop), whether or not a pull point lives there
    with as_(BOB), pytest.raises(errors.ConsumerAddressRefused, match="own endpoint"):
        service.subscribe(sub_req(address, topic=simple("t:feed")))
    with as_(BOB), pytest.raises(errors.ConsumerAddressRefused, match="own endpoint"):
        service.subscribe(sub_req(address[:-4] + "ffff", topic=simple("t:feed")))
    with as_(ALICE):
        assert service.subscribe(sub_req(address, topic=simple("t:feed"))).pull_point_id == pp.id


# --- requires_registration -----------------------------------------------------------------
def test_registration_vouches_only_for_its_owner(make_broker: Callable[..., Broker]) -> None:
    """Finding 4: an anonymous RegisterPublisher claiming any PublisherReference used to
    defeat requires_registration; now a registration covers its owner's Notify only."""
    service = make_broker(requires_registration=True).service
    producer = "http://publisher.test/p"
    with as_(ALICE):
        service.register_publisher(
            RegisterPublisherRequest(EndpointReference(producer), (simple("t:reg"),))
        )
        service.notify([note("<a/>", simple("t:reg"), producer)])
    for principal in (BOB, ANONYMOUS):
        with as_(principal), pytest.raises(errors.PublisherRegistrationRejected):
            service.notify([note("<b/>", simple("t:reg"), producer)])


def test_publisher_reference_belongs_to_its_first_registrant(
    make_broker: Callable[..., Broker],
) -> None:
    """Issue 22 item 10: bob registered alice's PublisherReference and published under it;
    consumers received alice's ProducerReference unchanged.  Now the reference is alice's
    while she holds a live registration of it."""
    service = make_broker(requires_registration=True).service
    producer = "http://publisher.test/alice"
    with as_(ALICE):
        mine = [
            service.register_publisher(
                RegisterPublisherRequest(EndpointReference(producer), (simple(topic),))
            ).id
            for topic in ("t:reg", "t:other")  # her own second registration of it is fine
        ]
    for principal in (BOB, ANONYMOUS):
        with as_(principal), pytest.raises(errors.PublisherRegistrationRejected) as info:
            service.register_publisher(
                RegisterPublisherRequest(EndpointReference(producer), (simple("t:reg"),))
            )
        assert "registered by another identity" in str(info.value)
        with as_(principal), pytest.raises(errors.PublisherRegistrationRejected):
            service.notify([note("<b/>", simple("t:reg"), producer)])
    with as_(ROOT):  # an admin vouches for anyone
        mine.append(
            service.register_publisher(
                RegisterPublisherRequest(EndpointReference(producer), (simple("t:reg"),))
            ).id
        )
    # once its registrations are gone, the reference is free again
    with as_(ROOT):
        for registration_id in mine:
            service.destroy_registration(registration_id)
    with as_(BOB):
        service.register_publisher(
            RegisterPublisherRequest(EndpointReference(producer), (simple("t:reg"),))
        )
        service.notify([note("<b/>", simple("t:reg"), producer)])


# --- topic ACLs ----------------------------------------------------------------------------
SENSORS = Principal(
    "sensor-app",
    subscribe=(PathPattern(NS, ("sensors", DEEP)),),
    notify=(PathPattern(NS, ("sensors", "room1")),),
    method="basic",
)


def test_subscribe_acl_covers_the_whole_filter(service: BrokerService) -> None:
    with as_(SENSORS):
        service.subscribe(sub_req(topic=simple("t:sensors")))
        service.subscribe(sub_req(topic=full("t:sensors//*")))
        service.subscribe(sub_req(topic=concrete("t:sensors/room1")))
        for refused in (full("t:*"), full("t:sensors|t:alarms"), simple("t:alarms"), None):
            with pytest.raises(errors.SubscribeCreationFailed) as info:
                service.subscribe(sub_req(topic=refused))
            assert info.value.http_status == 403
            assert "sensor-app may not subscribe" in str(info.value)


def test_notify_and_register_acl(service: BrokerService) -> None:
    with as_(SENSORS):
        service.notify([note("<ok/>", concrete("t:sensors/room1"))])
        for topic in (concrete("t:sensors/room2"), None):
            with pytest.raises(errors.NotificationRefused) as info:
                service.notify([note("<ok/>", concrete("t:sensors/room1")), note("<x/>", topic)])
            assert info.value.http_status == 403
        service.register_publisher(RegisterPublisherRequest(None, (concrete("t:sensors/room1"),)))
        with pytest.raises(errors.PublisherRegistrationRejected):
            service.register_publisher(RegisterPublisherRequest(None, (full("t:sensors//*"),)))
        with pytest.raises(errors.PublisherRegistrationRejected):
            service.register_publisher(RegisterPublisherRequest(None, ()))
        # a SubscriptionEnd topic is a publication too
        with pytest.raises(errors.NotificationRefused):
            service.subscribe(
                sub_req(topic=simple("t:sensors"), subscription_end_topic=simple("t:ends"))
            )


def concrete_set(text: str, ns: dict[str | None, str] | None = None) -> ExpressionSource:
    return ExpressionSource(ONVIF_CONCRETE_SET, text, dict(ns or NSMAP))


#: an identity whose ACLs are the whole namespace, written as operators write it
#: (``{ns}//*`` in users.toml: every topic of the namespace, at any depth)
WHOLE_NAMESPACE = Principal(
    "camera-app",
    subscribe=parse_acl([f"{{{NS}}}//*"], "subscribe"),
    notify=parse_acl([f"{{{NS}}}//*"], "notify"),
    method="wsse",
)


def test_a_whole_namespace_acl_covers_onvif_concrete_sets(service: BrokerService) -> None:
    """ONVIF's ConcreteSet dialect (``a//.``: a topic and everything below it, and unions
    of such paths) within a ``{ns}//*`` ACL: every ConcreteSet expression of the namespace
    is allowed, for Subscribe, RegisterPublisher and Notify."""
    with as_(WHOLE_NAMESPACE):
        for allowed in ("t:sensors//.", "t:sensors/room1|t:alarms//.", "t:sensors"):
            service.subscribe(sub_req(topic=concrete_set(allowed)))
            service.register_publisher(RegisterPublisherRequest(None, (concrete_set(allowed),)))
        service.notify([note("<ok/>", concrete_set("t:sensors/room1"))])
        with pytest.raises(errors.SubscribeCreationFailed):  # another namespace
            service.subscribe(sub_req(topic=concrete_set("o:x//.", {"o": "urn:other"})))
    # SENSORS publishes on sensors/room1 only: a subtree is more than that
    with as_(SENSORS), pytest.raises(errors.PublisherRegistrationRejected):
        service.register_publisher(RegisterPublisherRequest(None, (concrete_set("t:sensors//."),)))


def test_a_subtree_acl_leaves_out_its_root() -> None:
    """``a//*`` (below a) does not cover ONVIF's ``a//.`` (a and below), ``*//*`` (two
    levels or more) does not cover ``a//.`` either; ``//*`` and ``a//.`` do."""
    below = parse_acl([f"{{{NS}}}sensors//*"], "acl")[0]
    two_levels = parse_acl([f"{{{NS}}}*//*"], "acl")[0]
    subtree = PathPattern(NS, ("sensors", DEEP))
    assert not pattern_covers(below, subtree)
    assert not pattern_covers(two_levels, subtree)
    assert pattern_covers(parse_acl([f"{{{NS}}}//*"], "acl")[0], subtree)
    assert pattern_covers(parse_acl([f"{{{NS}}}*//."], "acl")[0], subtree)
    assert pattern_covers(subtree, below)


def test_current_message_and_topic_lists_follow_the_acl(service: BrokerService) -> None:
    service.notify([note("<s/>", concrete("t:sensors/room1")), note("<a/>", simple("t:alarms"))])
    with as_(SENSORS):
        assert service.get_current_message(concrete("t:sensors/room1")).payload == b"<s/>"
        with pytest.raises(errors.NoCurrentMessageOnTopic):
            service.get_current_message(simple("t:alarms"))
        props = service.broker_properties()
    texts = {e.text for e in props.topic_expressions}
    assert "tns:sensors/room1" in texts and "tns:alarms" not in texts
    from lxml import etree

    assert b"alarms" not in etree.tostring(props.topic_set)
    with as_(ALICE):  # no ACL: every topic
        assert "tns:alarms" in {e.text for e in service.broker_properties().topic_expressions}


# --- quotas --------------------------------------------------------------------------------
def test_per_identity_and_global_quotas(make_broker: Callable[..., Broker]) -> None:
    """Finding 5: one client could create subscriptions without bound."""
    service = make_broker(
        quotas__subscriptions=3, quotas__total_subscriptions=5, quotas__pull_points=1
    ).service
    with as_(ALICE):
        subs = [service.subscribe(sub_req(topic=simple("t:q"))) for _ in range(3)]
        with pytest.raises(errors.SubscribeCreationFailed, match=r"alice owns its maximum of 3"):
            service.subscribe(sub_req(topic=simple("t:q")))
        service.unsubscribe(subs[0].id)
        service.subscribe(sub_req(topic=simple("t:q")))
        service.create_pull_point(CreatePullPointRequest())
        with pytest.raises(errors.UnableToCreatePullPoint, match=r"quotas.pull_points"):
            service.create_pull_point(CreatePullPointRequest())
    own = Principal("small", quotas=IdentityQuotas(subscriptions=0), method="basic")
    with as_(own), pytest.raises(errors.SubscribeCreationFailed, match="maximum of 0"):
        service.subscribe(sub_req(topic=simple("t:q")))
    with as_(BOB):
        service.subscribe(sub_req(topic=simple("t:q")))
        service.subscribe(sub_req(topic=simple("t:q")))
        with pytest.raises(errors.SubscribeCreationFailed, match=r"quotas.total_subscriptions"):
            service.subscribe(sub_req(topic=simple("t:q")))
    # the broker itself (tests, recovery) is never bounded by quotas
    service.subscribe(sub_req(topic=simple("t:q")))


def test_anonymous_clients_share_one_quota(make_broker: Callable[..., Broker]) -> None:
    service = make_broker(quotas__registrations=2).service
    with as_(ANONYMOUS):
        for _ in range(2):
            service.register_publisher(RegisterPublisherRequest(None, ()))
        with pytest.raises(errors.PublisherRegistrationFailed, match="anonymous owns"):
            service.register_publisher(RegisterPublisherRequest(None, ()))


def test_notify_fanout_quota(make_broker: Callable[..., Broker]) -> None:
    """Finding 5: a big payload times many subscriptions was accepted whatever it cost."""
    service = make_broker(quotas__notify_fanout_bytes=50_000).service
    for _ in range(10):
        service.subscribe(sub_req(topic=simple("t:fan")))
    service.subscribe(sub_req(topic=simple("t:other")))
    payload = "<p>" + "x" * 4_000 + "</p>"  # 4 kB x 10 subscriptions = 40 kB: accepted
    with as_(ALICE):
        service.notify([note(payload, simple("t:fan"))])
        service.notify([note(payload * 10, simple("t:nobody"))])  # reaches none
        with pytest.raises(errors.NotificationRefused) as info:
            service.notify([note(payload * 2, simple("t:fan"))])  # 80 kB
    assert info.value.http_status == 413
    assert "quotas.notify_fanout_bytes (50000)" in str(info.value)
