"""The Flask app against an in-memory fake BrokerService: dispatch, resource resolution,
faults, metadata endpoints, and zeep driving our WSDL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from lxml import etree
from werkzeug.serving import make_server
from wsnmom.core.config import Settings
from wsnmom.soap_frontend import create_app

from tests.soap_frontend.fake_service import FakeService
from tests.support.soap import (
    NS,
    SIMPLE,
    WSNT,
    content_type,
    envelope,
    epr_address,
    fault_name,
    notify_body,
    resource_id,
    subscribe_body,
)
from tests.support.threads import serve
from tests.support.wsn_schemas import assert_body_valid


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def app(service: FakeService) -> Flask:
    # listening on every interface (anonymous clients allowed): WSDL addresses follow the
    # request's host
    settings = Settings(max_request_bytes=64 * 1024, host="0.0.0.0")
    settings.auth.required = "false"
    return create_app(service, settings)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def post(
    client: FlaskClient, path: str, body: str, *, version: str = "1.2", **kw: Any
) -> tuple[int, bytes]:
    resp = client.post(
        path, data=envelope(body, version=version, **kw), content_type=content_type(version)
    )
    return resp.status_code, resp.data


def subscribe(client: FlaskClient, **kw: Any) -> etree._Element:
    status, data = post(client, "/wsn/broker", subscribe_body("http://consumer/x", **kw))
    assert status == 200, data
    return assert_body_valid(data)


# --- dispatch and responses ---------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_subscribe_answers_in_request_version(client: FlaskClient, version: str) -> None:
    status, data = post(
        client, "/wsn/broker", subscribe_body("http://c"), version=version, message_id="urn:uuid:42"
    )
    assert status == 200
    env = etree.fromstring(data)
    expected = NS["s12"] if version == "1.2" else NS["s11"]
    assert env.tag == f"{{{expected}}}Envelope"
    assert env.findtext("{*}Header/wsa:RelatesTo", namespaces=NS) == "urn:uuid:42"
    assert env.findtext("{*}Header/wsa:Action", namespaces=NS).endswith("SubscribeResponse")
    resp = assert_body_valid(data)
    ref = resp.find("wsnt:SubscriptionReference", NS)
    assert ref is not None
    assert epr_address(ref).endswith("/wsn/subscriptions/" + resource_id(ref))
    assert resp.find("wsnt:CurrentTime", NS) is not None
    assert resp.find("wsnt:TerminationTime", NS) is not None


def test_no_action_header_is_tolerated(client: FlaskClient) -> None:
    status, _ = post(client, "/wsn/broker", subscribe_body("http://c"), action="urn:wrong")
    assert status == 200


def test_full_subscription_lifecycle(client: FlaskClient, service: FakeService) -> None:
    ref = subscribe(client).find("wsnt:SubscriptionReference", NS)
    path = "/wsn/subscriptions/" + resource_id(ref)  # type: ignore[arg-type]
    renew = "<wsnt:Renew><wsnt:TerminationTime>PT2H</wsnt:TerminationTime></wsnt:Renew>"
    status, data = post(client, path, renew)
    assert status == 200
    assert assert_body_valid(data).tag == f"{{{WSNT}}}RenewResponse"
    for op, resp in (
        ("PauseSubscription", "PauseSubscriptionResponse"),
        ("ResumeSubscription", "ResumeSubscriptionResponse"),
        ("Unsubscribe", "UnsubscribeResponse"),
    ):
        status, data = post(client, path, f"<wsnt:{op}/>")
        assert status == 200, data
        assert assert_body_valid(data).tag == f"{{{WSNT}}}{resp}"
    status, data = post(client, path, "<wsnt:Unsubscribe/>")
    assert status == 500 and fault_name(data) == "ResourceUnknownFault"
    assert_body_valid(data)


def test_renew_faults(client: FlaskClient) -> None:
    ref = subscribe(client).find("wsnt:SubscriptionReference", NS)
    path = "/wsn/subscriptions/" + resource_id(ref)  # type: ignore[arg-type]
    for value in ("gibberish", "P100Y", "2001-01-01T00:00:00Z"):
        status, data = post(
            client,
            path,
            f"<wsnt:Renew><wsnt:TerminationTime>{value}</wsnt:TerminationTime></wsnt:Renew>",
        )
        assert status == 500 and fault_name(data) == "UnacceptableTerminationTimeFault"
        assert_body_valid(data)


def test_resource_found_by_reference_parameter_or_to(client: FlaskClient) -> None:
    ref = subscribe(client).find("wsnt:SubscriptionReference", NS)
    sid = resource_id(ref)  # type: ignore[arg-type]
    header = (
        '<wsnmom:ResourceId xmlns:wsnmom="urn:wsnmom:ns:1" wsa:IsReferenceParameter="true">'
        f"{sid}</wsnmom:ResourceId>"
    )
    status, _ = post(client, "/wsn/broker", "<wsnt:PauseSubscription/>", headers=header)
    assert status == 200
    status, _ = post(
        client,
        "/wsn/broker",
        "<wsnt:ResumeSubscription/>",
        to=epr_address(ref),  # type: ignore[arg-type]
    )
    assert status == 200
    # wrong endpoint, nothing to resolve → ResourceUnknownFault
    status, data = post(client, "/wsn/broker", "<wsnt:Unsubscribe/>")
    assert status == 500 and fault_name(data) == "ResourceUnknownFault"


def test_notify_is_one_way(client: FlaskClient, service: FakeService) -> None:
    body = notify_body(("tns:a", "<x/>"), ("tns:b", '<y xmlns="urn:y"/>'))
    resp = client.post("/wsn/broker", data=envelope(body), content_type=content_type())
    assert resp.status_code == 202 and resp.data == b""
    assert len(service.notified) == 2


def test_malformed_notify_is_a_sender_fault(client: FlaskClient) -> None:
    status, data = post(client, "/wsn/broker", "<wsnt:Notify/>")
    assert status == 500 and fault_name(data) == "BaseFault"
    assert etree.fromstring(data).findtext(".//{*}Code/{*}Value") == "s:Sender"


def test_pull_point_flow(client: FlaskClient) -> None:
    status, data = post(
        client, "/wsn/broker", '<wsnt:CreatePullPoint wsnt:pullPointQueueName="q1"/>'
    )
    assert status == 200
    pp = assert_body_valid(data).find("wsnt:PullPoint", NS)
    path = "/wsn/pullpoints/" + resource_id(pp)  # type: ignore[arg-type]
    resp = client.post(
        path,
        data=envelope(notify_body(("tns:a", "<x>1</x>"), ("tns:a", "<x>2</x>"))),
        content_type=content_type(),
    )
    assert resp.status_code == 202
    status, data = post(
        client,
        path,
        "<wsnt:GetMessages><wsnt:MaximumNumber>1</wsnt:MaximumNumber></wsnt:GetMessages>",
    )
    msgs = assert_body_valid(data).findall("wsnt:NotificationMessage", NS)
    assert len(msgs) == 1 and msgs[0].findtext("wsnt:Message/x", namespaces=NS) == "1"
    status, data = post(client, path, "<wsnt:GetMessages/>")
    assert len(assert_body_valid(data).findall("wsnt:NotificationMessage", NS)) == 1
    status, data = post(
        client,
        path,
        "<wsnt:GetMessages><wsnt:MaximumNumber>x</wsnt:MaximumNumber></wsnt:GetMessages>",
    )
    assert fault_name(data) == "UnableToGetMessagesFault"
    status, data = post(
        client,
        path,
        "<wsrf-rp:GetResourceProperty>wsnmom:Name</wsrf-rp:GetResourceProperty>".replace(
            "<wsrf-rp:GetResourceProperty>",
            '<wsrf-rp:GetResourceProperty xmlns:wsnmom="urn:wsnmom:ns:1">',
        ),
    )
    assert status == 200 and b"q1" in data
    status, data = post(client, path, "<wsnt:DestroyPullPoint/>")
    assert status == 200 and assert_body_valid(data).tag == f"{{{WSNT}}}DestroyPullPointResponse"
    status, data = post(client, path, "<wsnt:GetMessages/>")
    assert fault_name(data) == "ResourceUnknownFault"


def test_register_publisher_and_destroy(client: FlaskClient) -> None:
    body = (
        "<wsn-br:RegisterPublisher><wsn-br:PublisherReference><wsa:Address>http://p</wsa:Address>"
        f'</wsn-br:PublisherReference><wsn-br:Topic xmlns:t="urn:t" Dialect="{SIMPLE}">t:a'
        "</wsn-br:Topic></wsn-br:RegisterPublisher>"
    )
    status, data = post(client, "/wsn/broker", body)
    assert status == 200
    resp = assert_body_valid(data)
    reg = resp.find("wsn-br:PublisherRegistrationReference", NS)
    consumer = resp.find("wsn-br:ConsumerReference", NS)
    assert consumer is not None and epr_address(consumer).endswith("/wsn/broker")
    path = "/wsn/registrations/" + resource_id(reg)  # type: ignore[arg-type]
    status, data = post(
        client, path, "<wsrf-rp:GetResourceProperty>wsn-br:Demand</wsrf-rp:GetResourceProperty>"
    )
    assert (
        status == 200
        and assert_body_valid(data).findtext("wsn-br:Demand", namespaces=NS) == "false"
    )
    status, data = post(client, path, "<wsn-br:DestroyRegistration/>")
    assert status == 200 and assert_body_valid(data).tag.endswith("DestroyRegistrationResponse")
    status, data = post(client, path, "<wsn-br:DestroyRegistration/>")
    assert fault_name(data) == "ResourceUnknownFault"


def test_get_current_message(client: FlaskClient) -> None:
    gcm = (
        f'<wsnt:GetCurrentMessage><wsnt:Topic xmlns:tns="urn:test:topics" Dialect="{SIMPLE}">'
        "tns:a</wsnt:Topic></wsnt:GetCurrentMessage>"
    )
    _status, data = post(client, "/wsn/broker", gcm)
    assert fault_name(data) == "NoCurrentMessageOnTopicFault"
    client.post(
        "/wsn/broker",
        data=envelope(notify_body(("tns:a", '<p:x xmlns:p="urn:p">v</p:x>'))),
        content_type=content_type(),
    )
    _, data = post(client, "/wsn/broker", gcm)
    resp = assert_body_valid(data)
    assert resp[0].tag == "{urn:p}x"


def test_broker_resource_properties(client: FlaskClient) -> None:
    status, data = post(
        client,
        "/wsn/broker",
        "<wsrf-rp:GetResourceProperty>wsnt:TopicExpressionDialect</wsrf-rp:GetResourceProperty>",
    )
    assert status == 200
    assert [e.text for e in assert_body_valid(data)] == [
        SIMPLE,
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete",
    ]
    multi = (
        "<wsrf-rp:GetMultipleResourceProperties>"
        "<wsrf-rp:ResourceProperty>wsn-br:RequiresRegistration</wsrf-rp:ResourceProperty>"
        "<wsrf-rp:ResourceProperty>wsnt:FixedTopicSet</wsrf-rp:ResourceProperty>"
        "</wsrf-rp:GetMultipleResourceProperties>"
    )
    status, data = post(client, "/wsn/broker", multi)
    assert [etree.QName(e).localname for e in assert_body_valid(data)] == [
        "RequiresRegistration",
        "FixedTopicSet",
    ]
    status, data = post(
        client,
        "/wsn/broker",
        "<wsrf-rp:GetResourceProperty>wsnt:Nope</wsrf-rp:GetResourceProperty>",
    )
    assert fault_name(data) == "InvalidResourcePropertyQNameFault"
    status, data = post(client, "/wsn/broker", "<wsrf-rp:GetResourcePropertyDocument/>")
    assert status == 200 and b"NotificationBrokerRP" in data


def test_subscribe_faults_from_codec_and_service(client: FlaskClient) -> None:
    cases = [
        (subscribe_body("http://c", extra_filter='<x:F xmlns:x="urn:x"/>'), "InvalidFilterFault"),
        (
            subscribe_body("http://c", dialect="http://not.accepted/dialect.html"),
            "TopicExpressionDialectUnknownFault",
        ),
        (
            subscribe_body("http://c", itt="2001-01-01T00:00:00Z"),
            "UnacceptableInitialTerminationTimeFault",
        ),
        (subscribe_body("http://c", itt="P1000D"), "UnacceptableInitialTerminationTimeFault"),
        (
            subscribe_body("http://c", policy='<x:Q xmlns:x="urn:x"/>'),
            "UnrecognizedPolicyRequestFault",
        ),
        ("<wsnt:Subscribe/>", "SubscribeCreationFailedFault"),
    ]
    for body, expected in cases:
        status, data = post(client, "/wsn/broker", body)
        assert status == 500 and fault_name(data) == expected, data
        assert_body_valid(data)


def test_unknown_operation_and_wrong_endpoint(client: FlaskClient) -> None:
    status, data = post(client, "/wsn/broker", '<x:Frobnicate xmlns:x="urn:x"/>')
    assert status == 500 and fault_name(data) == "BaseFault"
    status, data = post(client, "/wsn/subscriptions/abc", subscribe_body("http://c"))
    assert status == 500 and fault_name(data) == "BaseFault"


def test_internal_error_is_generic(client: FlaskClient, service: FakeService) -> None:
    service.fail_with = RuntimeError("db password is hunter2")
    status, data = post(client, "/wsn/broker", subscribe_body("http://c"))
    assert status == 500 and b"hunter2" not in data
    assert etree.fromstring(data).findtext(".//{*}Code/{*}Value") == "s:Receiver"


# --- transport-level answers ----------------------------------------------------------------
def test_transport_statuses(client: FlaskClient) -> None:
    assert client.get("/wsn/broker").status_code == 405
    assert (
        client.post("/wsn/broker", data=b"{}", content_type="application/json").status_code == 415
    )
    assert client.post("/wsn/broker", data=b"nope", content_type="text/xml").status_code == 400
    big = envelope("<wsnt:Notify>" + "<x/>" * 20000 + "</wsnt:Notify>")
    assert client.post("/wsn/broker", data=big, content_type="text/xml").status_code == 413
    assert client.put("/wsn/broker", data=b"").status_code == 405


def test_metadata_endpoints(client: FlaskClient, service: FakeService) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    service.is_ready = False
    assert client.get("/readyz").status_code == 503
    post(client, "/wsn/broker", subscribe_body("http://c"))
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and b"wsnmom_requests" in metrics.data
    policy = client.get("/wsn/policy")
    assert etree.fromstring(policy.data).tag == "{urn:wsnmom:policy:1}BrokerPolicy"
    wsdl = client.get("/wsn/broker?wsdl")
    assert wsdl.status_code == 200
    doc = etree.fromstring(wsdl.data)
    names = doc.xpath(
        "//wsdl:portType/@name", namespaces={"wsdl": "http://schemas.xmlsoap.org/wsdl/"}
    )
    assert {
        "NotificationBroker",
        "PausableSubscriptionManager",
        "PullPoint",
        "CreatePullPoint",
        "RegisterPublisher",
        "PublisherRegistrationManager",
        "NotificationConsumer",
        "NotificationProducer",
        "SubscriptionManager",
        "ResourceProperties",
    } <= set(names)
    assert b"http://localhost/wsn/schemas/b-2.xsd" in wsdl.data
    assert b"FilterCombination" in wsdl.data
    assert client.get("/wsn/wsdl").data == wsdl.data
    assert client.get("/wsn/schemas/b-2.xsd").status_code == 200
    assert client.get("/wsn/schemas/passwd").status_code == 404


# --- zeep on our WSDL ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, FakeService]]:
    svc = FakeService()
    server = make_server("127.0.0.1", 0, create_app(svc), threaded=True)
    svc.base = f"http://127.0.0.1:{server.server_port}"
    serve(server)
    yield svc.base, svc
    server.shutdown()


@pytest.mark.parametrize("soap12", [False, True])
def test_zeep_drives_every_operation(live: tuple[str, FakeService], soap12: bool) -> None:
    import zeep
    from zeep.wsa import WsAddressingPlugin

    base, svc = live
    client = zeep.Client(f"{base}/wsn/broker?wsdl", plugins=[WsAddressingPlugin()])
    client.set_ns_prefix("tns", "urn:test:topics")  # the prefix of the topic texts
    suffix = "Soap12" if soap12 else "Soap11"
    tns = "urn:wsnmom:wsdl:1"
    broker = client.bind("NotificationBrokerService", f"NotificationBroker{suffix}Port")

    te = etree.fromstring(
        f'<wsnt:TopicExpression xmlns:wsnt="{WSNT}" xmlns:tns="urn:test:topics" '
        f'Dialect="{SIMPLE}">tns:zeepTopic</wsnt:TopicExpression>'
    )
    resp = broker.Subscribe(
        ConsumerReference={"Address": "http://consumer/zeep"},
        Filter={"_value_1": [te]},
        InitialTerminationTime="PT10M",
    )
    address = resp.SubscriptionReference.Address._value_1
    assert "/wsn/subscriptions/" in address and resp.TerminationTime is not None
    assert svc.calls[-1][1].topic.text == "tns:zeepTopic"
    manager = client.create_service(f"{{{tns}}}PausableSubscriptionManager{suffix}Binding", address)
    assert manager.Renew(TerminationTime="PT20M").TerminationTime is not None
    manager.PauseSubscription()
    manager.ResumeSubscription()
    manager.Unsubscribe()
    with pytest.raises(zeep.exceptions.Fault) as info:
        manager.Unsubscribe()
    assert etree.QName(info.value.detail[0]).localname == "ResourceUnknownFault"

    topic = {"_value_1": "tns:zeepTopic", "Dialect": SIMPLE}  # text: the served variant
    payload = etree.fromstring(b'<z:hello xmlns:z="urn:z">world</z:hello>')
    message = {"Topic": topic, "Message": {"_value_1": payload}}
    pp = broker.CreatePullPoint()
    pull = client.create_service(
        f"{{{tns}}}PullPoint{suffix}Binding", pp.PullPoint.Address._value_1
    )
    pull.Notify(NotificationMessage=[message])
    got = pull.GetMessages(MaximumNumber=5)
    assert len(got.NotificationMessage) == 1
    pulled_topic = got.NotificationMessage[0].Topic
    assert pulled_topic._value_1.endswith(":zeepTopic") and pulled_topic.Dialect == SIMPLE
    pull.DestroyPullPoint()

    broker.Notify(NotificationMessage=[message])
    assert any(b"hello" in m.payload for m in svc.notified)
    current = broker.GetCurrentMessage(Topic=topic)
    assert current is not None

    reg = broker.RegisterPublisher(PublisherReference={"Address": "http://publisher"}, Demand=False)
    reg_address = reg.PublisherRegistrationReference.Address._value_1
    registration = client.create_service(
        f"{{{tns}}}PublisherRegistrationManager{suffix}Binding", reg_address
    )
    registration.DestroyRegistration()

    dialects = broker.GetResourceProperty(etree.QName(WSNT, "TopicExpressionDialect"))
    assert dialects is not None
