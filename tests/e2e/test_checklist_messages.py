"""docs/conformance.md §1-§4 and §14 over HTTP: the wsa:Action of every response and fault
(GEN-02, GEN-05 and the per-operation action rules), WS-BaseFaults content (GEN-01, GEN-03),
the answer-or-fault rule (GEN-06), tolerance of ##other extensions (GEN-10) and the action
aliases §14 settles (CreatePullPoint example URIs, derived NotificationBroker actions).

Each test names the rule ids it proves; ``docs/conformance.md`` maps them back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree

from tests.e2e.conftest import Answer, Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import NS, SIMPLE, WSRF_BF, epr_address, subscribe_body

pytestmark = pytest.mark.e2e

BW = "http://docs.oasis-open.org/wsn/bw-2"
BRW = "http://docs.oasis-open.org/wsn/brw-2"
FAULT_ACTION = "http://docs.oasis-open.org/wsn/fault"
WSRF_FAULT_ACTION = "http://docs.oasis-open.org/wsrf/fault"
EXT = '<x:Ext xmlns:x="urn:checklist:ext">ignored</x:Ext>'


def action(ans: Answer) -> str | None:
    """The wsa:Action header of an answer."""
    return etree.fromstring(ans.data).findtext("{*}Header/wsa:Action", namespaces=NS)


def _register(wsn: Wsn, extra: str = "") -> Answer:
    body = (
        f'<wsn-br:RegisterPublisher><wsn-br:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">'
        f"tns:reg</wsn-br:Topic>{extra}</wsn-br:RegisterPublisher>"
    )
    return wsn.post(wsn.broker, body, action=f"{BRW}/RegisterPublisher/RegisterPublisherRequest")


def test_every_response_carries_its_action(wsn: Wsn, consumer: ConsumerServer) -> None:
    """GEN-05, SUB-04, GM-01, DPP-03, REN-01, UNS-01, PAU-02, RES-02, REG-03, DREG-02, and
    the CreatePullPoint/GetCurrentMessage response actions of the §4 table."""
    ans = wsn.post(wsn.broker, subscribe_body(consumer.address(), ns=wsn.ns))
    assert action(ans) == f"{BW}/NotificationProducer/SubscribeResponse"
    sub = epr_address(ans.ok().find("wsnt:SubscriptionReference", NS))  # type: ignore[arg-type]
    expected = {
        "<wsnt:Renew><wsnt:TerminationTime>PT5M</wsnt:TerminationTime></wsnt:Renew>": "Renew",
        "<wsnt:PauseSubscription/>": "PauseSubscription",
        "<wsnt:ResumeSubscription/>": "ResumeSubscription",
        "<wsnt:Unsubscribe/>": "Unsubscribe",
    }
    for body, op in expected.items():
        ans = wsn.post(sub, body, action=f"{BW}/SubscriptionManager/{op}Request")
        ans.ok()
        assert action(ans) == f"{BW}/SubscriptionManager/{op}Response", op

    ans = wsn.post(wsn.broker, "<wsnt:CreatePullPoint/>")
    assert action(ans) == f"{BW}/CreatePullPoint/CreatePullPointResponse"
    pp = epr_address(ans.ok().find("wsnt:PullPoint", NS))  # type: ignore[arg-type]
    ans = wsn.post(pp, "<wsnt:GetMessages/>")
    assert action(ans) == f"{BW}/PullPoint/GetMessagesResponse"
    ans = wsn.post(pp, "<wsnt:DestroyPullPoint/>")
    assert action(ans) == f"{BW}/PullPoint/DestroyPullPointResponse"

    wsn.notify(("tns:cm", '<p:v xmlns:p="urn:p">1</p:v>'))
    gcm = f"<wsnt:GetCurrentMessage>{wsn.simple('cm')}</wsnt:GetCurrentMessage>"
    ans = wsn.post(wsn.broker, gcm)
    assert ans.status == 200
    assert action(ans) == f"{BW}/NotificationProducer/GetCurrentMessageResponse"

    ans = _register(wsn)
    assert action(ans) == f"{BRW}/RegisterPublisher/RegisterPublisherResponse"
    reg = epr_address(ans.ok().find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    ans = wsn.post(reg, "<wsn-br:DestroyRegistration/>")
    ans.ok()
    assert action(ans) == f"{BRW}/PublisherRegistrationManager/DestroyRegistrationResponse"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_faults_are_base_faults_with_the_wsn_fault_action(
    wsn: Wsn, consumer: ConsumerServer, version: str
) -> None:
    """GEN-01, GEN-02, GEN-03, GEN-06, SUB-08: a refused Subscribe gets a SOAP fault whose
    detail is the WS-N fault element with a BaseFault Timestamp (and Description), under
    the wsn/fault action, in the request's SOAP version (schema-validated by ``post``)."""
    body = subscribe_body(consumer.address(), ns=wsn.ns, dialect="urn:checklist:no-dialect")
    ans = wsn.post(wsn.broker, body, version=version)
    assert ans.fault == "TopicExpressionDialectUnknownFault"
    assert action(ans) == FAULT_ACTION
    detail = ans.body.find(".//wsnt:TopicExpressionDialectUnknownFault", NS)
    assert detail is not None
    stamp = detail.findtext(f"{{{WSRF_BF}}}Timestamp")
    assert stamp and abs(datetime.fromisoformat(stamp) - datetime.now(UTC)) < timedelta(minutes=5)
    assert detail.findtext(f"{{{WSRF_BF}}}Description")


def test_fault_action_for_every_resource_operation(wsn: Wsn) -> None:
    """GEN-02, GEN-06, GM-08, DPP-02, PAU-06, RES-06, REN-09, UNS-02, PRM-01, DREG-03: the
    operations of unknown resources answer faults. ResourceUnknownFault is a WS-Resource
    fault, so it takes the WSRF fault action (GEN-02 [EXT]); a WS-N fault of the same
    operations (UnableToGetMessagesFault) takes the WS-N one."""
    base = wsn.server.base_url
    for path, body in (
        ("subscriptions", "<wsnt:PauseSubscription/>"),
        ("subscriptions", "<wsnt:ResumeSubscription/>"),
        ("subscriptions", "<wsnt:Unsubscribe/>"),
        ("pullpoints", "<wsnt:GetMessages/>"),
        ("pullpoints", "<wsnt:DestroyPullPoint/>"),
        ("registrations", "<wsn-br:DestroyRegistration/>"),
    ):
        ans = wsn.post(f"{base}/wsn/{path}/{'0' * 32}", body)
        assert ans.status == 500 and ans.fault == "ResourceUnknownFault", body
        assert action(ans) == WSRF_FAULT_ACTION, body
    _, pp = wsn.create_pull_point()
    bad = "<wsnt:GetMessages><wsnt:MaximumNumber>-1</wsnt:MaximumNumber></wsnt:GetMessages>"
    ans = wsn.post(pp, bad)
    assert ans.fault == "UnableToGetMessagesFault" and action(ans) == FAULT_ACTION


def test_other_namespace_extensions_are_ignored(wsn: Wsn, consumer: ConsumerServer) -> None:
    """GEN-10, NOT-04, REG-11: ##other children of Subscribe, Notify, Renew, GetMessages,
    CreatePullPoint, RegisterPublisher and the empty requests are tolerated."""
    sub = wsn.subscribe(consumer.address(), extra=EXT)
    notify = (
        "<wsnt:Notify><wsnt:NotificationMessage>"
        f'<wsnt:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:myTopic</wsnt:Topic>'
        f"<wsnt:Message><e/></wsnt:Message></wsnt:NotificationMessage>{EXT}</wsnt:Notify>"
    )
    resp = wsn.http.post(wsn.broker, data=_env(notify), headers={"Content-Type": _CT})
    assert resp.status_code in (200, 202)
    assert len(consumer.wait_for_messages(1)) == 1
    renew = f"<wsnt:Renew><wsnt:TerminationTime>PT5M</wsnt:TerminationTime>{EXT}</wsnt:Renew>"
    wsn.post(sub.address, renew).ok()
    wsn.post(sub.address, f"<wsnt:PauseSubscription>{EXT}</wsnt:PauseSubscription>").ok()
    wsn.post(sub.address, f"<wsnt:ResumeSubscription>{EXT}</wsnt:ResumeSubscription>").ok()
    wsn.post(sub.address, f"<wsnt:Unsubscribe>{EXT}</wsnt:Unsubscribe>").ok()
    pp = wsn.post(wsn.broker, f"<wsnt:CreatePullPoint>{EXT}</wsnt:CreatePullPoint>").ok()
    pp_addr = epr_address(pp.find("wsnt:PullPoint", NS))  # type: ignore[arg-type]
    get = f"<wsnt:GetMessages><wsnt:MaximumNumber>1</wsnt:MaximumNumber>{EXT}</wsnt:GetMessages>"
    wsn.post(pp_addr, get).ok()
    wsn.post(pp_addr, f"<wsnt:DestroyPullPoint>{EXT}</wsnt:DestroyPullPoint>").ok()
    reg = _register(wsn, EXT).ok()
    reg_addr = epr_address(reg.find("wsn-br:PublisherRegistrationReference", NS))  # type: ignore[arg-type]
    wsn.post(reg_addr, f"<wsn-br:DestroyRegistration>{EXT}</wsn-br:DestroyRegistration>").ok()


@pytest.mark.parametrize(
    "request_action",
    [
        f"{BW}/CreatePullPoint/CreatePullPointRequest",  # prose
        f"{BW}/PullPoint/CreatePullPointRequest",  # BN example (§14.1)
    ],
)
def test_create_pull_point_accepts_both_actions(wsn: Wsn, request_action: str) -> None:
    """§14.1 / §4 [DEFECT]: send the prose URI, accept the example's."""
    ans = wsn.post(wsn.broker, "<wsnt:CreatePullPoint/>", action=request_action)
    pp = ans.ok().find("wsnt:PullPoint", NS)
    assert pp is not None
    assert action(ans) == f"{BW}/CreatePullPoint/CreatePullPointResponse"
    wsn.post(epr_address(pp), "<wsnt:DestroyPullPoint/>").ok()


def test_derived_broker_actions_are_aliases(wsn: Wsn, consumer: ConsumerServer) -> None:
    """§4 Interop / §14.2: the WS-Addressing-Metadata default actions of the
    NotificationBroker and PullPoint portTypes are accepted; answers use the prose URIs."""
    ans = wsn.post(
        wsn.broker,
        subscribe_body(consumer.address(), ns=wsn.ns),
        action=f"{BRW}/NotificationBroker/SubscribeRequest",
    )
    ans.ok()
    assert action(ans) == f"{BW}/NotificationProducer/SubscribeResponse"
    ans = _register(wsn)  # the helper sends the RegisterPublisher URI; now the derived one
    ans = wsn.post(
        wsn.broker,
        f'<wsn-br:RegisterPublisher><wsn-br:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">'
        "tns:reg</wsn-br:Topic></wsn-br:RegisterPublisher>",
        action=f"{BRW}/NotificationBroker/RegisterPublisherRequest",
    )
    ans.ok()
    assert action(ans) == f"{BRW}/RegisterPublisher/RegisterPublisherResponse"
    notify = (
        "<wsnt:Notify><wsnt:NotificationMessage>"
        f'<wsnt:Topic xmlns:tns="{wsn.ns}" Dialect="{SIMPLE}">tns:myTopic</wsnt:Topic>'
        "<wsnt:Message><alias/></wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>"
    )
    data = _env(notify, action=f"{BRW}/NotificationBroker/Notify")
    assert wsn.http.post(wsn.broker, data=data, headers={"Content-Type": _CT}).status_code in (
        200,
        202,
    )
    assert len(consumer.wait_for_messages(1)) == 1
    _, pp = wsn.create_pull_point()
    data = _env(notify, action=f"{BW}/PullPoint/Notify")
    assert wsn.http.post(pp, data=data, headers={"Content-Type": _CT}).status_code in (200, 202)


_CT = "application/soap+xml; charset=utf-8"


def _env(body: str, action: str | None = None) -> bytes:
    from tests.support.soap import envelope

    return envelope(body, action=action)
