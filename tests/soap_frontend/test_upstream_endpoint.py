"""``/wsn/upstream/<key>`` (wsnmom.upstreams, docs/federation.md): Notify from an upstream
producer is handed to the relay without credentials, even where every other request must
authenticate; a key the relay does not know, another operation, or a gateway without a
relay is a SOAP fault and hands nothing over."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from flask.testing import FlaskClient
from wsnmom.core import errors
from wsnmom.core.config import Settings
from wsnmom.core.model import InboundNotification
from wsnmom.soap_frontend import create_app

from tests.soap_frontend.fake_service import FakeService
from tests.support.soap import content_type, envelope, notify_body, subscribe_body

KEY = "plant.k3y"


class Relay:
    def __init__(self) -> None:
        self.received: list[tuple[str, list[InboundNotification]]] = []

    def __call__(self, key: str, messages: Sequence[InboundNotification]) -> None:
        if key != KEY:
            raise errors.ResourceUnknown("no upstream subscription delivers here (any more)")
        self.received.append((key, list(messages)))


@pytest.fixture
def relay() -> Relay:
    return Relay()


@pytest.fixture
def client(relay: Relay) -> FlaskClient:
    settings = Settings(host="127.0.0.1")
    settings.auth.admin_token = "admin-secret"  # every other request must authenticate
    app = create_app(FakeService(), settings)
    app.extensions["wsnmom.soap"].relay = relay
    return app.test_client()


def _post(client: FlaskClient, path: str, body: str) -> tuple[int, bytes]:
    resp = client.post(path, data=envelope(body), content_type=content_type("1.2"))
    return resp.status_code, resp.data


def test_notify_reaches_the_relay_without_credentials(client: FlaskClient, relay: Relay) -> None:
    body = notify_body(("tns:plant/line1", "<n xmlns='urn:n'>1</n>"), ("tns:plant/line2", "<m/>"))
    assert _post(client, "/wsn/broker", body)[0] == 401  # the broker itself asks for them
    status, data = _post(client, f"/wsn/upstream/{KEY}", body)
    assert status == 202, data
    ((key, messages),) = relay.received
    assert key == KEY
    assert [m.topic.text if m.topic else None for m in messages] == [
        "tns:plant/line1",
        "tns:plant/line2",
    ]


def test_an_unknown_key_is_resource_unknown(client: FlaskClient, relay: Relay) -> None:
    status, data = _post(client, "/wsn/upstream/plant.old", notify_body(("tns:t", "<m/>")))
    assert status == 500 and b"ResourceUnknownFault" in data
    assert relay.received == []


def test_other_operations_are_refused(client: FlaskClient, relay: Relay) -> None:
    status, data = _post(client, f"/wsn/upstream/{KEY}", subscribe_body("http://c/x"))
    assert status == 500 and b"takes Notify only" in data
    assert relay.received == []


def test_a_gateway_without_a_relay_knows_no_key() -> None:
    app = create_app(FakeService(), Settings(host="127.0.0.1"))
    status = app.test_client().post(
        f"/wsn/upstream/{KEY}",
        data=envelope(notify_body(("tns:t", "<m/>"))),
        content_type=content_type("1.2"),
    )
    assert status.status_code == 500 and b"ResourceUnknownFault" in status.data
