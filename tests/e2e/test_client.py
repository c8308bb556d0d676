"""``wsnmom.client`` against the real gateway: every client operation, on every adapter.

Each test drives the operation through the client and checks the outcome at the broker
(or at a consumer), so a client that sends the wrong XML or reads an answer wrongly fails.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree
from wsnmom.core.model import EndpointReference, SoapVersion

from tests.e2e.conftest import Wsn
from tests.fixtures.server import RunningServer
from tests.support.ports import closed_port
from tests.support.waiting import wait_until
from wsnmom.client import (
    CONCRETE,
    FULL,
    ONVIF_CONCRETE_SET,
    SIMPLE,
    InvalidMessageContentExpressionFault,
    InvalidTopicExpressionFault,
    Message,
    MultipleTopicsSpecifiedFault,
    NoCurrentMessageOnTopicFault,
    NotificationConsumer,
    ResourceUnknownFault,
    TopicExpression,
    TopicExpressionDialectUnknownFault,
    TransportError,
    UnacceptableInitialTerminationTimeFault,
    UnacceptableTerminationTimeFault,
    WsnClient,
    WsnFault,
    text_payload,
)
from wsnmom.client.errors import (
    InvalidProducerPropertiesExpressionFault,
    PublisherRegistrationFailedFault,
    UnableToGetMessagesFault,
    UnrecognizedPolicyRequestFault,
)

pytestmark = pytest.mark.e2e


def _close(a: datetime | None, b: datetime, slack: float = 5.0) -> bool:
    return a is not None and abs((a - b).total_seconds()) < slack


# --- Subscribe, Notify, the consumer ------------------------------------------------------
def test_subscribe_notify_receive(client: WsnClient, inbox: NotificationConsumer) -> None:
    sub = client.subscribe(inbox, "tns:sensors/room1")
    assert sub.address.startswith(client.broker_url.rsplit("/", 1)[0])
    assert sub.id and sub.id in sub.address
    assert sub.current_time is not None and sub.termination_time is not None
    client.notify("<t unit='C'>21.5</t>", "tns:sensors/room1", producer="http://sensor.example/1")
    got = inbox.get(timeout=10)
    assert got.payload.tag == "t" and got.payload.text == "21.5"
    assert got.payload_xml == b'<t unit="C">21.5</t>'
    assert got.topic is not None
    assert got.topic.namespaces == {"tns": client.namespaces["tns"]}
    assert str(got.topic) == "{" + client.namespaces["tns"] + "}sensors/room1"
    assert got.topic.effective_dialect == CONCRETE
    assert got.subscription_address == sub.address
    assert got.producer_reference == EndpointReference("http://sensor.example/1")
    assert not got.raw and got.path == "/consumer"
    sub.unsubscribe()


def test_topic_dialects_and_clark_notation(client: WsnClient, inbox: NotificationConsumer) -> None:
    ns = client.namespaces["tns"]
    client.subscribe(inbox, TopicExpression("x:a/*", {"x": ns}, FULL))
    client.subscribe(inbox, "{" + ns + "}b", namespaces={})
    client.notify("<one/>", "{" + ns + "}a/x1")
    client.notify("<two/>", TopicExpression("tns:b", {"tns": ns}, SIMPLE))
    client.notify("<three/>", "tns:c")  # nobody subscribed
    got = sorted(n.payload.tag for n in inbox.wait_for(2))
    assert got == ["one", "two"]
    client.notify("<sentinel/>", "tns:b")  # the barrier: after <three/>
    assert inbox.get(timeout=10).payload.tag == "sentinel"
    assert inbox.drain() == []


def test_undeclared_prefix_is_refused_before_sending(client: WsnClient) -> None:
    with pytest.raises(ValueError, match="undeclared prefix"):
        client.notify("<x/>", "nope:a")


def test_message_content_filter(client: WsnClient, inbox: NotificationConsumer) -> None:
    client.subscribe(
        inbox,
        "tns:orders",
        message_content="/o:order[@total > 100]",
        message_content_namespaces={"o": "urn:orders"},
    )
    client.notify_many(
        [
            ('<o:order xmlns:o="urn:orders" total="50"/>', "tns:orders"),
            ('<o:order xmlns:o="urn:orders" total="500"/>', "tns:orders"),
        ]
    )
    (got,) = inbox.wait_for(1)
    assert got.payload.get("total") == "500"
    # the barrier: a sentinel the filter lets through, after the order it must drop
    client.notify('<o:order xmlns:o="urn:orders" total="1000"/>', "tns:orders")
    assert inbox.get(timeout=10).payload.get("total") == "1000"
    assert inbox.drain() == []


def test_initial_termination_time_forms(client: WsnClient, inbox: NotificationConsumer) -> None:
    now = datetime.now(UTC)
    by_delta = client.subscribe(inbox, "tns:t", initial_termination_time=timedelta(minutes=7))
    assert _close(by_delta.termination_time, now + timedelta(minutes=7))
    when = (now + timedelta(hours=2)).replace(microsecond=0)
    by_time = client.subscribe(inbox, "tns:t", initial_termination_time=when)
    assert by_time.termination_time == when
    by_text = client.subscribe(inbox, "tns:t", initial_termination_time="PT9M")
    assert _close(by_text.termination_time, now + timedelta(minutes=9))
    with pytest.raises(UnacceptableInitialTerminationTimeFault) as info:
        client.subscribe(inbox, "tns:t", initial_termination_time=now - timedelta(days=1))
    assert info.value.minimum_time is not None


def test_use_raw_delivers_the_bare_payload(client: WsnClient, inbox: NotificationConsumer) -> None:
    sub = client.subscribe(inbox, "tns:raw", use_raw=True)
    client.notify('<r:hello xmlns:r="urn:r">world</r:hello>', "tns:raw")
    got = inbox.get(timeout=10)
    assert got.raw and got.topic is None
    assert got.payload.tag == "{urn:r}hello" and got.payload.text == "world"
    assert sub.properties().use_raw


def test_consumer_reference_parameters_are_echoed(
    client: WsnClient, inbox: NotificationConsumer
) -> None:
    param = b'<my:Key xmlns:my="urn:mine">42</my:Key>'
    client.subscribe(EndpointReference(inbox.address, (param,)), "tns:p")
    client.notify("<x/>", "tns:p")
    got = inbox.get(timeout=10)
    assert [(h.tag, h.text) for h in got.headers] == [("{urn:mine}Key", "42")]


def test_text_payloads_travel_wrapped(client: WsnClient, inbox: NotificationConsumer) -> None:
    client.subscribe(inbox, "tns:text")
    client.notify(text_payload("héllo <world>"), "tns:text")
    client.notify(text_payload(b"\x00\xff", "application/octet-stream"), "tns:text")
    first, second = inbox.wait_for(2)
    assert first.is_native and first.content_type == "text/plain"
    assert first.data == "héllo <world>".encode()
    assert second.data == b"\x00\xff" and second.content_type == "application/octet-stream"


# --- SubscriptionManager --------------------------------------------------------------------
def test_renew_pause_resume_properties(client: WsnClient, inbox: NotificationConsumer) -> None:
    sub = client.subscribe(
        inbox,
        "tns:m",
        message_content="boolean(/m)",
        initial_termination_time=timedelta(minutes=5),
    )
    granted = sub.renew(timedelta(minutes=30))
    assert granted == sub.termination_time
    assert sub.current_time is not None
    assert _close(granted, sub.current_time + timedelta(minutes=30))
    props = sub.properties()
    assert props.consumer_reference is not None
    assert props.consumer_reference.address == inbox.address
    assert props.topic == TopicExpression("tns:m", {"tns": client.namespaces["tns"]}, SIMPLE)
    assert props.message_content == "boolean(/m)"
    assert props.termination_time == granted
    assert props.creation_time is not None and props.paused is False and not props.use_raw
    assert props.document.tag == "{http://docs.oasis-open.org/wsn/b-2}SubscriptionManagerRP"

    sub.pause()
    assert sub.properties().paused is True
    witness = client.subscribe(inbox, "tns:m")  # the barrier: it gets a sentinel after
    client.notify("<m>1</m>", "tns:m")
    client.notify("<sentinel/>", "tns:m")
    seen = [inbox.get(timeout=10), inbox.get(timeout=10)]
    assert [n.subscription_address for n in seen] == [witness.address] * 2
    witness.unsubscribe()
    assert inbox.drain() == []
    sub.resume()
    assert inbox.get(timeout=10).payload.text == "1"
    with pytest.raises(UnacceptableTerminationTimeFault):
        sub.renew("2001-01-01T00:00:00Z")
    sub.unsubscribe()
    with pytest.raises(ResourceUnknownFault) as info:
        sub.pause()
    assert info.value.fault_name == "ResourceUnknownFault" and info.value.description


def test_handles_from_addresses_and_context_managers(
    client: WsnClient, inbox: NotificationConsumer
) -> None:
    with client.subscribe(inbox, "tns:ctx") as sub:
        bare = client.subscription(sub.address)  # no reference parameters: the path suffices
        assert bare.id == sub.id
        bare.pause()
        bare.resume()
    with pytest.raises(ResourceUnknownFault):
        bare.unsubscribe()


# --- Pull points ----------------------------------------------------------------------------
def test_pull_point_lifecycle(client: WsnClient) -> None:
    with client.create_pull_point(initial_termination_time=timedelta(minutes=5)) as pp:
        assert pp.termination_time is not None
        sub = client.subscribe(pp, "tns:pulled")
        client.notify_many([(f"<n>{i}</n>", "tns:pulled") for i in range(3)])
        pp.notify("<direct/>", "tns:other")
        got = wait_until(lambda: (m := pp.get_messages(2)) and m, what="pulled messages")
        got += wait_until(lambda: (m := pp.get_messages()) and len(got) + len(m) >= 4 and m)
        texts = [n.payload.text for n in got if n.payload.tag == "n"]
        assert texts == ["0", "1", "2"]
        # the direct Notify may overtake the forwarded ones (Kafka: one more hop)
        assert next(n for n in got if n.payload.tag == "n").subscription_address == sub.address
        assert any(n.payload.tag == "direct" for n in got)
        assert pp.get_messages() == []
        with pytest.raises(UnableToGetMessagesFault):
            client.get_messages(pp, -1)
    with pytest.raises(ResourceUnknownFault):
        pp.get_messages()
    with pytest.raises(ResourceUnknownFault):
        client.pull_point(pp.address).destroy()


def test_named_pull_point(client: WsnClient, wsn: Wsn) -> None:
    pp = client.create_pull_point(name=f"queue-{wsn.ns[-8:]}")
    pp.notify("<x/>", "tns:q")
    assert len(wait_until(lambda: pp.get_messages())) == 1
    pp.destroy()


# --- Publisher registrations, current message, resource properties -----------------------
def test_register_publisher_and_notify_through_it(
    client: WsnClient, inbox: NotificationConsumer
) -> None:
    client.subscribe(inbox, "tns:published")
    reg = client.register_publisher(
        "http://publisher.example/p", ["tns:published"], initial_termination_time="PT10M"
    )
    assert reg.consumer_reference is not None
    reg.notify("<pub/>", "tns:published")
    got = inbox.get(timeout=10)
    assert got.payload.tag == "pub"
    assert got.producer_reference == EndpointReference("http://publisher.example/p")
    reg.destroy()
    with pytest.raises(ResourceUnknownFault):
        reg.destroy()
    with pytest.raises(PublisherRegistrationFailedFault):
        client.register_publisher(None, ["tns:published"], demand=True)


def test_get_current_message(client: WsnClient) -> None:
    with pytest.raises(NoCurrentMessageOnTopicFault):
        client.get_current_message("tns:current")
    client.notify_many(
        [
            Message('<p:v xmlns:p="urn:p">1</p:v>', "tns:current"),
            ('<p:v xmlns:p="urn:p">2</p:v>', "tns:current"),
        ]
    )
    current = wait_until(lambda: _current(client), what="current message")
    assert current.payload.tag == "{urn:p}v" and current.payload.text == "2"
    assert current.topic == TopicExpression("tns:current", {"tns": client.namespaces["tns"]})
    with pytest.raises(MultipleTopicsSpecifiedFault):
        client.get_current_message("tns:current//*")


def _current(client: WsnClient) -> object:
    try:
        return client.get_current_message("tns:current")
    except NoCurrentMessageOnTopicFault:
        return None


def test_resource_properties(client: WsnClient) -> None:
    dialects = client.topic_expression_dialects()
    assert {SIMPLE, CONCRETE, FULL, ONVIF_CONCRETE_SET} <= set(dialects)
    wsnt = "http://docs.oasis-open.org/wsn/b-2"
    fixed, *_ = client.get_resource_property(f"{{{wsnt}}}FixedTopicSet")
    assert fixed.text in ("true", "false")
    values = client.get_multiple_resource_properties(
        [f"{{{wsnt}}}FixedTopicSet", "{http://docs.oasis-open.org/wsn/br-2}RequiresRegistration"]
    )
    assert [etree.QName(v).localname for v in values] == ["FixedTopicSet", "RequiresRegistration"]
    doc = client.get_resource_property_document()
    assert etree.QName(doc).localname == "NotificationBrokerRP"


# --- faults and transport -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "fault"),
    [
        (
            {"topic": TopicExpression("tns:a", dialect="urn:no-such-dialect")},
            TopicExpressionDialectUnknownFault,
        ),
        ({"topic": "tns:a//"}, InvalidTopicExpressionFault),
        ({"message_content": "/a[", "topic": "tns:a"}, InvalidMessageContentExpressionFault),
    ],
)
def test_faults_are_typed(
    client: WsnClient, inbox: NotificationConsumer, kwargs: dict[str, object], fault: type[WsnFault]
) -> None:
    with pytest.raises(fault) as info:
        client.subscribe(inbox, **kwargs)  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, WsnFault)
    assert err.fault_name == fault.fault_name == err.name
    assert err.description and err.code in ("Sender", "Receiver")
    assert err.timestamp is not None
    assert str(err).startswith(fault.fault_name + ": ")


def test_fault_details_are_read(client: WsnClient, inbox: NotificationConsumer) -> None:
    with pytest.raises(UnrecognizedPolicyRequestFault) as policy:
        client.subscribe(inbox, "tns:a", policies=[etree.Element("{urn:x}Nope")])
    assert policy.value.policies == ("{urn:x}Nope",)
    with pytest.raises(InvalidProducerPropertiesExpressionFault):
        client.subscribe(inbox, "tns:a", producer_properties="true()")


def test_soap11_client(wsnmom_server: RunningServer, wsn: Wsn, inbox: NotificationConsumer) -> None:
    with WsnClient(
        wsnmom_server.broker_url, namespaces={"tns": wsn.ns}, soap_version=SoapVersion.SOAP11
    ) as client:
        sub = client.subscribe(inbox, "tns:v11")
        client.notify("<v11/>", "tns:v11")
        assert inbox.get(timeout=10).payload.tag == "v11"
        sub.unsubscribe()
        with pytest.raises(ResourceUnknownFault) as info:
            sub.unsubscribe()
        assert info.value.code == "Client"


def test_transport_errors(wsnmom_server: RunningServer) -> None:
    with (
        closed_port() as closed,
        WsnClient(f"http://127.0.0.1:{closed}/wsn/broker", timeout=3) as dead,
    ):
        with pytest.raises(TransportError, match="cannot reach") as info:
            dead.notify("<x/>", "{urn:x}a")
        assert info.value.status is None
    with WsnClient(wsnmom_server.base_url + "/healthz", timeout=3) as wrong:
        with pytest.raises(TransportError) as info:
            wrong.topic_expression_dialects()
        assert info.value.status == 405
