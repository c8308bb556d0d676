"""The admin API (``/wsn/admin/api/...``) and the page's files: who may read (admins;
without authentication, direct loopback clients), who may act (authenticated admins; from
a browser only with the page's origin, from a session also its CSRF token), the page's
sign-in, and what the API says about live resources (the real broker service on the
embedded adapter)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from wsnmom.core.config import Settings
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    SubscribeRequest,
)
from wsnmom.soap_frontend import passwords
from wsnmom.soap_frontend.admin_auth import SESSION_COOKIE, AdminSessions, SignInRefused
from wsnmom.soap_frontend.app import create_app

from tests.soap_frontend.fake_service import FakeService
from tests.support.waiting import wait_until
from wsnmom.server import Runtime, build_runtime

API = "/wsn/admin/api"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
TOKEN = "an-admin-token-for-tests-0123"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ORIGIN = "http://localhost"  # the Flask test client's host
CHEAP = {"n": 2**4}


def _basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


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
def test_without_authentication_only_direct_loopback_clients_read(
    remote: str, headers: dict[str, str]
) -> None:
    client = create_app(FakeService()).test_client()
    for path in ("/subscriptions", "/overview", "/subscriptions/x"):
        resp = client.get(API + path, headers=headers, environ_base={"REMOTE_ADDR": remote})
        assert resp.status_code == 403
        assert resp.json == {"error": "the admin interface answers loopback clients only"}


def _topic(text: str = "t:a") -> ExpressionSource:
    return ExpressionSource(SIMPLE, text, {"t": "urn:t", "wsnt": "urn:unused"})


def _runtime(tmp_path: Path, **auth: Any) -> Runtime:
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
    )
    for key, value in auth.items():
        setattr(settings.auth, key, value)
    settings.retry.initial_delay = timedelta(seconds=30)  # a failure stays visible
    return build_runtime(settings)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """Authentication on: the admin token, and a credentials file with a non-admin."""
    users = tmp_path / "users.toml"
    users.write_text(f'[users.bob]\npassword = "{passwords.hash_password("pw", **CHEAP)}"\n')
    users.chmod(0o600)
    rt = _runtime(tmp_path, admin_token=TOKEN, users_file=str(users))
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture
def open_runtime(tmp_path: Path) -> Iterator[Runtime]:
    """Authentication off (the gateway listens on loopback only)."""
    rt = _runtime(tmp_path)
    try:
        yield rt
    finally:
        rt.close()


def _client(runtime: Runtime, remote: str = "127.0.0.1") -> FlaskClient:
    client = runtime.app.test_client()
    client.environ_base["REMOTE_ADDR"] = remote
    return client


def _subscribe(runtime: Runtime, consumer: str = "http://127.0.0.1:9/a", **kw: Any) -> str:
    req = SubscribeRequest(EndpointReference(consumer), topic=_topic(), **kw)
    return runtime.service.subscribe(req).id


def _state(runtime: Runtime, sub_id: str) -> str:
    data = _client(runtime).get(f"{API}/subscriptions/{sub_id}", headers=BEARER).json
    assert data is not None
    return str(data["state"])


def test_lists_and_shows_live_subscriptions(open_runtime: Runtime) -> None:
    runtime = open_runtime
    service = runtime.service
    assert _client(runtime).get(API + "/subscriptions").json == {
        "count": 0,
        "total": 0,
        "offset": 0,
        "limit": None,
        "subscriptions": [],
    }
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
    assert a["wsn_version"] == "1.3"
    assert a["mode"] == "push" and a["backlog"] == 0 and a["delivery"]["failures"] == 0
    assert b["state"] == "paused" and b["topic"] is None and b["terminates"].endswith("Z")

    one = _client(runtime).get(f"{API}/subscriptions/{first}").json
    assert one is not None and one["id"] == first and one["pending"] == 0
    missing = _client(runtime).get(f"{API}/subscriptions/nope")
    assert missing.status_code == 404 and missing.json == {"error": "no subscription 'nope'"}

    service.unsubscribe(first)
    data = _client(runtime).get(API + "/subscriptions").json
    assert data is not None and [s["id"] for s in data["subscriptions"]] == [second]


def test_overview(open_runtime: Runtime) -> None:
    runtime = open_runtime
    service = runtime.service
    paused = _subscribe(runtime)
    service.pause(paused)
    pp = service.create_pull_point(CreatePullPointRequest(name="inbox"))
    service.notify([InboundNotification(b"<m/>", _topic()) for _ in range(3)])
    service.notify_pull_point(pp.id, [InboundNotification(b"<p/>", _topic())])
    data = _client(runtime).get(API + "/overview").json
    assert data is not None
    assert data["broker"] == service.broker_address
    health = data["health"]
    assert isinstance(health.pop("disk_free"), int) and health.pop("disk_low") == ""
    assert health == {
        "adapter": "embedded",
        "url": runtime.settings.adapter_url,
        "shape": "queue",
        "available": True,
        "answers": True,
        "started": True,
        "ready": True,
        "reason": "",
        "store_reason": "",
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


def test_without_authentication_the_local_operator_acts_on_a_loopback_listener(
    open_runtime: Runtime,
) -> None:
    """Without authentication, on a gateway listening on loopback only, a client on its
    host acts (as RabbitMQ's guest user on localhost); not through a name a web page
    rebound to 127.0.0.1, nor from another address; nobody signs in."""
    sub_id = _subscribe(open_runtime)
    client = _client(open_runtime)
    assert client.get(API + "/session").json == {
        "admin": False,
        "act": True,
        "caller": "anonymous",
        "read": True,
        "sign_in": False,
        "csrf": None,
    }
    pause = f"{API}/subscriptions/{sub_id}/pause"
    # a name rebound to 127.0.0.1 is refused before the admin API by the Host check (421)
    rebound = client.post(pause, headers={"Host": "rebound.example:8080"})
    assert rebound.status_code == 421
    remote = _client(open_runtime, "10.1.2.3").post(pause)
    assert remote.status_code == 403
    forged = client.post(pause, headers={"Origin": "https://elsewhere.example"})
    assert forged.status_code == 403
    assert client.get(f"{API}/subscriptions/{sub_id}").json["state"] == "active"
    resp = client.post(pause, headers={"Origin": ORIGIN})
    assert resp.status_code == 200 and resp.json == {
        "ok": True,
        "action": "pause",
        "subscription": sub_id,
    }
    assert client.get(f"{API}/subscriptions/{sub_id}").json["state"] == "paused"
    assert client.post(f"{API}/subscriptions/{sub_id}/purge").json["purged"] == 0
    signing = client.post(API + "/session", json={"token": "x"}, headers={"Origin": ORIGIN})
    assert signing.status_code == 403 and "auth.admin_token" in signing.json["error"]


def test_without_authentication_nobody_acts_on_another_listener(tmp_path: Path) -> None:
    """On a gateway listening beyond loopback (authentication off on purpose), local
    clients still read, but actions need an authenticated admin."""
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        host="0.0.0.0",
    )
    settings.auth.required = "false"
    runtime = build_runtime(settings)
    try:
        sub_id = _subscribe(runtime)
        client = _client(runtime)
        assert client.get(API + "/session").json["act"] is False
        resp = client.post(f"{API}/subscriptions/{sub_id}/pause", headers={"Origin": ORIGIN})
        assert resp.status_code == 403 and "authenticated admin" in resp.json["error"]
        assert client.get(f"{API}/subscriptions/{sub_id}").json["state"] == "active"
    finally:
        runtime.close()


def test_with_authentication_reading_needs_an_admin(runtime: Runtime) -> None:
    local = _client(runtime)  # being local is no identity once authentication is on
    anonymous = local.get(API + "/overview")
    assert anonymous.status_code == 401 and anonymous.json == {"error": "authentication required"}
    assert "Basic" in anonymous.headers["WWW-Authenticate"]
    page = local.get(API + "/overview", headers={"X-Requested-With": "wsnmom-admin"})
    assert page.status_code == 401 and "WWW-Authenticate" not in page.headers
    wrong = local.get(API + "/overview", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json == {"error": "wrong credentials"}
    bob = local.get(API + "/overview", headers=_basic("bob", "pw"))
    assert bob.status_code == 403 and bob.json == {"error": "an admin identity is required"}
    remote = _client(runtime, "10.1.2.3")
    for creds in (BEARER, _basic("admin", TOKEN)):
        assert remote.get(API + "/overview", headers=creds).status_code == 200
    assert remote.get(API + "/session", headers=BEARER).json == {
        "admin": True,
        "act": True,
        "caller": "admin",
        "read": True,
        "sign_in": True,
        "csrf": None,
    }


def test_actions_need_an_authenticated_admin(runtime: Runtime) -> None:
    sub_id = _subscribe(runtime)
    client = _client(runtime)
    for action in ("pause", "resume", "unsubscribe", "purge"):
        resp = client.post(f"{API}/subscriptions/{sub_id}/{action}")
        assert resp.status_code == 401 and resp.json == {"error": "authentication required"}
        bob = client.post(f"{API}/subscriptions/{sub_id}/{action}", headers=_basic("bob", "pw"))
        assert bob.status_code == 403 and bob.json == {"error": "an admin identity is required"}
    assert _state(runtime, sub_id) == "active"
    assert client.get(f"{API}/subscriptions/{sub_id}/pause", headers=BEARER).status_code == 405


def test_a_program_acts_with_its_credentials(runtime: Runtime) -> None:
    service = runtime.service
    sub_id = _subscribe(runtime)
    client = _client(runtime, "10.1.2.3")
    resp = client.post(f"{API}/subscriptions/{sub_id}/pause", headers=BEARER)
    assert resp.status_code == 200
    assert resp.json == {"ok": True, "action": "pause", "subscription": sub_id}
    assert _state(runtime, sub_id) == "paused"
    service.notify([InboundNotification(b"<m/>", _topic()) for _ in range(4)])
    purged = client.post(f"{API}/subscriptions/{sub_id}/purge", headers=_basic("admin", TOKEN))
    assert purged.json == {"ok": True, "action": "purge", "subscription": sub_id, "purged": 4}
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


def test_credentials_a_browser_sends_by_itself_need_the_pages_origin(runtime: Runtime) -> None:
    """A remembered Basic password goes with a forged cross-site POST too: such a request
    carries a foreign Origin and is refused."""
    sub_id = _subscribe(runtime)
    client = _client(runtime)
    pause = f"{API}/subscriptions/{sub_id}/pause"
    basic = _basic("admin", TOKEN)
    for where in ({"Origin": "http://evil.example"}, {"Referer": "http://evil.example/x"}):
        resp = client.post(pause, headers={**basic, **where})
        assert resp.status_code == 403 and "does not come from the admin page" in resp.json["error"]
    assert _state(runtime, sub_id) == "active"
    assert client.post(pause, headers={**basic, "Origin": ORIGIN}).status_code == 200


def _sign_in(client: FlaskClient, **form: str) -> str:
    resp = client.post(API + "/session", json=form or {"token": TOKEN}, headers={"Origin": ORIGIN})
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
        "act": True,
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
    assert resume.status_code == 401 and _state(runtime, sub_id) == "paused"
    assert client.get(API + "/overview").status_code == 401


def test_signing_in(runtime: Runtime) -> None:
    client = _client(runtime, "10.1.2.3")
    resp = client.post(API + "/session", json={"token": TOKEN})  # no Origin: a forged form
    assert resp.status_code == 403 and "Set-Cookie" not in resp.headers
    _sign_in(client, user="admin", password=TOKEN)  # the admin's Basic pair works too
    not_admin = client.post(
        API + "/session", json={"user": "bob", "password": "pw"}, headers={"Origin": ORIGIN}
    )
    assert not_admin.status_code == 403 and not_admin.json == {"error": "bob is not an admin"}
    wrong = client.post(API + "/session", json={"token": "guess"}, headers={"Origin": ORIGIN})
    assert wrong.status_code == 403 and wrong.json == {"error": "wrong credentials"}
    for _ in range(AdminSessions.MAX_FAILURES_PER_MINUTE - 1):
        client.post(API + "/session", data={"token": "guess"}, headers={"Origin": ORIGIN})
    throttled = client.post(API + "/session", json={"token": TOKEN}, headers={"Origin": ORIGIN})
    assert throttled.status_code == 429 and "wait a minute" in throttled.json["error"]


def test_a_guesser_locks_out_only_itself(runtime: Runtime) -> None:
    """Issue 22 item 8: 10 wrong admin sign-ins from anyone locked the right admin token
    out (429) for a minute.  Failures now count per client address (and identity)."""
    guesser = _client(runtime, "10.1.2.3")
    for _ in range(AdminSessions.MAX_FAILURES_PER_MINUTE):
        wrong = guesser.post(API + "/session", json={"token": "guess"}, headers={"Origin": ORIGIN})
        assert wrong.status_code == 403
    refused = guesser.post(API + "/session", json={"token": TOKEN}, headers={"Origin": ORIGIN})
    assert refused.status_code == 429
    _sign_in(_client(runtime, "10.9.9.9"))  # the admin, from elsewhere: signed in
    # the guesser may try other names, up to its own limit over all of them
    for i in range(AdminSessions.MAX_CLIENT_FAILURES_PER_MINUTE - 10):
        wrong = guesser.post(
            API + "/session",
            json={"user": f"u{i % 3}", "password": "x"},
            headers={"Origin": ORIGIN},
        )
        assert wrong.status_code == 403, i
    for form in ({"user": "admin", "password": "x"}, {"token": "guess"}):
        resp = guesser.post(API + "/session", json=form, headers={"Origin": ORIGIN})
        assert resp.status_code == 429
    _sign_in(_client(runtime, "10.9.9.9"), user="admin", password=TOKEN)


def test_sign_in_failures_behind_a_trusted_proxy_count_per_forwarded_client() -> None:
    """Behind a proxy every client has the proxy's address: the forwarded one counts."""
    from wsnmom.soap_frontend.public_base import client_address

    proxy = {"REMOTE_ADDR": "10.0.0.5"}
    assert client_address(
        {**proxy, "HTTP_X_FORWARDED_FOR": "1.2.3.4, 192.0.2.7"}, ["10.0.0.5"]
    ) == ("192.0.2.7")
    forwarded = {**proxy, "HTTP_FORWARDED": 'for="[2001:db8::7]:4711";proto=https'}
    assert client_address(forwarded, ["10.0.0.0/8"]) == "2001:db8::7"
    assert client_address({**proxy, "HTTP_X_FORWARDED_FOR": "192.0.2.7"}, []) == "10.0.0.5"
    assert (
        client_address(
            {"REMOTE_ADDR": "192.0.2.9", "HTTP_X_FORWARDED_FOR": "1.1.1.1"}, ["10.0.0.5"]
        )
        == "192.0.2.9"
    )
    now = [0.0]
    sessions = AdminSessions(60, clock=lambda: now[0])
    from wsnmom.core.access import ANONYMOUS

    def wrong(environ: Any) -> Any:
        return ANONYMOUS

    for _ in range(AdminSessions.MAX_FAILURES_PER_MINUTE):
        with pytest.raises(SignInRefused):
            sessions.sign_in(wrong, "Bearer guess", "192.0.2.7")
    with pytest.raises(SignInRefused) as info:
        sessions.sign_in(wrong, "Bearer guess", "192.0.2.7")
    assert info.value.status == 429
    now[0] = 61  # a minute later the client may try again
    with pytest.raises(SignInRefused) as info:
        sessions.sign_in(wrong, "Bearer guess", "192.0.2.7")
    assert info.value.status == 403


def test_sessions_expire() -> None:
    from wsnmom.core.access import Principal

    now = [0.0]
    sessions = AdminSessions(60, clock=lambda: now[0])
    admin = Principal("admin", admin=True, method="bearer")
    session, principal = sessions.sign_in(lambda environ: admin, "Bearer x")
    assert principal is admin and sessions.principal(session) is admin
    now[0] = 61
    assert sessions.principal(session) is None


def test_behind_a_trusted_tls_proxy(tmp_path: Path) -> None:
    settings = Settings(
        adapter_url=f"embedded://{tmp_path / 'mw'}",
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        trusted_proxies=["127.0.0.1"],
    )
    settings.auth.admin_token = TOKEN
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
    # its own files only (links back to the page itself, from a subscription's page and
    # from a peek, the page's dead-letter peek, and the charts the gateway draws)
    charts = [f"wsn/admin/api/charts/{n}.svg" for n in ("notifications", "deliveries")]
    charts += [f"wsn/admin/api/charts/{n}.svg" for n in ("failures", "backlog")]
    own = ["admin", "admin", "admin?peek=dead-letters", "admin/admin.css", "admin/admin.js"]
    assert sorted(links) == sorted([*own, "data:,", *charts])
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


def test_the_page_is_served_with_its_values(open_runtime: Runtime) -> None:
    """Without JavaScript (and before the first refresh) the page shows the values: the
    server fills them in for a caller who may read; topics show their namespace."""
    from lxml import html

    sub_id = _subscribe(open_runtime)
    open_runtime.service.pause(sub_id)
    client = _client(open_runtime)
    page = client.get("/admin")
    assert page.status_code == 200
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    doc = html.document_fromstring(page.data)

    def text(element_id: str) -> str:
        return str(doc.get_element_by_id(element_id).text_content()).strip()

    assert "hidden" not in doc.get_element_by_id("content").attrib
    assert text("health-adapter") == "embedded (queue)"
    assert text("health-ready") == "yes"
    assert text("total-subscriptions") == "1"
    assert text("total-states") == "1 paused, 0 failing"
    assert text("role") == "local operator"
    (row,) = doc.xpath(f'//table[@id="subscriptions"]/tbody/tr[@data-key="{sub_id}"]')
    cells = [c.text_content() for c in row]
    assert cells[2] == "t:a  (t = urn:t)" and cells[3] == "paused"
    assert "-" not in (text("total-backlog"), text("total-pull-points"))
    assert text("node-memory").endswith("MB") and int(text("node-threads")) >= 1
    assert text("node-store").endswith("B") and text("node-store") != "?"
    # nobody else gets values: the page without them
    remote = _client(open_runtime, "10.1.2.3").get("/admin")
    assert remote.status_code == 200
    remote_doc = html.document_fromstring(remote.data)
    assert remote_doc.get_element_by_id("total-subscriptions").text_content() == "-"
    assert sub_id.encode() not in remote.data


def test_the_overview_says_what_the_node_uses(open_runtime: Runtime) -> None:
    """Memory, open files, threads and the store's size of the gateway process."""
    import os
    import threading

    node = _client(open_runtime).get(API + "/overview").json["node"]
    assert node["pid"] == os.getpid()
    assert node["memory"] > 10_000_000  # resident bytes of a Python process with the app
    assert node["open_files"] >= 3  # at least stdin, stdout, stderr
    assert node["threads"] >= threading.active_count() >= 1
    assert node["python_threads"] >= 1
    store = open_runtime.settings.store_url.removeprefix("sqlite:///")
    assert node["store_bytes"] >= os.path.getsize(store) > 0


def test_subscriptions_are_searched_sorted_and_paged_on_the_server(
    open_runtime: Runtime,
) -> None:
    ids = {
        n: _subscribe(open_runtime, f"http://127.0.0.1:9/{'plc' if n % 3 else 'scada'}-{n:02d}")
        for n in range(12)
    }
    open_runtime.service.pause(ids[4])
    client = _client(open_runtime)

    def query(**args: object) -> dict[str, Any]:
        resp = client.get(API + "/subscriptions", query_string=args)
        assert resp.status_code == 200, resp.json
        data = resp.json
        assert data is not None
        return data

    everything = query()
    assert (everything["count"], everything["total"]) == (12, 12)
    assert [s["id"] for s in everything["subscriptions"]] == list(ids.values())  # oldest first
    scada = query(q="SCADA", sort="consumer", order="desc")
    assert scada["count"] == 4 and scada["total"] == 12
    assert [s["consumer"][-8:] for s in scada["subscriptions"]] == [
        "scada-09", "scada-06", "scada-03", "scada-00",
    ]  # fmt: skip
    assert [s["id"] for s in query(q="paused")["subscriptions"]] == [ids[4]]
    assert query(q="t:a urn:t plc")["count"] == 8  # every word: topic, namespace, consumer
    page = query(sort="consumer", offset=2, limit=3)
    assert (page["count"], page["offset"], page["limit"]) == (12, 2, 3)
    assert [s["consumer"][-6:] for s in page["subscriptions"]] == ["plc-04", "plc-05", "plc-07"]
    for bad in ({"sort": "nope"}, {"order": "up"}, {"limit": "x"}, {"offset": "-1"}):
        resp = client.get(API + "/subscriptions", query_string=bad)
        assert resp.status_code == 400 and resp.json["error"]


def test_every_sort_and_the_failing_state_over_the_api(open_runtime: Runtime) -> None:
    """The sorts that depend on the delivery state, the lifetime and the topic, and a
    search for the failing state: the list searches and sorts a few fields of each
    subscription (``core.operations.SubscriptionRow``), and the page shows the full
    statuses, with the backlog and delivery state it was sorted by."""
    service = open_runtime.service
    a1, a2 = (_subscribe(open_runtime, initial_termination_time=timedelta(hours=h)) for h in (1, 2))
    a3 = _subscribe(open_runtime, initial_termination_time=timedelta(hours=3))
    service.pause(a3)
    b = service.subscribe(
        SubscribeRequest(
            EndpointReference("http://127.0.0.1:9/b"),
            topic=_topic("t:b"),
            initial_termination_time=timedelta(minutes=30),
        )
    ).id
    service.notify([InboundNotification(b"<b/>", _topic("t:b"))])  # its consumer is down
    # 30 s, not the 10 s default: the bound is not the point, a loaded machine is slow
    wait_until(lambda: service.subscription_status(b).delivery.failures > 0, 30)
    client = _client(open_runtime)

    def ids(**args: object) -> list[str]:
        resp = client.get(API + "/subscriptions", query_string=args)
        assert resp.status_code == 200, resp.json
        return [s["id"] for s in resp.json["subscriptions"]]

    actives = sorted([a1, a2])
    assert ids(sort="state") == [*actives, b, a3]  # active, failing, paused
    assert ids(sort="state", order="desc") == [a3, b, *reversed(actives)]
    assert ids(sort="failures", order="desc") == [b, *sorted([a1, a2, a3], reverse=True)]
    assert ids(sort="delivered") == sorted([a1, a2, a3, b])
    assert ids(sort="terminates") == [b, a1, a2, a3]
    assert ids(sort="topic") == [*sorted([a1, a2, a3]), b]
    # a sort that reads no delivery state still shows the page's
    by_topic = client.get(API + "/subscriptions", query_string={"sort": "topic"}).json
    assert by_topic["subscriptions"][-1]["delivery"]["failures"] > 0
    assert by_topic["subscriptions"][0]["delivery"]["failures"] == 0
    assert ids(q="failing") == [b]
    assert ids(q="FAILING t:b urn:t") == [b]

    def by_backlog() -> list[Any]:
        query = {"sort": "backlog", "order": "desc", "limit": 2}
        page = client.get(API + "/subscriptions", query_string=query).json["subscriptions"]
        return [(s["id"], s["backlog"], s["delivery"]["failures"] > 0) for s in page]

    # waited for, not read once: for a moment a backlog can count a message both in the
    # middleware and in the channel's memory (test_admin_lists_10k)
    wait_until(lambda: by_backlog()[0] == (b, 1, True), 30, what="b first, its backlog 1")
    assert by_backlog()[1][1:] == (0, False)


def test_publishing_from_the_admin_api(open_runtime: Runtime, tmp_path: Path) -> None:
    """The page's Publish form: an XML element as it is, other content wrapped with its
    type; bad input gets a precise 400; someone who may not act gets 403."""
    client = _client(open_runtime)

    def publish(form: object, remote: str = "127.0.0.1") -> Any:
        return _client(open_runtime, remote).post(API + "/notify", json=form)

    ok = publish({"topic": "{urn:t}pub/x", "payload": "<m>1</m>"})
    assert ok.status_code == 200 and ok.json["action"] == "publish", ok.json
    current = open_runtime.service.get_current_message(
        ExpressionSource(CONCRETE, "t:pub/x", {"t": "urn:t"})
    )
    assert b"<m>1</m>" in current.payload
    as_json = publish(
        {"topic": "{urn:t}pub/x", "payload": '{"a": 1}', "content_type": "application/json"}
    )
    assert as_json.status_code == 200
    current = open_runtime.service.get_current_message(
        ExpressionSource(CONCRETE, "t:pub/x", {"t": "urn:t"})
    )
    assert b'contentType="application/json"' in current.payload
    bad_topic = publish({"topic": "pub/x", "payload": "<m/>"})
    assert bad_topic.status_code == 400 and "{namespace URI}path" in bad_topic.json["error"]
    bad_xml = publish({"topic": "{urn:t}p", "payload": "<m>", "content_type": "text/xml"})
    assert bad_xml.status_code == 400 and "not one XML element" in bad_xml.json["error"]
    assert publish("nope").status_code == 400
    assert publish({"topic": "{urn:t}p", "payload": "<m/>"}, "10.1.2.3").status_code == 403
    assert client.get(API + "/topics").json["count"] == 1


def test_peek_shows_a_backlog_and_leaves_it(open_runtime: Runtime) -> None:
    """``GET .../peek``: the first messages of a paused subscription's backlog and of a
    pull point, with ids, topic, headers and payload, as often as asked, and still all
    there afterwards (the embedded adapter reads its queue without consuming)."""
    service = open_runtime.service
    client = _client(open_runtime)
    sub_id = _subscribe(open_runtime)
    service.pause(sub_id)
    service.notify(
        [InboundNotification(b"<m>%d</m>" % i, _topic(), headers=(("trace", f"t{i}"),))
         for i in range(3)]
    )  # fmt: skip

    def peek(path: str, **args: object) -> Any:
        resp = client.get(f"{API}/{path}/peek", query_string=args)
        assert resp.status_code == 200, resp.json
        return resp.json

    first = peek(f"subscriptions/{sub_id}", count=2)
    assert (first["count"], first["complete"], first["note"]) == (2, True, None)
    one = first["messages"][0]
    assert one["payload"] == "<m>0</m>" and one["headers"] == {"trace": "t0"}
    assert one["topic"] == "{urn:t}a" and one["namespace"] == "urn:t" and one["path"] == "a"
    assert one["where"] == "middleware" and one["message_id"] and one["timestamp"]
    assert [m["payload"] for m in first["messages"]] == ["<m>0</m>", "<m>1</m>"]
    assert peek(f"subscriptions/{sub_id}", count=2) == first
    assert [m["payload"] for m in peek(f"subscriptions/{sub_id}")["messages"]] == [
        "<m>0</m>", "<m>1</m>", "<m>2</m>",
    ]  # fmt: skip
    assert client.get(f"{API}/subscriptions/{sub_id}").json["pending"] == 3

    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(
        pp.id, [InboundNotification(b"<p>%d</p>" % i, _topic()) for i in (1, 2)]
    )
    shown = peek(f"pullpoints/{pp.id}", count=5)
    assert [m["payload"] for m in shown["messages"]] == ["<p>1</p>", "<p>2</p>"]
    taken = service.get_messages(pp.id, None)
    assert [m.payload for m in taken] == [b"<p>1</p>", b"<p>2</p>"]
    assert peek(f"pullpoints/{pp.id}")["messages"] == []

    # an active subscription whose consumer does not answer: its batch waits in memory
    active = _subscribe(open_runtime)
    service.notify([InboundNotification(b"<a>%d</a>" % i, _topic()) for i in range(2)])
    wait_until(lambda: service.subscription_status(active).delivery.failures > 0)
    held = peek(f"subscriptions/{active}")
    assert [m["payload"] for m in held["messages"]] == ["<a>0</a>", "<a>1</a>"]
    assert held["messages"][0]["where"] == "gateway"

    letters = peek("dead-letters")
    assert (letters["count"], letters["held"], letters["dead_letters"]) == (0, 0, [])
    for bad in ("0", "x", "501"):
        resp = client.get(f"{API}/subscriptions/{sub_id}/peek", query_string={"count": bad})
        assert resp.status_code == 400 and "count" in resp.json["error"]
    assert client.get(f"{API}/subscriptions/nope/peek").status_code == 404
    assert client.get(f"{API}/pullpoints/nope/peek").status_code == 404
    assert (
        _client(open_runtime, "10.1.2.3").get(f"{API}/pullpoints/{pp.id}/peek").status_code == 403
    )


def test_peek_says_when_the_middleware_cannot_show_its_part() -> None:
    """An adapter that cannot peek (``Capabilities.peek`` False, RabbitMQ): 200 with what
    the gateway holds, ``complete`` false and the adapter's reason."""
    service = FakeService()
    client = create_app(service).test_client()
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
    sub = service.subscribe(SubscribeRequest(EndpointReference("http://127.0.0.1:9/a")))
    data = client.get(f"{API}/subscriptions/{sub.id}/peek").json
    assert data == {
        "count": 0,
        "complete": False,
        "note": "the fake middleware cannot peek",
        "messages": [],
    }
