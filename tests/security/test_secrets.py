"""Issue 16, finding 6: the start-up banner printed the middleware password.

Secrets are now hidden by one helper (``core.redaction``) wherever the gateway shows
something: the banner and every log line, faults, property documents, SubscriptionEnd
notices, the admin API.  Here with the forms that leaked: a Kafka URL carrying
``sasl.password`` in its query, MQTT URLs with a password in their user part or query,
and a consumer address with a password.

Cost: four gateways, about 8 s.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import requests

from tests.fixtures.server import ConsumerServer, RunningServer, free_port
from tests.support.ports import closed_port
from tests.support.soap import SIMPLE, notify_body, subscribe_body
from tests.support.waiting import wait_until

from .conftest import post, soap_fault_of

pytestmark = pytest.mark.e2e

SECRET = "Sup3rSecretPw"
NATO = "http://nc3a.nato.int/ces/wsn/extension"
NS = "urn:test:topics"


def test_banner_and_log_hide_a_kafka_sasl_password(
    gateway_factory: Callable[..., RunningServer],
) -> None:
    url = (
        f"kafka://127.0.0.1:{free_port()}?sasl.username=wsn&sasl.password={SECRET}"
        "&sasl.mechanism=PLAIN&security.protocol=SASL_PLAINTEXT&connect_timeout=1"
    )
    gateway = gateway_factory(
        {"WSNMOM_ADAPTER_URL": url, "WSNMOM_MIDDLEWARE__WAIT": "0"}, wait_for="/healthz"
    )
    wait_until(lambda: "wsnmom broker at" in gateway.log_path.read_text(), what="the banner")
    log = gateway.log_path.read_text()
    assert SECRET not in log
    assert "sasl.password=***" in log


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mqtt://wsn:{secret}@127.0.0.1:{port}?connect_timeout=1", "mqtt://wsn:***@127.0.0.1:"),
        (
            "mqtts://127.0.0.1:{port}?username=wsn&password={secret}&connect_timeout=1",
            "username=wsn&password=***",
        ),
    ],
    ids=["userinfo", "query"],
)
def test_banner_and_log_hide_an_mqtt_password(
    gateway_factory: Callable[..., RunningServer], url: str, shown: str
) -> None:
    pytest.importorskip("paho.mqtt")
    url = url.format(secret=SECRET, port=free_port())
    gateway = gateway_factory(
        {"WSNMOM_ADAPTER_URL": url, "WSNMOM_MIDDLEWARE__WAIT": "0"}, wait_for="/healthz"
    )
    wait_until(lambda: "wsnmom broker at" in gateway.log_path.read_text(), what="the banner")
    log = gateway.log_path.read_text()
    assert SECRET not in log
    assert shown in log


def test_a_consumer_password_is_never_shown(
    gateway_factory: Callable[..., RunningServer], consumer: ConsumerServer
) -> None:
    gateway = gateway_factory({"WSNMOM_RETRY__MAX_ATTEMPTS": "1", "WSNMOM_LOG_FORMAT": "json"})
    watcher = post(gateway.broker_url, subscribe_body(consumer.address(), "tns:ends"))
    assert watcher.status_code == 200
    with closed_port() as port:  # held closed until the subscription has ended
        _a_delivery_that_fails_shows_no_password(gateway, consumer, port)


def _a_delivery_that_fails_shows_no_password(
    gateway: RunningServer, consumer: ConsumerServer, port: int
) -> None:
    closed = f"http://wsn:{SECRET}@127.0.0.1:{port}/consumer"
    end_topic = (
        f'<wsn-nato:SubscriptionEndTopic xmlns:wsn-nato="{NATO}" xmlns:tns="{NS}" '
        f'Dialect="{SIMPLE}">tns:ends</wsn-nato:SubscriptionEndTopic>'
    )
    answer = post(gateway.broker_url, subscribe_body(closed, "tns:t", extra=end_topic))
    assert answer.status_code == 200, answer.content
    address = re.search(rb"<wsa:Address>([^<]*/wsn/subscriptions/[^<]*)<", answer.content)
    assert address is not None
    sub_url = address.group(1).decode()
    # the property document shows the consumer without its password
    props = post(sub_url, "<wsrf-rp:GetResourcePropertyDocument/>")
    assert props.status_code == 200
    assert SECRET.encode() not in props.content and b"wsn:***@127.0.0.1" in props.content
    admin = requests.get(f"{gateway.base_url}/wsn/admin/api/subscriptions", timeout=5)
    assert admin.status_code == 200 and SECRET not in admin.text and "wsn:***@" in admin.text
    # a delivery to it fails and ends the subscription: log and notice without the password
    assert post(gateway.broker_url, notify_body(("tns:t", "<m/>"))).status_code == 202
    (end,) = consumer.wait_for_messages(1, timeout=15)
    text = "".join(end.itertext())
    assert "unreachable" in text and SECRET not in text
    log = gateway.log_path.read_text()
    assert "giving up" in log and SECRET not in log
    metrics = requests.get(f"{gateway.base_url}/metrics", timeout=5).text
    assert SECRET not in metrics
    # a fault that repeats the refused address does not repeat its password
    refused = post(gateway.broker_url, subscribe_body(f"ftp://wsn:{SECRET}@127.0.0.1/x", None))
    fault = soap_fault_of(refused.status_code, refused.headers["Content-Type"], refused.content)
    assert fault.detail == "SubscribeCreationFailedFault"
    assert SECRET.encode() not in refused.content and "wsn:***@" in fault.reason
