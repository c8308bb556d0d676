"""WS-Notification 1.0 and 1.2-draft clients, with raw envelopes, on a real gateway (embedded
and MQTT middleware; SQLite and PostgreSQL stores): subscribe, notify (delivered in the
subscriber's own format), pause, resume, renew (WS-ResourceLifetime SetTerminationTime),
GetResourceProperty, destroy, the older faults, and the subscriber's format surviving a
restart of the gateway.

The 1.0 envelopes are the specification's own SOAP 1.2 examples (WS-Notification 1.0,
§7.1.1 Notify, §8.2.1 Subscribe, §9.2.1 PauseSubscription, §9.3.1 ResumeSubscription,
§8.3.1 GetCurrentMessage, §10.3.1 RegisterPublisher) with the example.org addresses
replaced by the gateway's and the test consumer's.  Guesses, where the examples cannot be
sent as printed:

- the Subscribe example's Precondition and Selector are dropped and replaced by a Selector
  that the example Notify's content satisfies (its ``ncex:Producer="15"`` selects nothing
  the Notify example sends), and its InitialTerminationTime (2003) is moved into the future;
- the example's stray ``</Precondition>`` (no prefix) is not reproduced;
- the ``wsrl`` prefix the Subscribe example uses undeclared is declared;
- WS-ResourceLifetime messages (Destroy, SetTerminationTime) are not printed in the 1.0
  text: they follow the WSRL shapes named in its WSDL (``wsrl:SetTerminationTime`` with
  ``wsrl:RequestedTerminationTime``, ``wsrl:Destroy``).

The 1.2-draft envelopes are the same exchanges in the OASIS 2004/06 namespaces with
WS-Addressing 2004/03 (``Subscribe`` with ``TopicExpression/@Dialect``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from lxml import etree

from tests.fixtures.postgres import fresh_database
from tests.fixtures.server import ConsumerServer, RunningServer, mqtt_gateway_url, serving
from tests.support.waiting import wait_until
from tests.support.wsdl_faults import declared

pytestmark = pytest.mark.e2e

S12 = "http://www.w3.org/2003/05/soap-envelope"
IBM = "http://www.ibm.com/xmlns/stdwip/web-services/"
DRAFT_WSN = "http://docs.oasis-open.org/wsn/2004/06/"
DRAFT_WSRF = "http://docs.oasis-open.org/wsrf/2004/06/"
NPEX = "http://www.producer.org/RefProp"
NCEX = "http://www.consumer.org/RefProp"
WSNMOM = "urn:wsnmom:ns:1"


@dataclass(frozen=True)
class Version:
    """The namespaces and names of one older wire format."""

    name: str
    wsnt: str
    wsnbr: str
    wsa: str
    wsrl: str
    wsrp: str
    subscribe: str
    current: str
    pause: str
    resume: str
    register: str
    #: the subscription's topic element: (element, attributes)
    topic_element: str
    topic_attributes: str


V10 = Version(
    "1.0",
    IBM + "WS-Notification",
    IBM + "WS-Notification",
    "http://schemas.xmlsoap.org/ws/2003/03/addressing",
    IBM + "WS-ResourceLifetime",
    IBM + "WS-ResourceProperties",
    "SubscribeRequest",
    "GetCurrentMessageRequest",
    "PauseSubscriptionRequest",
    "ResumeSubscriptionRequest",
    "RegisterPublisherRequest",
    "TopicPathExpression",
    "",
)
V12 = Version(
    "1.2-draft",
    DRAFT_WSN + "wsn-WS-BaseNotification-1.2-draft-01.xsd",
    DRAFT_WSN + "wsn-WS-BrokeredNotification-1.2-draft-01.xsd",
    "http://schemas.xmlsoap.org/ws/2004/03/addressing",
    DRAFT_WSRF + "wsrf-WS-ResourceLifetime-1.2-draft-01.xsd",
    DRAFT_WSRF + "wsrf-WS-ResourceProperties-1.2-draft-01.xsd",
    "Subscribe",
    "GetCurrentMessage",
    "PauseSubscription",
    "ResumeSubscription",
    "RegisterPublisher",
    "TopicExpression",
    f' Dialect="{DRAFT_WSN}TopicExpression/Simple"',
)


class Client:
    """Raw envelopes of one version to one gateway."""

    def __init__(self, server: RunningServer, v: Version) -> None:
        self.server = server
        self.v = v
        #: the topic of the examples, in a namespace of this test run's own
        self.topic_ns = f"urn:test:wsn10:{uuid.uuid4().hex[:12]}"

    def envelope(self, action: str, to: str, body: str, headers: str = "") -> bytes:
        v = self.v
        return (
            f'<s12:Envelope xmlns:s12="{S12}" xmlns:wsa="{v.wsa}" xmlns:wsnt="{v.wsnt}" '
            f'xmlns:wsnbr="{v.wsnbr}" xmlns:wsrl="{v.wsrl}" xmlns:wsrp="{v.wsrp}" '
            f'xmlns:npex="{NPEX}" xmlns:ncex="{NCEX}" xmlns:tns="{self.topic_ns}">'
            f"<s12:Header><wsa:Action>{action}</wsa:Action>"
            f'<wsa:To s12:mustUnderstand="1">{to}</wsa:To>'
            f"<wsa:MessageID>uuid:{uuid.uuid4()}</wsa:MessageID>{headers}</s12:Header>"
            f"<s12:Body>{body}</s12:Body></s12:Envelope>"
        ).encode()

    def post(
        self, to: str, local: str, body: str, headers: str = "", status: int = 200
    ) -> etree._Element:
        """POST to ``to``; the answer's envelope (asserting ``status``)."""
        data = self.envelope(f"{IBM}WS-Notification/{local}", to, body, headers)
        reply = requests.post(
            to,
            data=data,
            headers={"Content-Type": "application/soap+xml; charset=utf-8"},
            timeout=30,
        )
        assert reply.status_code == status, reply.text
        return etree.fromstring(reply.content) if reply.content else etree.Element("none")

    def subscribe(self, consumer: str, *, use_notify: bool = True) -> tuple[str, str]:
        """§8.2.1: the subscription's (address, wsnmom:ResourceId header to echo)."""
        v = self.v
        itt = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = (
            f"<wsnt:{v.subscribe}>"
            f"<wsnt:ConsumerReference><wsa:Address>{consumer}</wsa:Address>"
            "<wsa:ReferenceProperties><ncex:NCResourceId>"
            "uuid:9fef5fec-6dc3-44a2-ba32-8680cace43f9"
            "</ncex:NCResourceId></wsa:ReferenceProperties></wsnt:ConsumerReference>"
            f"<wsnt:{v.topic_element}{v.topic_attributes}>tns:ResourcePropertiesValueChanges"
            f"</wsnt:{v.topic_element}>"
            f"<wsnt:UseNotify>{str(use_notify).lower()}</wsnt:UseNotify>"
            '<wsnt:Selector dialect="http://www.w3.org/TR/1999/REC-xpath-19991116">'
            "boolean(//npex:NotifyContent)</wsnt:Selector>"
            f"<wsrl:InitialTerminationTime>{itt}</wsrl:InitialTerminationTime>"
            f"</wsnt:{v.subscribe}>"
        )
        env = self.post(self.server.broker_url, "SubscribeRequest", body)
        answer = _body(env)
        assert answer.tag == f"{{{v.wsnt}}}SubscribeResponse"
        assert [c.tag for c in answer] == [f"{{{v.wsnt}}}SubscriptionReference"]
        ref = answer[0]
        address = ref.findtext(f"{{{v.wsa}}}Address")
        props = ref.find(f"{{{v.wsa}}}ReferenceProperties")
        assert address and props is not None and len(props) == 1
        assert _header(env, v.wsa, "Action") == f"{_action_base(v.wsnt)}/SubscribeResponse"
        return address, etree.tostring(props[0]).decode()

    def notify(self, content: str) -> None:
        """§7.1.1: one NotificationMessage on the examples' topic."""
        v = self.v
        dialect = f' Dialect="{DRAFT_WSN}TopicExpression/Concrete"' if v.name == V12.name else ""
        body = (
            "<wsnt:Notify><wsnt:NotificationMessage>"
            f"<wsnt:Topic{dialect}>tns:ResourcePropertiesValueChanges</wsnt:Topic>"
            "<wsnt:ProducerReference><wsa:Address>http://127.0.0.1:9/ProducerEndpoint"
            "</wsa:Address><wsa:ReferenceProperties><npex:NPRResourceId>"
            "uuid:84decd55-7d3f-65ad-ac44-675d9fce5d22</npex:NPRResourceId>"
            "</wsa:ReferenceProperties></wsnt:ProducerReference>"
            f"<wsnt:Message><npex:NotifyContent>{content}</npex:NotifyContent></wsnt:Message>"
            "</wsnt:NotificationMessage></wsnt:Notify>"
        )
        self.post(self.server.broker_url, "Notify", body, status=202)

    def manage(self, address: str, ref: str, body: str, local: str) -> etree._Element:
        """A request to the subscription manager (§9.2.1 shape: wsa:To plus the
        subscription's reference property echoed); the answer's Body child."""
        return _body(self.post(address, local, body, headers=ref))


def _action_base(ns: str) -> str:
    return ns.removesuffix("-1.2-draft-01.xsd")


def _body(env: etree._Element) -> etree._Element:
    body = env.find(f"{{{S12}}}Body")
    assert body is not None and len(body) == 1, etree.tostring(env)
    return body[0]


def _header(env: etree._Element, wsa: str, local: str) -> str | None:
    return env.findtext(f"{{{S12}}}Header/{{{wsa}}}{local}")


def _contents(consumer: ConsumerServer, v: Version, path: str) -> list[str]:
    """The NotifyContent texts ``consumer`` got on ``path`` in ``v``'s Notify form."""
    out = []
    for rec in consumer.notifies():
        if rec.path != path:
            continue
        body = rec.body_child
        assert body.tag == f"{{{v.wsnt}}}Notify", etree.tostring(body)
        for holder in body.findall(f"{{{v.wsnt}}}NotificationMessage"):
            out.append(holder.findtext(f"{{{v.wsnt}}}Message/{{{NPEX}}}NotifyContent") or "")
    return out


def _wait_content(consumer: ConsumerServer, v: Version, path: str, text: str) -> None:
    wait_until(lambda: text in _contents(consumer, v, path), timeout=30, what=f"{text} at {path}")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("embedded"),
        pytest.param("mqtt", marks=pytest.mark.mqtt),
        pytest.param("postgres-store"),
    ],
)
def own_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A gateway of this module only (its tests restart it), on a temporary data
    directory: the embedded middleware, or MQTT, with the SQLite store; or the embedded
    middleware with a PostgreSQL store of its own.  Each test's ``Client`` has a topic
    namespace of its own, so the tests sharing it do not see each other's messages."""
    name: str = request.param
    data_dir = Path(tempfile.mkdtemp(prefix=f"wsnmom-wsn10-{name}-"))
    with contextlib.ExitStack() as stack:
        store_url = None
        if name == "mqtt":  # the restarted gateway keeps its data directory and prefix
            url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
        else:
            url = f"embedded://{data_dir / 'middleware'}"
        if name == "postgres-store":
            postgres = request.getfixturevalue("postgres_server")
            store_url = stack.enter_context(fresh_database(postgres.url))
        with serving(RunningServer(name, url, data_dir, store_url=store_url), request) as server:
            yield server


# two lifecycles and a restart (and the module gateway's start in the first test): at
# load 40 that passed the default 180 s (docs/testing.md, "A hang fails one test")
@pytest.mark.timeout(360)
def test_older_client_lifecycle_survives_a_restart(own_server: RunningServer) -> None:
    """A WS-N 1.0 and a 1.2-draft subscriber each: notify, GetCurrentMessage, pause,
    resume, renew; then one restart of the gateway (for both: a restart costs a gateway
    start), after which each subscriber's format holds and Destroy ends its
    subscriptions."""
    clients = {v: (Client(own_server, v), ConsumerServer()) for v in (V10, V12)}
    try:
        held = {v: _lifecycle_before_a_restart(own_server, *clients[v]) for v in clients}
        own_server.restart()
        for v, (client, consumer) in clients.items():
            _lifecycle_after_a_restart(own_server, client, consumer, *held[v])
    finally:
        for _, consumer in clients.values():
            consumer.close()


def _lifecycle_before_a_restart(
    own_server: RunningServer, client: Client, consumer: ConsumerServer
) -> tuple[str, str, str, str]:
    """Subscribe (/a, /b, raw), notify, GetCurrentMessage, pause and resume, renew: the
    subscriptions /a and /b and their reference properties."""
    v = client.v
    address, ref = client.subscribe(consumer.address("/a"))
    other, other_ref = client.subscribe(consumer.address("/b"))
    client.subscribe(consumer.address("/raw"), use_notify=False)

    # notify: delivered in the subscriber's format, its reference property echoed
    client.notify("first")
    _wait_content(consumer, v, "/a", "first")
    rec = next(r for r in consumer.notifies() if r.path == "/a")
    assert rec.envelope.findtext(f"{{{S12}}}Header/{{{v.wsa}}}Action") == (
        f"{_action_base(v.wsnt)}/Notify"
    )
    assert rec.envelope.findtext(f"{{{S12}}}Header/{{{v.wsa}}}To") == consumer.address("/a")
    assert rec.envelope.find(f"{{{S12}}}Header/{{{NCEX}}}NCResourceId") is not None
    holder = rec.body_child[0]
    topic = holder.find(f"{{{v.wsnt}}}Topic")
    assert topic is not None and topic.text is not None
    prefix, _, local = topic.text.partition(":")
    assert (topic.nsmap[prefix], local) == (client.topic_ns, "ResourcePropertiesValueChanges")
    producer = holder.find(f"{{{v.wsnt}}}ProducerReference/{{{v.wsa}}}Address")
    assert producer is not None and producer.text == "http://127.0.0.1:9/ProducerEndpoint"
    # UseNotify=false: the raw message, with this version's addressing headers
    wait_until(lambda: any(r.path == "/raw" for r in consumer.notifies()), timeout=30)
    raw = next(r for r in consumer.notifies() if r.path == "/raw")
    assert raw.body_child.tag == f"{{{NPEX}}}NotifyContent"
    assert raw.body_child.text == "first"
    assert raw.envelope.find(f"{{{S12}}}Header/{{{v.wsa}}}Action") is not None

    # §8.3.1 GetCurrentMessage: the last message on the topic, in the 1.x element
    answer = _body(
        client.post(
            own_server.broker_url,
            "GetCurrentMessageRequest",
            f"<wsnt:{v.current}><wsnt:Topic>tns:ResourcePropertiesValueChanges"
            f"</wsnt:Topic></wsnt:{v.current}>",
        )
    )
    assert answer.tag == f"{{{v.wsnt}}}GetCurrentMessageResponse"
    assert answer.findtext(f"{{{NPEX}}}NotifyContent") == "first"

    # pause /a: /b gets "second", /a not until it is resumed
    pause = f"<wsnt:{v.pause}/>"
    assert client.manage(address, ref, pause, "PauseSubscriptionRequest").tag == (
        f"{{{v.wsnt}}}PauseSubscriptionResponse"
    )
    client.notify("second")
    _wait_content(consumer, v, "/b", "second")
    assert "second" not in _contents(consumer, v, "/a")
    resume = f"<wsnt:{v.resume}/>"
    assert client.manage(address, ref, resume, "ResumeSubscriptionRequest").tag == (
        f"{{{v.wsnt}}}ResumeSubscriptionResponse"
    )
    _wait_content(consumer, v, "/a", "second")

    # renew: WS-ResourceLifetime SetTerminationTime, read back as a resource property
    wanted = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    answer = client.manage(
        address,
        ref,
        "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>"
        f"{wanted.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime>",
        "SetTerminationTime",
    )
    assert answer.tag == f"{{{v.wsrl}}}SetTerminationTimeResponse"
    assert [c.tag for c in answer] == [
        f"{{{v.wsrl}}}NewTerminationTime",
        f"{{{v.wsrl}}}CurrentTime",
    ]
    assert _time(answer[0].text) == wanted
    prop = client.manage(
        address,
        ref,
        "<wsrp:GetResourceProperty>wsrl:TerminationTime</wsrp:GetResourceProperty>",
        "GetResourceProperty",
    )
    assert prop.tag == f"{{{v.wsrp}}}GetResourcePropertyResponse"
    assert _time(prop.findtext(f"{{{v.wsrl}}}TerminationTime")) == wanted
    return address, ref, other, other_ref


def _lifecycle_after_a_restart(
    own_server: RunningServer,
    client: Client,
    consumer: ConsumerServer,
    address: str,
    ref: str,
    other: str,
    other_ref: str,
) -> None:
    """The subscriber's format survived the restart; Destroy, then the unknown resource
    in each interface's namespace."""
    v = client.v
    pause = f"<wsnt:{v.pause}/>"
    client.notify("after-restart")
    _wait_content(consumer, v, "/a", "after-restart")
    listed = requests.get(f"{own_server.base_url}/wsn/admin/api/subscriptions", timeout=30).json()[
        "subscriptions"
    ]
    assert {s["id"]: s["wsn_version"] for s in listed}[address.rsplit("/", 1)[1]] == v.name

    # destroy: WS-ResourceLifetime Destroy; the subscription is then unknown
    answer = client.manage(address, ref, "<wsrl:Destroy/>", "Destroy")
    assert answer.tag == f"{{{v.wsrl}}}DestroyResponse"
    env = client.post(address, "PauseSubscriptionRequest", pause, headers=ref, status=500)
    sub = (own_server, "SubscriptionManager")
    _assert_fault(
        env, v, "UnknownResource", "ResourceUnknownFault", v.wsnt, sub, "PauseSubscription"
    )
    # the unknown resource of each interface's operation, in that interface's namespace
    # (1.2-draft: WS-ResourceLifetime's and WS-ResourceProperties' ResourceUnknownFault)
    env = client.post(address, "Destroy", "<wsrl:Destroy/>", headers=ref, status=500)
    _assert_fault(env, v, "UnknownResource", "ResourceUnknownFault", v.wsrl, sub, "Destroy")
    env = client.post(
        address,
        "SetTerminationTime",
        "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>2100-01-01T00:00:00Z"
        "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime>",
        headers=ref,
        status=500,
    )
    _assert_fault(
        env, v, "UnknownResource", "ResourceUnknownFault", v.wsrl, sub, "SetTerminationTime"
    )
    env = client.post(
        address,
        "GetResourceProperty",
        "<wsrp:GetResourceProperty>wsnt:ConsumerReference</wsrp:GetResourceProperty>",
        headers=ref,
        status=500,
    )
    _assert_fault(
        env, v, "UnknownResource", "ResourceUnknownFault", v.wsrp, sub, "GetResourceProperty"
    )
    client.manage(other, other_ref, "<wsrl:Destroy/>", "Destroy")


@pytest.mark.parametrize("v", [V10, V12], ids=["wsn-1.0", "wsn-1.2-draft"])
def test_older_faults_and_register_publisher(own_server: RunningServer, v: Version) -> None:
    client = Client(own_server, v)
    broker = own_server.broker_url
    # Subscribe without a ConsumerReference
    env = client.post(
        broker,
        "SubscribeRequest",
        f"<wsnt:{v.subscribe}><wsnt:{v.topic_element}{v.topic_attributes}>tns:t1"
        f"</wsnt:{v.topic_element}></wsnt:{v.subscribe}>",
        status=500,
    )
    at_broker = (own_server, "NotificationBroker")
    _assert_fault(
        env,
        v,
        "SubscribeCreationFailed",
        "SubscribeCreationFailedFault",
        None,
        at_broker,
        "Subscribe",
    )
    # a topic expression in a dialect nobody knows (the drafts' name for the fault differs
    # from 1.3's TopicExpressionDialectUnknownFault)
    env = client.post(
        broker,
        "SubscribeRequest",
        f"<wsnt:{v.subscribe}><wsnt:ConsumerReference><wsa:Address>http://127.0.0.1:9/c"
        f'</wsa:Address></wsnt:ConsumerReference><wsnt:{v.topic_element} Dialect="urn:x:none">'
        f"tns:t1</wsnt:{v.topic_element}></wsnt:{v.subscribe}>",
        status=500,
    )
    _assert_fault(
        env,
        v,
        "SubscribeCreationFailed",
        "TopicPathDialectUnknownFault",
        v.wsnt,
        at_broker,
        "Subscribe",
    )
    # GetCurrentMessage on a topic nothing was published on
    env = client.post(
        broker,
        "GetCurrentMessageRequest",
        f"<wsnt:{v.current}><wsnt:Topic>tns:nothing</wsnt:Topic></wsnt:{v.current}>",
        status=500,
    )
    _assert_fault(
        env,
        v,
        "NoCurrentMessageOnTopic",
        "NoCurrentMessageOnTopicFault",
        None,
        at_broker,
        "GetCurrentMessage",
    )
    # §10.3.1 RegisterPublisher (Demand=false: the example's Demand=true needs a producer
    # that answers Subscribe)
    answer = _body(
        client.post(
            broker,
            "RegisterPublisherRequest",
            f"<wsnbr:{v.register}><wsnbr:PublisherReference><wsa:Address>"
            "http://127.0.0.1:9/ProducerEndpoint</wsa:Address></wsnbr:PublisherReference>"
            "<wsnbr:Topic>tns:ResourcePropertiesValueChanges</wsnbr:Topic>"
            "<wsnbr:Demand>false</wsnbr:Demand></wsnbr:" + v.register + ">",
        )
    )
    assert answer.tag == f"{{{v.wsnbr}}}RegisterPublisherResponse"
    assert [c.tag for c in answer] == [f"{{{v.wsnbr}}}PublisherRegistrationReference"]
    registration = answer[0].findtext(f"{{{v.wsa}}}Address")
    assert registration
    # scheduled destruction of the registration (N10 §11: WS-ResourceLifetime's
    # SetTerminationTime at the PublisherRegistrationManager), read back as a property
    wanted = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
    answer = _body(
        client.post(
            registration,
            "SetTerminationTime",
            "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>"
            f"{wanted.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime>",
        )
    )
    assert answer.tag == f"{{{v.wsrl}}}SetTerminationTimeResponse"
    assert _time(answer.findtext(f"{{{v.wsrl}}}NewTerminationTime")) == wanted
    prop = _body(
        client.post(
            registration,
            "GetResourceProperty",
            "<wsrp:GetResourceProperty>wsrl:TerminationTime</wsrp:GetResourceProperty>",
        )
    )
    assert _time(prop.findtext(f"{{{v.wsrl}}}TerminationTime")) == wanted
    past = "<wsrl:SetTerminationTime><wsrl:RequestedTerminationTime>2004-01-01T00:00:00Z"
    env = client.post(
        registration,
        "SetTerminationTime",
        past + "</wsrl:RequestedTerminationTime></wsrl:SetTerminationTime>",
        status=500,
    )
    # (1.2-draft: WS-ResourceLifetime draft-01's fault of SetTerminationTime)
    _assert_fault(
        env,
        v,
        "TerminationTimeChangeRejected",
        "TerminationTimeChangeRejectedFault",
        v.wsrl,
        (own_server, "PublisherRegistrationManager"),
        "SetTerminationTime",
    )
    assert _body(client.post(registration, "Destroy", "<wsrl:Destroy/>")).tag == (
        f"{{{v.wsrl}}}DestroyResponse"
    )
    # GetResourceProperty on the broker endpoint, in the version's namespaces
    answer = _body(
        client.post(
            broker,
            "GetResourceProperty",
            "<wsrp:GetResourceProperty>wsnbr:RequiresRegistration</wsrp:GetResourceProperty>",
        )
    )
    assert answer.tag == f"{{{v.wsrp}}}GetResourcePropertyResponse"
    assert answer.findtext(f"{{{v.wsnbr}}}RequiresRegistration") == "false"
    env = client.post(
        broker,
        "GetResourceProperty",
        "<wsrp:GetResourceProperty>wsnt:Topics</wsrp:GetResourceProperty>",
        status=500,
    )
    _assert_fault(
        env,
        v,
        "InvalidResourceProperty",
        "InvalidResourcePropertyQNameFault",
        v.wsrp,
        at_broker,
        "GetResourceProperty",
    )
    # a 1.0 producer-wide Pause is refused with PauseFailed ("Pause operation could not be
    # performed", N10 §8.4); Resume, of the producer or of a topic, is "no change" (§8.5),
    # as nothing is paused: ResumeResponse
    if v is V10:
        env = client.post(broker, "PauseRequest", "<wsnt:PauseRequest/>", status=500)
        _assert_fault(env, v, "PauseFailed", "PauseFailedFault")
        env = client.post(
            broker,
            "PauseRequest",
            "<wsnt:PauseRequest><wsnt:Topic>tns:ResourcePropertiesValueChanges</wsnt:Topic>"
            "</wsnt:PauseRequest>",
            status=500,
        )
        _assert_fault(env, v, "PauseFailed", "PauseFailedFault")
        for body in (
            "<wsnt:ResumeRequest/>",
            "<wsnt:ResumeRequest><wsnt:Topic>tns:ResourcePropertiesValueChanges</wsnt:Topic>"
            "</wsnt:ResumeRequest>",
        ):
            env = client.post(broker, "ResumeRequest", body)
            assert _body(env).tag == f"{{{v.wsnt}}}ResumeResponse"
            assert len(_body(env)) == 0
            assert _header(env, v.wsa, "Action") == f"{v.wsnt}/ResumeResponse"


def test_a_draft_client_with_2003_03_addressing(own_server: RunningServer) -> None:
    """The 1.2 draft-01 schemas type their EPRs as WS-Addressing 2003/03 (Globus Toolkit 4
    sends 2004/03): a draft Subscribe in 2003/03 addressing is accepted, delivered to, and
    answered in 2004/03."""
    sender = dataclasses.replace(V12, wsa=V10.wsa)
    client = Client(own_server, sender)
    consumer = ConsumerServer()
    try:
        body = (
            f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{consumer.address('/a')}"
            "</wsa:Address></wsnt:ConsumerReference>"
            f"<wsnt:TopicExpression{V12.topic_attributes}>tns:ResourcePropertiesValueChanges"
            "</wsnt:TopicExpression></wsnt:Subscribe>"
        )
        answer = _body(client.post(own_server.broker_url, "Subscribe", body))
        assert answer.tag == f"{{{V12.wsnt}}}SubscribeResponse"
        address = answer[0].findtext(f"{{{V12.wsa}}}Address")
        assert address
        client.notify("in-2003-03")
        _wait_content(consumer, V12, "/a", "in-2003-03")
        assert _body(client.post(address, "Destroy", "<wsrl:Destroy/>")).tag == (
            f"{{{V12.wsrl}}}DestroyResponse"
        )
    finally:
        consumer.close()


def test_wsdl_of_each_version(own_server: RunningServer) -> None:
    for version, ns in (("1.0", V10.wsnt), ("1.2-draft", V12.wsnt)):
        reply = requests.get(f"{own_server.broker_url}?wsdl&version={version}", timeout=30)
        assert reply.status_code == 200
        wsdl = etree.fromstring(reply.content)
        assert wsdl.get("targetNamespace") == ns
        ops = {op.get("name") for op in wsdl.iter("{http://schemas.xmlsoap.org/wsdl/}operation")}
        assert {"Subscribe", "Notify", "PauseSubscription", "SetTerminationTime"} <= ops
        registrations = wsdl.find(
            "{http://schemas.xmlsoap.org/wsdl/}portType[@name='PublisherRegistrationManager']"
        )
        assert registrations is not None
        assert {op.get("name") for op in registrations} == {
            "Destroy",
            "SetTerminationTime",
            "GetResourceProperty",
        }
        address = wsdl.find(".//{http://schemas.xmlsoap.org/wsdl/soap12/}address")
        assert address is not None and address.get("location") == own_server.broker_url
    current = requests.get(f"{own_server.broker_url}?wsdl&version=1.3", timeout=30)
    assert current.status_code == 200 and b"docs.oasis-open.org/wsn/bw-2" in current.content
    unknown = requests.get(f"{own_server.broker_url}?wsdl&version=0.9", timeout=30)
    assert unknown.status_code == 404


def _time(text: str | None) -> datetime:
    assert text
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(microsecond=0)


def _assert_fault(
    env: etree._Element,
    v: Version,
    name10: str,
    name12: str,
    ns12: str | None = None,
    at: tuple[RunningServer, str] | None = None,
    operation: str = "",
) -> None:
    """A fault of version ``v``: 1.0's ErrorMessage starting with ``name10``, or the
    1.2-draft element ``name12`` (in ``ns12`` when given, else in a draft namespace).
    With ``at`` (server, port type): the fault sent is one the version's WSDL, as that
    server serves it, declares for ``operation`` (fault name and element)."""
    fault = _body(env)
    assert fault.tag == f"{{{S12}}}Fault"
    detail = fault.find(f"{{{S12}}}Detail")
    assert detail is not None and len(detail) == 1
    if v is V10:
        assert detail[0].tag.endswith("}ErrorMessage")
        assert (detail[0].text or "").startswith(f"{name10}: ")
    else:
        assert detail[0].tag.rsplit("}", 1)[1] == name12
        assert detail[0].tag.startswith(("{" + DRAFT_WSN, "{" + DRAFT_WSRF))
        if ns12 is not None:
            assert detail[0].tag == f"{{{ns12}}}{name12}"
    if at is not None:
        server, port_type = at
        reply = requests.get(f"{server.broker_url}?wsdl&version={v.name}", timeout=30)
        assert reply.status_code == 200
        name = name10 if v is V10 else name12
        assert (name, str(detail[0].tag)) in declared(reply.content)[(port_type, operation)]
