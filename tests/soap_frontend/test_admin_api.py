"""The admin API (``/wsn/admin/api/...``) and the page's files: who may read (loopback
clients, admins), who may act (admins; from a browser session only with the page's origin
and CSRF token), what the API says about live resources (the real broker service on the
embedded adapter), and the admin token setting."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from wsnmom.core.config import ConfigError, Settings, load_settings
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    SubscribeRequest,
)
from wsnmom.soap_frontend.admin_auth import SESSION_COOKIE, TokenIdentity
from wsnmom.soap_frontend.app import create_app

from tests.soap_frontend.fake_service import FakeService
from wsnmom.server import Runtime, build_runtime

API = "/wsn/admin/api"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
TOKEN = "an-admin-token-for-tests-0123"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ORIGIN = "http://localhost"  # the Flask test client's host


@pytest.mark.parametrize(
    ("remote", "headers"),
    [
        ("10.1.2.3", {}),
        ("192.168.0.7", {}),
        ("2001:db8::1", {}),
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}),
        ("127.0.0.1", {"Forwarded": "for=203.0.113.9"}),
        ("", {}),
        ("10.1.2.3", {"Authorization": "Bearer not-the-token-at-all-0000"}),
    ],
)
def test_only_direct_loopback_clients_and_admins_read(remote: str, headers: dict[str, str]) -> None:
    app = create_app(FakeService(), identity=TokenIdentity(TOKEN))
    client = app.test_client()
    for path in ("/subscriptions", "/overview", "/subscriptions/x"):
        resp = client.get(API + path, headers=headers, environ_base={"REMOTE_ADDR": remote})
        assert resp.status_code == 403
        assert resp.json == {
            "error": "the admin API answers loopback clients and signed-in admins only"
        }


def _topic(text: str = "t:a") -> ExpressionSource:
    return ExpressionSource(SIMPLE, text, {"t": "urn:t", "wsnt": "urn:unused"})


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
    )
    settings.admin.token = TOKEN
    settings.retry.initial_delay = timedelta(seconds=30)  # a failure stays visible
    rt = build_runtime(settings)
    try:
        yield rt
    finally:
        rt.close()


def _client(runtime: Runtime, remote: str = "127.0.0.1") -> FlaskClient:
    client = runtime.app.test_client()
    client.environ_base["REMOTE_ADDR"] = remote
    return client


def _subscribe(runtime: Runtime, consumer: str = "http://127.0.0.1:9/a", **kw: object) -> str:
    req = SubscribeRequest(EndpointReference(consumer), topic=_topic(), **kw)  # type: ignore[arg-type]
    return runtime.service.subscribe(req).id


def test_lists_and_shows_live_subscriptions(runtime: Runtime) -> None:
    service = runtime.service
    assert _client(runtime).get(API + "/subscriptions").json == {"count": 0, "subscriptions": []}
    first = _subscribe(runtime, use_raw=True)
    second = service.subscribe(
        SubscribeRequest(
            EndpointReference("http://127.0.0.1:9/b"),
            initial_termination_time=timedelta(minutes=3),
        )
    ).id
    service.pause(second)
    for remote in ("127.0.0.1", "::1"):
        data = _client(runtime, remote).get(API + "/subscriptions").json
        assert data is not None and data["count"] == 2
    a, b = data["subscriptions"]
    assert a["id"] == first and b["id"] == second
    assert a["address"] == service.subscription_address(first)
    assert a["consumer"] == "http://127.0.0.1:9/a" and a["state"] == "active"
    assert a["topic"] == {"dialect": SIMPLE, "text": "t:a", "namespaces": {"t": "urn:t"}}
    assert a["use_raw"] is True and a["soap_version"] == "1.2" and a["pull_point"] is None
    assert b["state"] == "paused" and b["topic"] is None and b["terminates"].endswith("Z")

    one = _client(runtime).get(f"{API}/subscriptions/{first}").json
    assert one is not None and one["id"] == first and one["pending"] == 0
    assert one["mode"] == "push" and one["delivery"]["failures"] >= 0
    missing = _client(runtime).get(f"{API}/subscriptions/nope")
    assert missing.status_code == 404 and missing.json == {"error": "no subscription 'nope'"}

    service.unsubscribe(first)
    data = _client(runtime).get(API + "/subscriptions").json
    assert data is not None and [s["id"] for s in data["subscriptions"]] == [second]


def test_overview(runtime: Runtime) -> None:
    service = runtime.service
    paused = _subscribe(runtime)
    service.pause(paused)
    pp = service.create_pull_point(CreatePullPointRequest(name="inbox"))
    service.notify([InboundNotification(b"<m/>", _topic()) for _ in range(3)])
    service.notify_pull_point(pp.id, [InboundNotification(b"<p/>", _topic())])
    data = _client(runtime).get(API + "/overview").json
    assert data is not None
    assert data["broker"] == service.broker_address
    assert data["health"] == {
        "adapter": "embedded",
        "url": runtime.settings.adapter_url,
        "shape": "queue",
        "available": True,
        "answers": True,
        "started": True,
        "ready": True,
    }
    totals = data["totals"]
    assert totals["subscriptions"] == 1 and totals["paused"] == 1 and totals["pull_points"] == 1
    assert totals["messages"] == 3 and totals["topics"] == 1 and totals["backlog"] == 4
    (sub,) = data["subscriptions"]
    assert sub["id"] == paused and sub["state"] == "paused" and sub["backlog"] == 3
    assert sub["delivery"]["active"] is False
    (pull_point,) = data["pull_points"]
    assert pull_point["name"] == "inbox" and pull_point["waiting"] == 1
    (topic,) = data["topics"]
    assert topic["topic"] == "{urn:t}a" and topic["messages"] == 3 and topic["rate"] > 0
    assert _client(runtime).get(API + "/overview?limit=x").status_code == 400


def test_a_remote_admin_reads_with_the_token(runtime: Runtime) -> None:
    client = _client(runtime, "10.1.2.3")
    assert client.get(API + "/overview").status_code == 403
    assert client.get(API + "/overview", headers=BEARER).status_code == 200
    assert client.get(API + "/session", headers=BEARER).json == {
        "admin": True,
        "caller": "admin",
        "read": True,
        "sign_in": True,
        "csrf": None,
    }
    assert client.get(API + "/session").json == {
        "admin": False,
        "caller": "anonymous",
        "read": False,
        "sign_in": True,
        "csrf": None,
    }


def _state(runtime: Runtime, sub_id: str) -> str:
    data = _client(runtime).get(f"{API}/subscriptions/{sub_id}").json
    assert data is not None
    return str(data["state"])


def test_actions_need_an_admin(runtime: Runtime) -> None:
    sub_id = _subscribe(runtime)
    client = _client(runtime)  # loopback: may read, may not act
    for action in ("pause", "resume", "unsubscribe", "purge"):
        resp = client.post(f"{API}/subscriptions/{sub_id}/{action}")
        assert resp.status_code == 403
        assert resp.json == {"error": "this needs an admin: sign in on the admin page"}
    assert _state(runtime, sub_id) == "active"
    assert client.get(f"{API}/subscriptions/{sub_id}/pause").status_code == 405  # never GET
    wrong = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
    assert client.post(f"{API}/subscriptions/{sub_id}/pause", headers=wrong).status_code == 403


def test_a_program_acts_with_the_bearer_token(runtime: Runtime) -> None:
    service = runtime.service
    sub_id = _subscribe(runtime)
    client = _client(runtime, "10.1.2.3")
    resp = client.post(f"{API}/subscriptions/{sub_id}/pause", headers=BEARER)
    assert resp.status_code == 200
    assert resp.json == {"ok": True, "action": "pause", "subscription": sub_id}
    assert _state(runtime, sub_id) == "paused"
    service.notify([InboundNotification(b"<m/>", _topic()) for _ in range(4)])
    purged = client.post(f"{API}/subscriptions/{sub_id}/purge", headers=BEARER).json
    assert purged == {"ok": True, "action": "purge", "subscription": sub_id, "purged": 4}
    assert client.post(f"{API}/subscriptions/{sub_id}/resume", headers=BEARER).status_code == 200
    assert _state(runtime, sub_id) == "active"
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [InboundNotification(b"<p/>", _topic())])
    resp = client.post(f"{API}/pullpoints/{pp.id}/purge", headers=BEARER)
    assert resp.json == {"ok": True, "action": "purge", "pull_point": pp.id, "purged": 1}
    assert client.post(f"{API}/subscriptions/{sub_id}/unsubscribe", headers=BEARER).json == {
        "ok": True,
        "action": "unsubscribe",
        "subscription": sub_id,
    }
    gone = client.post(f"{API}/subscriptions/{sub_id}/pause", headers=BEARER)
    assert gone.status_code == 404 and gone.json == {"error": f"no subscription {sub_id!r}"}
    assert client.post(f"{API}/subscriptions/x/explode", headers=BEARER).status_code == 404
    assert client.post(f"{API}/pullpoints/nope/purge", headers=BEARER).status_code == 404


def _sign_in(client: FlaskClient) -> str:
    resp = client.post(API + "/session", json={"token": TOKEN}, headers={"Origin": ORIGIN})
    assert resp.status_code == 200, resp.json
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie and "Secure" not in cookie and "Path=/" in cookie
    assert resp.json is not None and resp.json["admin"] is True
    return str(resp.json["csrf"])


def test_a_browser_session_needs_the_pages_origin_and_csrf_token(runtime: Runtime) -> None:
    sub_id = _subscribe(runtime)
    client = _client(runtime, "10.1.2.3")
    csrf = _sign_in(client)
    assert client.get(API + "/session").json == {
        "admin": True,
        "caller": "admin",
        "read": True,
        "sign_in": True,
        "csrf": csrf,
    }
    assert client.get(API + "/overview").status_code == 200
    pause = f"{API}/subscriptions/{sub_id}/pause"
    wrong = csrf[:-1] + ("1" if csrf.endswith("0") else "0")
    refusals = [
        ({"Origin": ORIGIN}, "refused: missing or wrong X-CSRF-Token"),
        ({"Origin": ORIGIN, "X-CSRF-Token": wrong}, "missing or wrong X-CSRF-Token"),
        ({"X-CSRF-Token": csrf}, "does not come from the admin page"),  # no Origin/Referer
        ({"Origin": "http://evil.example", "X-CSRF-Token": csrf}, "does not come from"),
        ({"Origin": "null", "X-CSRF-Token": csrf}, "does not come from"),
        ({"Referer": "http://localhost:81/admin", "X-CSRF-Token": csrf}, "does not come from"),
    ]
    for headers, error in refusals:
        resp = client.post(pause, headers=headers)
        assert resp.status_code == 403 and error in resp.json["error"], (headers, resp.json)
    assert _state(runtime, sub_id) == "active"
    ok = client.post(pause, headers={"Referer": ORIGIN + "/admin", "X-CSRF-Token": csrf})
    assert ok.status_code == 200 and _state(runtime, sub_id) == "paused"

    out = client.post(API + "/session/end", headers={"Origin": ORIGIN})
    assert out.status_code == 200 and f"{SESSION_COOKIE}=;" in out.headers["Set-Cookie"]
    resume = client.post(
        f"{API}/subscriptions/{sub_id}/resume", headers={"Origin": ORIGIN, "X-CSRF-Token": csrf}
    )
    assert resume.status_code == 403 and _state(runtime, sub_id) == "paused"
    assert client.get(API + "/overview").status_code == 403


def test_signing_in(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client(runtime, "10.1.2.3")
    resp = client.post(API + "/session", json={"token": TOKEN})  # no Origin: a forged form
    assert resp.status_code == 403 and "Set-Cookie" not in resp.headers
    wrong = client.post(API + "/session", json={"token": "guess"}, headers={"Origin": ORIGIN})
    assert wrong.status_code == 403 and wrong.json == {"error": "wrong admin token"}
    for _ in range(TokenIdentity.MAX_FAILURES_PER_MINUTE - 1):
        client.post(API + "/session", data={"token": "guess"}, headers={"Origin": ORIGIN})
    throttled = client.post(API + "/session", json={"token": TOKEN}, headers={"Origin": ORIGIN})
    assert throttled.status_code == 429 and "wait a minute" in throttled.json["error"]


def test_sessions_expire() -> None:
    now = [0.0]
    identity = TokenIdentity(TOKEN, session_lifetime=60, clock=lambda: now[0])
    session = identity.sign_in(TOKEN)
    environ = {"HTTP_COOKIE": f"{SESSION_COOKIE}={session}"}
    assert identity.caller(environ).admin
    now[0] = 61
    assert not identity.caller(environ).admin


def test_without_a_token_nobody_is_an_admin(tmp_path: Path) -> None:
    app = create_app(FakeService())
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
    assert client.get(API + "/session").json == {
        "admin": False,
        "caller": "anonymous",
        "read": True,
        "sign_in": False,
        "csrf": None,
    }
    resp = client.post(API + "/session", json={"token": ""}, headers={"Origin": ORIGIN})
    assert resp.status_code == 403 and "admin.token" in resp.json["error"]
    resp = client.post(API + "/subscriptions/x/pause", headers={"Authorization": "Bearer "})
    assert resp.status_code == 403


def test_behind_a_trusted_tls_proxy(tmp_path: Path) -> None:
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        trusted_proxies=["127.0.0.1"],
    )
    settings.admin.token = TOKEN
    rt = build_runtime(settings)
    try:
        client = rt.app.test_client()
        client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
        forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "wsn.example.org"}
        resp = client.post(
            API + "/session",
            json={"token": TOKEN},
            headers={**forwarded, "Origin": "https://wsn.example.org"},
        )
        assert resp.status_code == 200 and "Secure" in resp.headers["Set-Cookie"]
        plain = client.post(
            API + "/session",
            json={"token": TOKEN},
            headers={**forwarded, "Origin": "http://wsn.example.org"},
        )
        assert plain.status_code == 403
    finally:
        rt.close()


# --- the page -----------------------------------------------------------------------------------
def test_the_page_and_its_files_come_from_the_package() -> None:
    client = create_app(FakeService()).test_client()
    page = client.get("/admin")
    assert page.status_code == 200 and page.mimetype == "text/html"
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp and page.headers["X-Frame-Options"] == "DENY"
    html = page.get_data(as_text=True)
    links = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sorted(links) == ["admin/admin.css", "admin/admin.js", "data:,"]
    for name, mimetype in (("admin.js", "text/javascript"), ("admin.css", "text/css")):
        resp = client.get(f"/admin/{name}")
        assert resp.status_code == 200 and resp.mimetype == mimetype
        text = resp.get_data(as_text=True)
        assert "@import" not in text and "url(" not in text and "//cdn" not in text
    assert client.get("/admin/other.js").status_code == 404
    slash = client.get("/admin/")
    assert slash.status_code == 308 and slash.headers["Location"] == "../admin"


def test_the_admin_views_keep_soap_on_the_fast_path() -> None:
    """No request hook: a ``before_request`` function would send every SOAP request through
    Flask's slow path."""
    app = create_app(FakeService())
    assert not any(app.before_request_funcs.values())
    assert not any(app.after_request_funcs.values())
    assert app.secret_key is None  # Flask sessions would take it off the fast path too


# --- the setting ----------------------------------------------------------------------------
def test_the_admin_token_is_never_shown() -> None:
    short = "WSNMOM_ADMIN__TOKEN"
    with pytest.raises(ConfigError) as info:
        load_settings(environ={short: "tiny-secret"}, warn=lambda m: None)
    assert str(info.value).startswith(f"{short}=***: admin.token: too short")
    assert "tiny-secret" not in str(info.value)
    settings = load_settings(environ={short: TOKEN}, warn=lambda m: None)
    assert settings.admin.token == TOKEN
    assert settings.origin("admin.token") == f"{short}=***"
    assert TOKEN not in repr(settings)
