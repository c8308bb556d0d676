"""The read-only admin API (``/wsn/admin/api/subscriptions``): who may read it, and what it
says about live subscriptions (with the real broker service on the embedded adapter)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from wsnmom.core.config import Settings
from wsnmom.core.model import EndpointReference, ExpressionSource, SubscribeRequest
from wsnmom.soap_frontend.app import create_app

from tests.soap_frontend.fake_service import FakeService
from wsnmom.server import Runtime, build_runtime

API = "/wsn/admin/api/subscriptions"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"


@pytest.mark.parametrize(
    ("remote", "headers"),
    [
        ("10.1.2.3", {}),
        ("192.168.0.7", {}),
        ("2001:db8::1", {}),
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}),
        ("127.0.0.1", {"Forwarded": "for=203.0.113.9"}),
        ("", {}),
    ],
)
def test_only_direct_loopback_clients(remote: str, headers: dict[str, str]) -> None:
    client = create_app(FakeService()).test_client()
    resp = client.get(API, headers=headers, environ_base={"REMOTE_ADDR": remote})
    assert resp.status_code == 403
    assert resp.json == {"error": "the admin interface answers loopback clients only"}


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
    )
    rt = build_runtime(settings)
    try:
        yield rt
    finally:
        rt.close()


def _client(runtime: Runtime, remote: str = "127.0.0.1") -> FlaskClient:
    client = runtime.app.test_client()
    client.environ_base["REMOTE_ADDR"] = remote
    return client


def test_lists_and_shows_live_subscriptions(runtime: Runtime) -> None:
    service = runtime.service
    assert _client(runtime).get(API).json == {"count": 0, "subscriptions": []}
    topic = ExpressionSource(SIMPLE, "t:a", {"t": "urn:t", "wsnt": "urn:unused"})
    first = service.subscribe(
        SubscribeRequest(EndpointReference("http://127.0.0.1:9/a"), topic=topic, use_raw=True)
    )
    second = service.subscribe(
        SubscribeRequest(
            EndpointReference("http://127.0.0.1:9/b"),
            initial_termination_time=timedelta(minutes=3),
        )
    )
    service.pause(second.id)
    for remote in ("127.0.0.1", "::1"):
        data = _client(runtime, remote).get(API).json
        assert data is not None and data["count"] == 2
    a, b = data["subscriptions"]
    assert a["id"] == first.id and b["id"] == second.id
    assert a["address"] == service.subscription_address(first.id)
    assert a["consumer"] == "http://127.0.0.1:9/a" and a["state"] == "active"
    assert a["topic"] == {"dialect": SIMPLE, "text": "t:a", "namespaces": {"t": "urn:t"}}
    assert a["use_raw"] is True and a["soap_version"] == "1.2" and a["pull_point"] is None
    assert b["state"] == "paused" and b["topic"] is None and b["terminates"].endswith("Z")

    one = _client(runtime).get(f"{API}/{first.id}").json
    assert one is not None and one["id"] == first.id and "pending" in one
    missing = _client(runtime).get(f"{API}/nope")
    assert missing.status_code == 404 and missing.json == {"error": "no subscription 'nope'"}

    service.unsubscribe(first.id)
    data = _client(runtime).get(API).json
    assert data is not None and [s["id"] for s in data["subscriptions"]] == [second.id]


def test_the_admin_api_keeps_soap_on_the_fast_path() -> None:
    """No request hook: a ``before_request`` function would send every SOAP request through
    Flask's slow path."""
    app = create_app(FakeService())
    assert not any(app.before_request_funcs.values())
    assert not any(app.after_request_funcs.values())
