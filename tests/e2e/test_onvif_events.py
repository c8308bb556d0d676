"""The ONVIF event service (/onvif/event_service) of a running gateway.

An independent ONVIF client, onvif-zeep-async (the library of Home Assistant's ONVIF
integration), does what such clients do against the gateway on the embedded middleware and
on Kafka: GetServiceCapabilities, GetEventProperties, CreatePullPointSubscription, a
PullMessages loop, SetSynchronizationPoint, Renew, Unsubscribe.  Raw envelopes check the
PullMessages semantics (Timeout, MessageLimit, long polls that hold no worker thread), the
ConcreteSet filter, WS-N Subscribe for push, and the faults.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import onvif
import pytest
import requests
from lxml import etree
from onvif import ONVIFService

from tests.fixtures.server import (
    ConsumerServer,
    RunningServer,
    free_port,
    kafka_gateway_url,
    mqtt_gateway_url,
    serving,
)
from tests.support.tls import Certificates, TlsGateway
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e]

TEV = "http://www.onvif.org/ver10/events/wsdl"
TNS1 = "http://www.onvif.org/ver10/topics"
TT = "http://www.onvif.org/ver10/schema"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSA = "http://www.w3.org/2005/08/addressing"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSRF_R = "http://docs.oasis-open.org/wsrf/r-2"
CONCRETE_SET = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"
NS = {"tev": TEV, "wsnt": WSNT, "wsa": WSA, "s": SOAP12, "tt": TT, "tns1": TNS1}
MOTION = "tns1:RuleEngine/CellMotionDetector/Motion"
WSDL = str(Path(onvif.__file__).parent / "wsdl" / "events.wsdl")
HEADERS = {"Content-Type": "application/soap+xml; charset=utf-8"}
#: the gateway's request threads: fewer than the long polls of the thread test
THREADS = 2


def motion(value: str) -> str:
    return (
        f'<tt:Message xmlns:tt="{TT}" PropertyOperation="Changed"><tt:Data>'
        f'<tt:SimpleItem Name="IsMotion" Value="{value}"/></tt:Data></tt:Message>'
    )


@pytest.fixture(
    scope="module",
    params=[
        "embedded",
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("mqtt", marks=pytest.mark.mqtt),
    ],
)
def gateway(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A gateway of this module with few request threads, per middleware; on MQTT with
    ONVIF's topics under the native prefix ``onvif`` (as docs/onvif.md shows)."""
    name: str = request.param
    data_dir = Path(tempfile.mkdtemp(prefix=f"wsnmom-onvif-{name}-"))
    env = {"WSNMOM_THREADS": str(THREADS)}
    if name in ("kafka", "mqtt"):
        if name == "kafka":
            url = kafka_gateway_url(str(request.getfixturevalue("kafka_url")))
        else:
            url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
        config = data_dir / "wsnmom.toml"
        config.write_text(f'[adapter_options]\nnamespaces = {{ "{TNS1}" = "onvif" }}\n')
        env["WSNMOM_CONFIG"] = str(config)
    else:
        url = f"embedded://{data_dir / 'middleware'}"
    server = RunningServer(name, url, data_dir, extra_env=env)
    with serving(server):
        yield server


def notify(gateway: RunningServer, payload: str, topic: str = MOTION) -> None:
    with gateway.client(namespaces={"tns1": TNS1}) as wsn:
        wsn.notify(payload, topic)


def post(
    address: str,
    body: str,
    header: str = "",
    timeout: float = 30.0,
    http: Any = requests,
    **kw: Any,
) -> requests.Response:
    """POST a SOAP 1.2 envelope (``http``: a ``requests.Session`` to keep its connection)."""
    envelope = (
        f'<s:Envelope xmlns:s="{SOAP12}" xmlns:tev="{TEV}" xmlns:wsnt="{WSNT}" '
        f'xmlns:wsa="{WSA}" xmlns:tns1="{TNS1}"><s:Header>{header}</s:Header>'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )
    return http.post(address, data=envelope.encode(), headers=HEADERS, timeout=timeout, **kw)


def body_of(response: requests.Response) -> etree._Element:
    envelope = etree.fromstring(response.content)
    found = envelope.find("s:Body", NS)
    assert found is not None and len(found), response.text
    return found[0]


def create(gateway: RunningServer, filter_xml: str = "", itt: str = "PT60S", **kw: Any) -> str:
    """A pull-point subscription made with a raw envelope; its address."""
    r = post(
        f"{gateway.base_url}/onvif/event_service",
        f"<tev:CreatePullPointSubscription>{filter_xml}"
        f"<tev:InitialTerminationTime>{itt}</tev:InitialTerminationTime>"
        "</tev:CreatePullPointSubscription>",
        **kw,
    )
    assert r.status_code == 200, r.text
    return str(body_of(r).findtext("tev:SubscriptionReference/wsa:Address", namespaces=NS))


def pull(address: str, wait: str = "PT0S", limit: int = 10, **kw: Any) -> requests.Response:
    return post(
        address,
        f"<tev:PullMessages><tev:Timeout>{wait}</tev:Timeout>"
        f"<tev:MessageLimit>{limit}</tev:MessageLimit></tev:PullMessages>",
        **kw,
    )


def topics(response: requests.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [
        (t.text or "").strip()
        for t in body_of(response).findall("wsnt:NotificationMessage/wsnt:Topic", NS)
    ]


def fault_detail(response: requests.Response) -> etree._Element:
    assert response.status_code >= 400, response.text
    detail = etree.fromstring(response.content).find("s:Body/s:Fault/s:Detail", NS)
    assert detail is not None and len(detail), response.text
    return detail[0]


def item_value(message: Any) -> str:
    """The value of an event's first SimpleItem, as the client parsed it."""
    return str(message.Message._value_1.Data.SimpleItem[0].Value)


# --- an ONVIF client ------------------------------------------------------------------------
async def _client_session(gateway: RunningServer) -> None:
    events = ONVIFService(
        f"{gateway.base_url}/onvif/event_service",
        "user",
        "password",
        WSDL,
        binding_name=f"{{{TEV}}}EventBinding",
    )
    await events.setup()
    services: list[ONVIFService] = [events]
    try:
        capabilities = await events.GetServiceCapabilities()
        assert capabilities.WSPullPointSupport is False
        notify(gateway, motion("true"))  # the topic exists, and has a current message
        props = await events.GetEventProperties()
        assert CONCRETE_SET in props.TopicExpressionDialect
        rule_engine = [e for e in props.TopicSet._value_1 if e.tag == f"{{{TNS1}}}RuleEngine"]
        assert rule_engine, props.TopicSet
        assert rule_engine[0].find("tns1:CellMotionDetector/tns1:Motion", NS) is not None

        created = await events.CreatePullPointSubscription({"InitialTerminationTime": "PT60S"})
        address = created.SubscriptionReference.Address._value_1
        assert "/onvif/subscriptions/" in address
        pull_point = ONVIFService(
            address, "user", "password", WSDL, binding_name=f"{{{TEV}}}PullPointSubscriptionBinding"
        )
        manager = ONVIFService(
            address, "user", "password", WSDL, binding_name=f"{{{TEV}}}SubscriptionManagerBinding"
        )
        for service in (pull_point, manager):
            await service.setup()
            services.append(service)

        notify(gateway, motion("false"))
        seen: list[Any] = []
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:  # the client's PullMessages loop
            answer = await pull_point.PullMessages({"Timeout": "PT5S", "MessageLimit": 10})
            assert answer.CurrentTime is not None and answer.TerminationTime is not None
            seen += answer.NotificationMessage
        assert [m.Topic._value_1 for m in seen] == [MOTION]
        assert item_value(seen[0]) == "false"
        assert seen[0].SubscriptionReference.Address._value_1 == address

        # SetSynchronizationPoint: the topic's current message comes again
        await pull_point.SetSynchronizationPoint()
        synced = await pull_point.PullMessages({"Timeout": "PT10S", "MessageLimit": 10})
        values = [item_value(m) for m in synced.NotificationMessage if m.Topic._value_1 == MOTION]
        assert values == ["false"]

        renewed = await manager.Renew({"TerminationTime": "PT300S"})
        assert renewed.TerminationTime > created.TerminationTime
        await manager.Unsubscribe()
        with pytest.raises(Exception, match="no subscription"):
            await pull_point.PullMessages({"Timeout": "PT1S", "MessageLimit": 10})
    finally:
        for service in services:
            await service.close()


def test_an_onvif_client_reads_events(gateway: RunningServer) -> None:
    asyncio.run(_client_session(gateway))


# --- PullMessages semantics -----------------------------------------------------------------
def test_pull_messages_answers_empty_when_the_timeout_passes(gateway: RunningServer) -> None:
    address = create(gateway)
    started = time.monotonic()
    response = pull(address, "PT1S")
    assert topics(response) == []
    assert time.monotonic() - started >= 1.0
    assert body_of(response).findtext("tev:TerminationTime", namespaces=NS)


def test_pull_messages_answers_when_a_message_arrives(gateway: RunningServer) -> None:
    address = create(gateway)
    answers: list[requests.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(pull(address, "PT60S")))
    started = time.monotonic()
    waiting.start()
    notify(gateway, motion("true"))
    waiting.join(70)
    assert topics(answers[0]) == [MOTION]
    assert time.monotonic() - started < 60  # answered by the message, not by the timeout


def test_message_limit_bounds_one_answer(gateway: RunningServer) -> None:
    address = create(gateway)
    for value in ("1", "2", "3"):
        notify(gateway, motion(value))
    got: list[str] = []
    first = pull(address, "PT10S", limit=2)
    assert 1 <= len(topics(first)) <= 2
    got += topics(first)
    wait_until(lambda: got.extend(topics(pull(address, "PT1S", limit=2))) or len(got) >= 3)
    assert got == [MOTION] * 3


def pulls_received(gateway: RunningServer, **kw: Any) -> float:
    """PullMessages requests the gateway has received (its request metric)."""
    text = requests.get(f"{gateway.base_url}/metrics", timeout=10, **kw).text
    found = re.search(r'wsnmom_requests_total\{operation="onvif:PullMessages"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_waiting_pulls_hold_no_request_thread(gateway: RunningServer) -> None:
    """Three times as many long polls as the gateway has request threads wait at once, and
    the gateway still answers other requests; one notification answers them all."""
    _many_waiting_pulls(gateway)


def _many_waiting_pulls(gateway: RunningServer, **kw: Any) -> None:
    count = 3 * THREADS
    addresses = [create(gateway, **kw) for _ in range(count)]
    answers: dict[str, requests.Response] = {}
    #: one connection per long poll, kept alive after its answer
    sessions = {a: requests.Session() for a in addresses}
    threads = [
        threading.Thread(
            target=lambda a=a: answers.__setitem__(
                a, pull(a, "PT60S", timeout=90, http=sessions[a], **kw)
            )
        )
        for a in addresses
    ]
    for thread in threads:
        thread.start()

    wait_until(lambda: pulls_received(gateway, **kw) >= count, 30, what="the long polls to arrive")
    r = post(
        f"{gateway.base_url}/onvif/event_service", "<tev:GetEventProperties/>", timeout=20, **kw
    )
    assert r.status_code == 200
    assert all(t.is_alive() for t in threads)  # answered while every long poll still waits
    publish(gateway, motion("true"), **kw)
    for thread in threads:
        thread.join(70)
    assert {a: topics(answers[a]) for a in addresses} == {a: [MOTION] for a in addresses}
    # the connections of the answered long polls are kept, and serve their next request
    assert [answers[a].headers.get("Connection", "keep-alive").lower() for a in addresses] == [
        "keep-alive"
    ] * count
    assert [topics(pull(a, "PT0S", http=sessions[a], **kw)) for a in addresses] == [[]] * count
    for session in sessions.values():
        session.close()


def publish(gateway: RunningServer, payload: str, **kw: Any) -> None:
    """Notify with a raw envelope (``kw``: the requests options, ``verify`` for HTTPS)."""
    r = requests.post(
        gateway.broker_url,
        data=(
            f'<s:Envelope xmlns:s="{SOAP12}" xmlns:wsnt="{WSNT}" xmlns:tns1="{TNS1}"><s:Body>'
            "<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect="
            f'"http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete">{MOTION}</wsnt:Topic>'
            f"<wsnt:Message>{payload}</wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>"
            "</s:Body></s:Envelope>"
        ).encode(),
        headers=HEADERS,
        timeout=30,
        **kw,
    )
    assert r.status_code == 202, r.text


def test_waiting_pulls_hold_no_request_thread_over_https() -> None:
    """Over HTTPS (cheroot, ``wsnmom.tls_parking``) as over HTTP: three times as many long
    polls as request threads wait, another request is answered meanwhile, and each
    connection serves its next request after its answer."""
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-onvif-https-"))
    certs = Certificates(data_dir)
    server = TlsGateway(
        "embedded",
        f"embedded://{data_dir / 'mw'}",
        data_dir,
        free_port(),
        extra_env={"WSNMOM_THREADS": str(THREADS)},
        certs=certs,
        mutual=False,
    )
    server.start()
    try:
        _many_waiting_pulls(server, verify=certs.path("ca"))
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_concrete_set_filter_selects_topics(gateway: RunningServer) -> None:
    address = create(
        gateway,
        f'<tev:Filter><wsnt:TopicExpression Dialect="{CONCRETE_SET}">'
        "tns1:RuleEngine//.|tns1:VideoSource/MotionAlarm</wsnt:TopicExpression></tev:Filter>",
    )
    notify(gateway, "<other/>", "tns1:Device/Trigger/DigitalInput")
    notify(gateway, "<alarm/>", "tns1:VideoSource/MotionAlarm")
    notify(gateway, motion("true"))
    # the two selected topics are the sentinels: the unselected one was published before
    # them (on Kafka topics have no order among themselves, so only their set is compared)
    got: list[str] = []
    wanted = {"tns1:VideoSource/MotionAlarm", MOTION}
    wait_until(lambda: got.extend(topics(pull(address, "PT2S"))) or wanted <= set(got), 30)
    assert sorted(got) == sorted(wanted)


def test_pull_point_subscription_addressed_by_wsa_to(gateway: RunningServer) -> None:
    address = create(gateway)
    notify(gateway, motion("true"))
    to = f"<wsa:To>{address}</wsa:To>"
    got: list[str] = []
    service = f"{gateway.base_url}/onvif/event_service"
    wait_until(lambda: got.extend(topics(pull(service, "PT2S", header=to))) or got, 30)
    assert got == [MOTION]


def test_ws_n_subscribe_for_push(gateway: RunningServer) -> None:
    consumer = ConsumerServer()
    try:
        r = post(
            f"{gateway.base_url}/onvif/event_service",
            "<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>"
            f"{consumer.address()}</wsa:Address></wsnt:ConsumerReference>"
            f'<wsnt:Filter><wsnt:TopicExpression Dialect="{CONCRETE_SET}">tns1:RuleEngine//.'
            "</wsnt:TopicExpression></wsnt:Filter></wsnt:Subscribe>",
        )
        assert r.status_code == 200, r.text
        reference = body_of(r).findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NS)
        assert reference and "/wsn/subscriptions/" in reference
        notify(gateway, motion("true"))
        messages = wait_until(lambda: consumer.messages_for(reference), 30)
        assert [m.findtext("wsnt:Topic", namespaces=NS) for m in messages] == [MOTION]
        assert post(reference, "<wsnt:Unsubscribe/>").status_code == 200
    finally:
        consumer.close()


# --- faults ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("timeout", "limit"), [("PT2H", 10), ("PT1S", 0), ("PT1S", 100000)], ids=str
)
def test_pull_beyond_the_maxima_is_a_pull_messages_fault(
    gateway: RunningServer, timeout: str, limit: int
) -> None:
    address = create(gateway)
    detail = fault_detail(pull(address, timeout, limit))
    assert detail.tag == f"{{{TEV}}}PullMessagesFaultResponse"
    assert detail.findtext("tev:MaxTimeout", namespaces=NS) == "PT10M"
    assert int(detail.findtext("tev:MaxMessageLimit", namespaces=NS) or 0) >= 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            "<tev:PullMessages><tev:Timeout>soon</tev:Timeout><tev:MessageLimit>1</tev:MessageLimit>"
            "</tev:PullMessages>",
            "xs:duration",
        ),
        ("<tev:PullMessages><tev:Timeout>PT1S</tev:Timeout></tev:PullMessages>", "MessageLimit"),
        (
            "<tev:PullMessages><tev:Timeout>PT1S</tev:Timeout><tev:MessageLimit>x</tev:MessageLimit>"
            "</tev:PullMessages>",
            "xs:int",
        ),
        ("<tev:GetEventProperties/>", "not an operation of a pull-point subscription"),
    ],
    ids=["bad-timeout", "no-limit", "bad-limit", "service-operation"],
)
def test_bad_requests_to_a_subscription_are_faults(
    gateway: RunningServer, body: str, says: str
) -> None:
    address = create(gateway)
    r = post(address, body)
    assert r.status_code == 500 and says in r.text, r.text
    assert "Sender" in r.text


def test_unknown_subscription_is_resource_unknown(gateway: RunningServer) -> None:
    detail = fault_detail(pull(f"{gateway.base_url}/onvif/subscriptions/nope", "PT1S"))
    assert detail.tag == f"{{{WSRF_R}}}ResourceUnknownFault"


def test_a_push_subscription_is_no_pull_point_subscription(gateway: RunningServer) -> None:
    consumer = ConsumerServer()
    try:
        r = post(
            f"{gateway.base_url}/wsn/broker",
            "<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>"
            f"{consumer.address()}</wsa:Address></wsnt:ConsumerReference></wsnt:Subscribe>",
        )
        sid = str(body_of(r).findtext("wsnt:SubscriptionReference/wsa:Address", namespaces=NS))
        sid = sid.rsplit("/", 1)[1]
        r = pull(f"{gateway.base_url}/onvif/subscriptions/{sid}", "PT1S")
        assert fault_detail(r).tag == f"{{{WSRF_R}}}ResourceUnknownFault"
        assert "not a pull-point subscription" in r.text
    finally:
        consumer.close()


def pull_point_ids(gateway: RunningServer) -> set[str]:
    answer = requests.get(f"{gateway.base_url}/wsn/admin/api/pullpoints", timeout=10)
    answer.raise_for_status()
    return {p["id"] for p in answer.json()["pull_points"]}


def test_bad_creations_are_faults(gateway: RunningServer) -> None:
    service = f"{gateway.base_url}/onvif/event_service"
    before = pull_point_ids(gateway)
    r = post(
        service,
        "<tev:CreatePullPointSubscription><tev:InitialTerminationTime>never"
        "</tev:InitialTerminationTime></tev:CreatePullPointSubscription>",
    )
    assert fault_detail(r).tag == f"{{{WSNT}}}UnacceptableInitialTerminationTimeFault"
    r = post(
        service,
        '<tev:CreatePullPointSubscription><tev:Filter><wsnt:TopicExpression Dialect="urn:no">'
        "tns1:A</wsnt:TopicExpression></tev:Filter></tev:CreatePullPointSubscription>",
    )
    assert fault_detail(r).tag == f"{{{WSNT}}}TopicExpressionDialectUnknownFault"
    r = post(
        service,
        "<tev:CreatePullPointSubscription><tev:SubscriptionPolicy>"
        f'<tt:ChangedOnly xmlns:tt="{TT}">true</tt:ChangedOnly>'
        "</tev:SubscriptionPolicy></tev:CreatePullPointSubscription>",
    )
    assert fault_detail(r).tag == f"{{{WSNT}}}UnrecognizedPolicyRequestFault"
    assert pull_point_ids(gateway) <= before  # the pull points made first are gone again
    r = pull(service, "PT1S")  # a subscription's operation, no subscription addressed
    assert r.status_code == 500 and "not an operation of the ONVIF event service" in r.text
    r = requests.get(service, timeout=10)
    assert r.status_code == 405


def values(response: requests.Response) -> list[str]:
    """The IsMotion values of an answer's events."""
    return [
        str(item.get("Value"))
        for item in body_of(response).findall(
            "wsnt:NotificationMessage/wsnt:Message/tt:Message/tt:Data/tt:SimpleItem", NS
        )
    ]


def test_native_events_reach_an_onvif_client(
    gateway: RunningServer, request: pytest.FixtureRequest
) -> None:
    """docs/onvif.md's example: with ONVIF's namespace under the native prefix ``onvif``, a
    plain MQTT publisher's message on ``onvif/RuleEngine/...`` (a Kafka producer's record on
    ``onvif.RuleEngine....``) is ``tns1:RuleEngine/...`` to an ONVIF client."""
    if gateway.adapter == "embedded":
        pytest.skip("the embedded middleware has no native publishers")
    address = create(gateway)
    prefix = parse_qs(urlsplit(gateway.adapter_url).query)["topic_prefix"][0]
    if gateway.adapter == "mqtt":
        expected = ["native"]
        publisher = request.getfixturevalue("mqtt_publisher")
        native = f"{prefix}/onvif/RuleEngine/CellMotionDetector/Motion"
        publisher.publish(native, motion("native").encode())
    else:
        from confluent_kafka import Producer

        expected = ["gateway", "native"]
        notify(gateway, motion("gateway"))  # the Kafka topic exists from here on
        producer = Producer({"bootstrap.servers": request.getfixturevalue("kafka_bootstrap")})
        producer.produce(f"{prefix}.onvif.RuleEngine.CellMotionDetector.Motion", motion("native"))
        assert producer.flush(30) == 0
    got: list[requests.Response] = []
    wait_until(
        lambda: (
            got.append(pull(address, "PT2S")) or sum(len(values(r)) for r in got) >= len(expected)
        ),
        60,
    )
    assert [t for r in got for t in topics(r)] == [MOTION] * len(expected)
    assert [v for r in got for v in values(r)] == expected


def test_a_long_poll_outlives_the_connection_deadlines() -> None:
    """A parked PullMessages waits longer than every connection deadline of the gateway's
    connection guard (1 s here) and still gets its answer.  (waitress's own channel
    cleanup, every 30 s, skips a connection whose request is queued, as a parked one is.)"""
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-onvif-deadlines-"))
    env = {
        "WSNMOM_CONNECTIONS__HEADER_TIMEOUT": "1",
        "WSNMOM_CONNECTIONS__BODY_TIMEOUT": "1",
        "WSNMOM_CONNECTIONS__IDLE_TIMEOUT": "1",
    }
    server = RunningServer("embedded", f"embedded://{data_dir / 'mw'}", data_dir, extra_env=env)
    server.start()
    try:
        address = create(server)
        started = time.monotonic()
        response = pull(address, "PT4S")
        assert topics(response) == []
        assert time.monotonic() - started >= 4.0
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


# --- with authentication --------------------------------------------------------------------
@pytest.fixture(scope="module")
def secured() -> Iterator[RunningServer]:
    """An embedded gateway that authenticates: ONVIF clients with UsernameToken digests
    (``wsse_password``), a publisher with HTTP basic."""
    from wsnmom.soap_frontend.passwords import hash_password

    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-onvif-auth-"))
    users = data_dir / "users.toml"
    users.write_text(
        '[users.camera]\nwsse_password = "camera-pw"\n\n'
        '[users.other]\nwsse_password = "other-pw"\n\n'
        f'[users.publisher]\npassword = "{hash_password("pub-pw", n=2**4)}"\n'
    )
    users.chmod(0o600)
    env = {
        "WSNMOM_THREADS": str(THREADS),
        "WSNMOM_AUTH__USERS_FILE": str(users),
        "WSNMOM_AUTH__ADMIN_TOKEN": "admin-" + uuid.uuid4().hex,
    }
    server = RunningServer("embedded", f"embedded://{data_dir / 'mw'}", data_dir, extra_env=env)
    with serving(server):
        yield server


def notify_as_publisher(gateway: RunningServer, payload: str, topic: str = MOTION) -> None:
    r = requests.post(
        gateway.broker_url,
        data=(
            f'<s:Envelope xmlns:s="{SOAP12}" xmlns:wsnt="{WSNT}" xmlns:tns1="{TNS1}"><s:Body>'
            "<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect="
            f'"http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete">{topic}</wsnt:Topic>'
            f"<wsnt:Message>{payload}</wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>"
            "</s:Body></s:Envelope>"
        ).encode(),
        headers=HEADERS,
        auth=("publisher", "pub-pw"),
        timeout=30,
    )
    assert r.status_code == 202, r.text


def onvif_service(address: str, user: str, password: str, binding: str) -> ONVIFService:
    return ONVIFService(address, user, password, WSDL, binding_name=f"{{{TEV}}}{binding}")


async def _secured_session(gateway: RunningServer) -> None:
    events = onvif_service(
        f"{gateway.base_url}/onvif/event_service", "camera", "camera-pw", "EventBinding"
    )
    await events.setup()
    services = [events]
    try:
        created = await events.CreatePullPointSubscription({"InitialTerminationTime": "PT60S"})
        address = created.SubscriptionReference.Address._value_1
        pull_point = onvif_service(address, "camera", "camera-pw", "PullPointSubscriptionBinding")
        stranger = onvif_service(address, "other", "other-pw", "PullPointSubscriptionBinding")
        impostor = onvif_service(address, "camera", "wrong-pw", "PullPointSubscriptionBinding")
        for service in (pull_point, stranger, impostor):
            await service.setup()
            services.append(service)
        # a parked long poll: answered on the poller's thread, as its caller
        before = pulls_received(gateway)
        waiting = asyncio.ensure_future(
            pull_point.PullMessages({"Timeout": "PT30S", "MessageLimit": 10})
        )
        deadline = time.monotonic() + 30
        while pulls_received(gateway) <= before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(notify_as_publisher, gateway, motion("true"))
        answer = await waiting
        assert [m.Topic._value_1 for m in answer.NotificationMessage] == [MOTION]
        # another identity's subscription does not exist for it; a wrong password is a
        # wsse:FailedAuthentication fault
        with pytest.raises(Exception, match="no subscription"):
            await stranger.PullMessages({"Timeout": "PT0S", "MessageLimit": 10})
        with pytest.raises(Exception, match="could not be authenticated"):
            await impostor.PullMessages({"Timeout": "PT0S", "MessageLimit": 10})
    finally:
        for service in services:
            await service.close()


def test_onvif_clients_authenticate_with_username_token_digests(secured: RunningServer) -> None:
    asyncio.run(_secured_session(secured))
