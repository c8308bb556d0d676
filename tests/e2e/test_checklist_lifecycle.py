"""docs/conformance.md §5.4-§5.10 and §9 over HTTP: Renew, Unsubscribe, Pause/Resume, termination
during a pause, WSRL immediate termination of the exposed resources, pull points
(GetMessages, DestroyPullPoint, CreatePullPoint).

Each test names the rule ids it proves; ``docs/conformance.md`` maps them back."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import isodate
import pytest
from lxml import etree

from tests.e2e.conftest import Answer, Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, SIMPLE, envelope, epr_address
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

WSRF_RL = "http://docs.oasis-open.org/wsrf/rl-2"
DESTROY = f'<wsrf-rl:Destroy xmlns:wsrf-rl="{WSRF_RL}"/>'


def _renew(wsn: Wsn, address: str, value: str, nil: bool = False) -> Answer:
    el = (
        '<wsnt:TerminationTime xsi:nil="true"/>'
        if nil
        else f"<wsnt:TerminationTime>{value}</wsnt:TerminationTime>"
    )
    return wsn.post(address, f"<wsnt:Renew>{el}</wsnt:Renew>")


def _tt(resp: etree._Element) -> datetime:
    return isodate.parse_datetime(resp.findtext("wsnt:TerminationTime", namespaces=NS) or "")


def _property_tt(wsn: Wsn, address: str) -> datetime:
    rp = "<wsrf-rp:GetResourceProperty>wsnt:TerminationTime</wsrf-rp:GetResourceProperty>"
    return _tt(wsn.post(address, rp).ok())


def test_renew_semantics(wsn: Wsn, consumer: ConsumerServer) -> None:
    """REN-02, REN-03, REN-05, REN-07, REN-08, TT-03: absolute and relative values reset the
    termination time (also as resource property), a value without timezone is UTC, the
    response has TerminationTime and CurrentTime; a past value faults and changes nothing."""
    sub = wsn.subscribe(consumer.address(), itt="PT10M")
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    resp = _renew(wsn, sub.address, when.strftime("%Y-%m-%dT%H:%M:%S")).ok()
    assert _tt(resp) == when == _property_tt(wsn, sub.address)
    ct = isodate.parse_datetime(resp.findtext("wsnt:CurrentTime", namespaces=NS) or "")
    assert abs(ct - datetime.now(UTC)) < timedelta(minutes=1)
    resp = _renew(wsn, sub.address, "PT30M").ok()
    ct = isodate.parse_datetime(resp.findtext("wsnt:CurrentTime", namespaces=NS) or "")
    assert abs((_tt(resp) - ct) - timedelta(minutes=30)) < timedelta(seconds=2)
    granted = _tt(resp)
    for past in ("2001-01-01T00:00:00Z", "-PT1M", "PT0S"):
        ans = _renew(wsn, sub.address, past)
        assert ans.fault == "UnacceptableTerminationTimeFault", past
        assert ans.body.findtext(".//wsnt:MinimumTime", namespaces=NS)
    assert _property_tt(wsn, sub.address) == granted


def test_renew_nil_follows_the_infinite_policy(wsn: Wsn, consumer: ConsumerServer) -> None:
    """REN-04, REN-06: nil asks for no termination; granted only when infinite lifetimes
    are configured, otherwise UnacceptableTerminationTimeFault (a shorter time is never
    granted instead)."""
    sub = wsn.subscribe(consumer.address())
    ans = _renew(wsn, sub.address, "", nil=True)
    policy = etree.fromstring(wsn.http.get(f"{wsn.server.base_url}/wsn/policy").content)
    if policy.findtext("{urn:wsnmom:policy:1}InfiniteTerminationAllowed") == "true":
        assert (
            ans.ok()
            .find("wsnt:TerminationTime", NS)
            .get(  # type: ignore[union-attr]
                "{http://www.w3.org/2001/XMLSchema-instance}nil"
            )
            == "true"
        )
    else:
        assert ans.fault == "UnacceptableTerminationTimeFault"


def test_pause_resume_state_and_lifetime(wsn: Wsn, consumer: ConsumerServer) -> None:
    """PAU-01, PAU-03, PAU-05, PAU-06, RES-03, RES-04, RES-05, RES-06, Renew-keeps-pause
    [derived]: resuming an active subscription is a no-op success; a paused subscription
    delivers nothing; TerminationTime is untouched by pause, resume and an in-pause Renew
    keeps it paused; on resume the accumulated messages arrive (advertised policy)."""
    sub = wsn.subscribe(consumer.address(), itt="PT10M")
    before = _property_tt(wsn, sub.address)
    wsn.post(sub.address, "<wsnt:ResumeSubscription/>").ok()  # not paused: no change
    wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
    assert _property_tt(wsn, sub.address) == before
    renewed = _tt(_renew(wsn, sub.address, "PT20M").ok())
    witness = wsn.subscribe(consumer.address())  # the barrier: it gets a sentinel after
    wsn.notify(("tns:myTopic", "<p>while-paused</p>"), ("tns:myTopic", "<sentinel/>"))
    consumer.wait_for_sentinel(witness.address)
    assert consumer.messages_for(sub.address) == []  # still paused after Renew
    wsn.post(sub.address, "<wsnt:ResumeSubscription/>").ok()
    assert _property_tt(wsn, sub.address) == renewed
    msg, _sentinel = wait_until(
        lambda: len(m := consumer.messages_for(sub.address)) >= 2 and m,
        what="the held messages after resume",
    )
    assert msg.findtext("wsnt:Message/p", namespaces=NS) == "while-paused"
    policy = wsn.http.get(f"{wsn.server.base_url}/wsn/policy").content
    assert b"PauseBehaviour" in policy  # RES-05: the choice is advertised


def test_expiry_during_pause_destroys(wsn: Wsn, consumer: ConsumerServer) -> None:
    """TT-04, TT-05, PAU-05: the termination time passes while paused; the subscription is
    destroyed (ResourceUnknownFault afterwards) and never delivers."""
    sub = wsn.subscribe(consumer.address(), itt="PT1S")
    wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
    rp = "<wsrf-rp:GetResourceProperty>wsnt:CreationTime</wsrf-rp:GetResourceProperty>"
    wait_until(  # probe with a read: a ResumeSubscription probe would un-pause it
        lambda: wsn.post(sub.address, rp).fault == "ResourceUnknownFault",
        timeout=5,
        interval=0.2,
        what="the paused subscription to expire",
    )
    assert wsn.post(sub.address, "<wsnt:ResumeSubscription/>").fault == "ResourceUnknownFault"
    witness = wsn.subscribe(consumer.address())
    wsn.notify(("tns:myTopic", "<late/>"), ("tns:myTopic", "<sentinel/>"))
    assert len(consumer.wait_for_sentinel(witness.address)) == 2
    assert consumer.messages_for(sub.address) == []


def test_unsubscribe_destroys(wsn: Wsn, consumer: ConsumerServer) -> None:
    """UNS-02, UNS-03: after Unsubscribe nothing more is delivered and every operation on
    the EPR answers ResourceUnknownFault."""
    sub = wsn.subscribe(consumer.address())
    witness = wsn.subscribe(consumer.address())
    wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
    wsn.notify(("tns:myTopic", "<gone/>"))
    for body in (
        "<wsnt:Renew><wsnt:TerminationTime>PT1M</wsnt:TerminationTime></wsnt:Renew>",
        "<wsnt:PauseSubscription/>",
        "<wsnt:ResumeSubscription/>",
        "<wsnt:Unsubscribe/>",
        "<wsrf-rp:GetResourceProperty>wsnt:Filter</wsrf-rp:GetResourceProperty>",
    ):
        assert wsn.post(sub.address, body).fault == "ResourceUnknownFault", body
    wsn.notify(("tns:myTopic", "<sentinel/>"))
    assert len(consumer.wait_for_sentinel(witness.address)) == 2
    assert consumer.messages_for(sub.address) == []


def test_wsrl_destroy_of_every_resource(wsn: Wsn, consumer: ConsumerServer) -> None:
    """RP-02, PP-03, PRM-02: subscriptions, pull points and registrations expose resource
    properties, so they support WS-ResourceLifetime immediate termination (wsrf-rl:Destroy);
    afterwards they are unknown."""
    sub = wsn.subscribe(consumer.address())
    _, pp = wsn.create_pull_point()
    reg_body = (
        f'<wsn-br:RegisterPublisher><wsn-br:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">'
        "tns:r</wsn-br:Topic></wsn-br:RegisterPublisher>"
    )
    reg_resp = wsn.post(wsn.broker, reg_body).ok()
    reg = epr_address(reg_resp.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    for address in (sub.address, pp, reg):
        ans = wsn.post(
            address,
            DESTROY,
            action="http://docs.oasis-open.org/wsrf/rlw-2/ImmediateResourceTermination/DestroyRequest",
            validate=False,  # the rl-2 schema is not among the validated ones
        )
        assert ans.status == 200, ans.data
        assert ans.body.tag == f"{{{WSRF_RL}}}DestroyResponse"
        rp = "<wsrf-rp:GetResourceProperty>wsnt:TerminationTime</wsrf-rp:GetResourceProperty>"
        assert wsn.post(address, rp).fault == "ResourceUnknownFault"
        assert wsn.post(address, DESTROY, validate=False).status == 500
    assert wsn.post(wsn.broker, DESTROY, validate=False).status == 500  # the broker is not


# --- pull points ------------------------------------------------------------------------
def test_get_messages_counts_and_destructive_read(wsn: Wsn) -> None:
    """GM-02, GM-03, GM-04, GM-05, GM-06, PP-02, PP-05, PP-09: an empty pull point answers at
    once; MaximumNumber caps the answer exactly; reads are destructive and FIFO; without
    MaximumNumber everything held is returned."""
    _, pp = wsn.create_pull_point()
    started = time.monotonic()
    answer = wsn.post(pp, "<wsnt:GetMessages/>", validate=False)  # the exchange alone
    waited = time.monotonic() - started
    assert answer.status == 200, answer.data
    # no long poll: one round trip (milliseconds on a quiet machine, not a second even at
    # load 25), where a wait for messages would hold the answer for good
    assert waited < 5.0, waited
    assert wsn.get_messages(pp) == []  # the answer checked against the schema
    wsn.subscribe(pp)
    wsn.notify(*[("tns:myTopic", f"<n>{i}</n>") for i in range(5)])

    def values(msgs: list[etree._Element]) -> list[str]:
        return [m.findtext("wsnt:Message/n", namespaces=NS) or "" for m in msgs]

    got: list[etree._Element] = []
    first = wait_until(lambda: wsn.get_messages(pp, 2), what="first two messages")
    assert len(first) <= 2
    got.extend(first)
    while len(got) < 2:
        got.extend(wsn.get_messages(pp, 2 - len(got)))
    wait_until(lambda: len(got) >= 5 or got.extend(wsn.get_messages(pp, 10)), what="the rest")
    assert values(got) == ["0", "1", "2", "3", "4"]
    assert wsn.get_messages(pp) == []  # GM-06: nothing comes back


def test_get_messages_exactly_maximum(wsn: Wsn) -> None:
    """GM-05 with messages already held: 3 held, MaximumNumber=2 → exactly 2, then 1."""
    _, pp = wsn.create_pull_point()
    body = "".join(
        "<wsnt:NotificationMessage>"
        f'<wsnt:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:x</wsnt:Topic>'
        f"<wsnt:Message><n>{i}</n></wsnt:Message></wsnt:NotificationMessage>"
        for i in range(3)
    )
    resp = wsn.http.post(
        pp,
        data=envelope(f"<wsnt:Notify>{body}</wsnt:Notify>"),
        headers={"Content-Type": "application/soap+xml"},
    )
    assert resp.status_code in (200, 202)
    held: list[etree._Element] = wsn.get_messages(pp, 2)
    if len(held) < 2:  # accumulation still in flight: read the rest one by one
        held += wait_until(lambda: wsn.get_messages(pp, 2 - len(held)), what="held messages")
    assert len(held) == 2
    assert len(wait_until(lambda: wsn.get_messages(pp, 2), what="the third")) == 1


def test_get_messages_returns_notification_message_verbatim(wsn: Wsn) -> None:
    """GM-07, PP-05: a Notify sent to the pull point comes back with its
    SubscriptionReference, Topic, ProducerReference and Message unchanged."""
    _, pp = wsn.create_pull_point()
    holder = (
        "<wsnt:NotificationMessage>"
        "<wsnt:SubscriptionReference><wsa:Address>http://producer.example/subs/7</wsa:Address>"
        "</wsnt:SubscriptionReference>"
        f'<wsnt:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:verbatim</wsnt:Topic>'
        "<wsnt:ProducerReference><wsa:Address>http://producer.example/p</wsa:Address>"
        "</wsnt:ProducerReference>"
        '<wsnt:Message><v:data xmlns:v="urn:v" v:k="1"><v:i>x</v:i></v:data></wsnt:Message>'
        "</wsnt:NotificationMessage>"
    )
    resp = wsn.http.post(
        pp,
        data=envelope(f"<wsnt:Notify>{holder}</wsnt:Notify>"),
        headers={"Content-Type": "application/soap+xml"},
    )
    assert resp.status_code in (200, 202)
    (msg,) = wait_until(lambda: wsn.get_messages(pp), what="the pulled message")
    assert msg.findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NS) == (
        "http://producer.example/subs/7"
    )
    assert msg.findtext("wsnt:ProducerReference/wsa:Address", namespaces=NS) == (
        "http://producer.example/p"
    )
    topic = msg.find("wsnt:Topic", NS)
    assert topic is not None and topic.get("Dialect") == SIMPLE
    assert topic.nsmap[(topic.text or "").split(":")[0]] == wsn.ns
    got = msg.find("wsnt:Message/{urn:v}data", NS)
    assert got is not None
    assert etree.tostring(got, method="c14n", exclusive=True) == etree.tostring(
        etree.fromstring('<v:data xmlns:v="urn:v" v:k="1"><v:i>x</v:i></v:data>'),
        method="c14n",
        exclusive=True,
    )


def test_create_and_destroy_pull_point(wsn: Wsn) -> None:
    """CPP-02, CPP-03, CPP-06, DPP-01, DPP-02, PP-11: CreatePullPoint returns the EPR of a
    new resource with a factory-set termination time; DestroyPullPoint removes it."""
    first, a = wsn.create_pull_point()
    second, b = wsn.create_pull_point()
    assert first != second and a != b
    assert _property_tt(wsn, a) > datetime.now(UTC)
    wsn.post(a, "<wsnt:DestroyPullPoint/>").ok()
    assert wsn.post(a, "<wsnt:GetMessages/>").fault == "ResourceUnknownFault"
    assert wsn.post(a, "<wsnt:DestroyPullPoint/>").fault == "ResourceUnknownFault"
    wsn.get_messages(b)  # the other one is untouched


def test_destroy_pull_point_ends_its_subscriptions(wsn: Wsn) -> None:
    """DPP-04, PP-04 (decision): DestroyPullPoint also unsubscribes the subscriptions that
    feed it, so no subscription is left pointing at a destroyed pull point."""
    _, pp = wsn.create_pull_point()
    sub = wsn.subscribe(pp)
    wsn.post(pp, "<wsnt:DestroyPullPoint/>").ok()
    wait_until(
        lambda: wsn.post(sub.address, "<wsnt:PauseSubscription/>").fault == "ResourceUnknownFault",
        what="the feeding subscription to be removed",
    )


def test_use_raw_to_pull_point_is_stored_wrapped(wsn: Wsn) -> None:
    """PP-10 (decision): a UseRaw subscription whose consumer is one of our pull points
    still accumulates whole NotificationMessages (GetMessages has no raw form)."""
    _, pp = wsn.create_pull_point()
    wsn.subscribe(pp, policy="<wsnt:UseRaw/>")
    wsn.notify(("tns:myTopic", '<r:x xmlns:r="urn:r"/>'))
    (msg,) = wait_until(lambda: wsn.get_messages(pp), what="the pulled message")
    assert msg.find("wsnt:Message/{urn:r}x", NS) is not None
    assert msg.find("wsnt:Topic", NS) is not None
