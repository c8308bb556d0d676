"""Addresses that are no URLs (``http://[::1``, a port that is no number or too large)
get a precise fault wherever a request carries one: ConsumerReference, a demand-based
publisher's PublisherReference, and ``wsa:To`` on every endpoint; never an internal error.
The real broker service on the embedded adapter."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from wsnmom.core.config import Settings

from tests.support.soap import SIMPLE, content_type, envelope, fault_name, subscribe_body
from wsnmom.server import Runtime, build_runtime

BAD_URLS = ["http://[::1", "http://[::1]:99999/x", "http://host:x/y", "http://host:70000/"]
WSRF_RL = "http://docs.oasis-open.org/wsrf/rl-2"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    tmp: Path = tmp_path_factory.mktemp("addresses")
    rt = build_runtime(
        Settings(adapter_url=f"embedded://{tmp / 'mw'}", store_url=f"sqlite:///{tmp / 's.db'}")
    )
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture
def client(runtime: Runtime, caplog: pytest.LogCaptureFixture) -> Iterator[FlaskClient]:
    with caplog.at_level(logging.ERROR):
        yield runtime.app.test_client()
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


def _post(client: FlaskClient, path: str, body: str, to: str | None = None) -> tuple[int, str]:
    resp = client.post(path, data=envelope(body, to=to), content_type=content_type())
    return resp.status_code, fault_name(resp.data) if resp.status_code != 200 else ""


@pytest.mark.parametrize("address", BAD_URLS)
def test_consumer_reference(client: FlaskClient, address: str) -> None:
    resp = client.post(
        "/wsn/broker", data=envelope(subscribe_body(address)), content_type=content_type()
    )
    assert resp.status_code == 500 and fault_name(resp.data) == "SubscribeCreationFailedFault"
    # the outbound policy's reason: the URL is malformed, or its port is
    assert b"not a URL" in resp.data or b"bad port" in resp.data


@pytest.mark.parametrize("address", BAD_URLS)
def test_demand_publisher_reference(client: FlaskClient, address: str) -> None:
    body = (
        "<wsn-br:RegisterPublisher><wsn-br:PublisherReference>"
        f"<wsa:Address>{address}</wsa:Address></wsn-br:PublisherReference>"
        f'<wsn-br:Topic Dialect="{SIMPLE}" xmlns:t="urn:t">t:a</wsn-br:Topic>'
        "<wsn-br:Demand>true</wsn-br:Demand></wsn-br:RegisterPublisher>"
    )
    assert _post(client, "/wsn/broker", body) == (500, "PublisherRegistrationRejectedFault")


@pytest.mark.parametrize(
    ("path", "body", "fault"),
    [
        ("/wsn/broker", "<wsnt:GetMessages/>", "ResourceUnknownFault"),
        ("/wsn/broker", "<wsnt:Unsubscribe/>", "ResourceUnknownFault"),
        ("/wsn/broker", f'<rl:Destroy xmlns:rl="{WSRF_RL}"/>', "ResourceUnknownFault"),
        (
            "/wsn/subscriptions/nope",
            "<wsnt:Renew><wsnt:TerminationTime>PT1M</wsnt:TerminationTime></wsnt:Renew>",
            "ResourceUnknownFault",
        ),
        ("/wsn/broker", "<wsnt:CreatePullPoint/>", ""),  # To is not needed: it is ignored
    ],
)
def test_wsa_to(client: FlaskClient, path: str, body: str, fault: str) -> None:
    status, name = _post(client, path, body, to="http://[::1/wsn/pullpoints/x")
    assert name == fault and status == (500 if fault else 200)
