"""The authenticator's parts without a server: password and token hashes, the credentials
file, when authentication is required, the trusted proxy header, UsernameToken replay
protection and the rate limiter."""

from __future__ import annotations

import base64
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core.access import ANONYMOUS
from wsnmom.core.config import ConfigError, Settings, load_settings
from wsnmom.soap_frontend import passwords
from wsnmom.soap_frontend.auth import FORWARDED_IDENTITY_KEY, TLS_IDENTITY_KEY, Authenticator
from wsnmom.soap_frontend.identity import AuthenticationFailed
from wsnmom.soap_frontend.ratelimit import RateLimiter
from wsnmom.soap_frontend.wsse import NonceCache, TokenRejected, UsernameToken

CHEAP = {"n": 2**4}


def _settings(tmp_path: Path, users: str | None = None, **overrides: Any) -> Settings:
    if users is not None:
        path = tmp_path / "users.toml"
        path.write_text(users)
        path.chmod(0o600)
        overrides["auth__users_file"] = str(path)
    return load_settings(None, environ={}, overrides={"data_dir": str(tmp_path), **overrides})


def _basic(user: str, password: str) -> dict[str, str]:
    return {
        "HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    }


def test_password_hashes() -> None:
    stored = passwords.hash_password("s3cret", **CHEAP)
    assert stored.startswith("scrypt$16$8$1$") and "s3cret" not in stored
    assert passwords.verify_password("s3cret", stored)
    assert not passwords.verify_password("s3cret!", stored)
    import hashlib

    salt = b"0123456789abcdef"
    raw = hashlib.pbkdf2_hmac("sha256", b"pw", salt, 1000)
    b64 = base64.urlsafe_b64encode
    pbkdf2 = f"pbkdf2-sha256$1000${b64(salt).decode()}${b64(raw).decode()}"
    assert passwords.verify_password("pw", pbkdf2)
    for bad in ("plain-text", "scrypt$3$8$1$AA$AA", "md5$x"):
        with pytest.raises(passwords.InvalidHash):
            passwords.check_hash(bad)
    token = passwords.new_token()
    assert passwords.parse_token_hash(passwords.hash_token(token)) == passwords.token_digest(token)


def test_the_credentials_file_is_checked(tmp_path: Path) -> None:
    cases = {
        '[users.a]\npassword = "plain"\n': "users.a.password: not a password hash",
        "[users.a]\nadmn = true\n": "unknown keys admn",
        '[users.a]\nsubscribe = ["sensors//*"]\n': "is not a topic pattern",
        '[users.a]\ntokens = ["abc"]\n': "not a token hash",
        "[users.a]\nsubscriptions = -1\n": "expected a count",
        "[other]\n": "expected only [users.NAME] tables",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            Authenticator(_settings(tmp_path, text))
    with pytest.raises(ConfigError, match="defines an identity 'admin' too"):
        Authenticator(_settings(tmp_path, "[users.admin]\n", auth__admin_token="t"))
    with pytest.raises(ConfigError, match="cannot read"):
        Authenticator(_settings(tmp_path, auth__users_file=str(tmp_path / "missing.toml")))


def test_a_readable_credentials_file_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path, "[users.a]\n")
    Path(str(settings.auth.users_file)).chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="wsnmom.auth"):
        Authenticator(settings)
    assert "can be read by other users (mode 644); chmod 600 it" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "enabled", "required"),
    [
        ({}, False, False),  # loopback, nothing configured: today's behaviour
        ({"auth__admin_token": "t"}, True, True),  # the one setting
        ({"auth__admin_token": "t", "auth__required": "false"}, True, False),
        ({"host": "0.0.0.0", "auth__required": "false"}, False, False),
        ({"host": "::1"}, False, False),
        ({"host": "0.0.0.0", "auth__admin_token": "t"}, True, True),
    ],
)
def test_when_authentication_is_required(
    tmp_path: Path, overrides: dict[str, Any], enabled: bool, required: bool
) -> None:
    auth = Authenticator(_settings(tmp_path, **overrides))
    assert (auth.enabled, auth.required) == (enabled, required)


@pytest.mark.parametrize(
    "overrides", [{"host": "0.0.0.0"}, {"host": "192.0.2.10"}, {"auth__required": True}]
)
def test_required_without_an_identity_refuses_to_start(
    tmp_path: Path, overrides: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match=r"set auth.admin_token \(WSNMOM_AUTH__ADMIN_TOKEN\)"):
        Authenticator(_settings(tmp_path, **overrides))


def test_the_admin_token_is_never_shown(tmp_path: Path) -> None:
    settings = load_settings(
        None, environ={"WSNMOM_AUTH__ADMIN_TOKEN": "sekrit", "WSNMOM_DATA_DIR": str(tmp_path)}
    )
    assert settings.auth.admin_token == "sekrit"
    assert "sekrit" not in repr(settings) and "sekrit" not in str(settings.origins)


def test_basic_bearer_and_the_verified_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = f'[users.alice]\npassword = "{passwords.hash_password("pw", **CHEAP)}"\nadmin = true\n'
    auth = Authenticator(_settings(tmp_path, users, auth__admin_token="tok"))
    calls = []
    real = passwords.verify_password

    def counting(password: str, stored: str) -> bool:
        calls.append(password)
        return real(password, stored)

    monkeypatch.setattr("wsnmom.soap_frontend.auth.verify_password", counting)
    for _ in range(3):
        alice = auth.http_caller(_basic("alice", "pw"))
    assert (alice.name, alice.admin, alice.method) == ("alice", True, "basic")
    assert calls == ["pw"]  # checked once, then remembered
    for bad in (_basic("alice", "PW"), _basic("nobody", "pw"), {"HTTP_AUTHORIZATION": "Basic %%"}):
        with pytest.raises(AuthenticationFailed):
            auth.http_caller(bad)
    assert auth.http_caller({"HTTP_AUTHORIZATION": "Bearer tok"}).name == "admin"
    assert auth.http_caller(_basic("admin", "tok")).admin
    with pytest.raises(AuthenticationFailed):
        auth.http_caller({"HTTP_AUTHORIZATION": "Bearer tok2"})
    assert auth.http_caller({}) is ANONYMOUS


def test_tls_and_proxy_identities(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    users = '[users."CN=cam,O=Example"]\nadmin = true\n'
    auth = Authenticator(
        _settings(
            tmp_path,
            users,
            trusted_proxies=["10.0.0.0/8"],
            auth__proxy_header="X-Client-Identity",
        )
    )
    by_cert = auth.http_caller({TLS_IDENTITY_KEY: "CN=cam,O=Example"})
    assert (by_cert.name, by_cert.admin, by_cert.method) == ("CN=cam,O=Example", True, "tls")
    unknown_cert = auth.http_caller({TLS_IDENTITY_KEY: "CN=other"})
    assert (unknown_cert.name, unknown_cert.admin) == ("CN=other", False)
    proxied = {"HTTP_X_CLIENT_IDENTITY": "carol", "REMOTE_ADDR": "10.1.2.3"}
    assert auth.http_caller(proxied).name == "carol"
    with caplog.at_level(logging.WARNING, logger="wsnmom.auth"):
        forged = auth.http_caller({**proxied, "REMOTE_ADDR": "192.0.2.9"})
    assert forged is ANONYMOUS and "not in trusted_proxies" in caplog.text
    with pytest.raises(ConfigError, match="trusted_proxies is empty"):
        Authenticator(_settings(tmp_path, auth__proxy_header="X-Client-Identity"))
    # a request another instance forwarded with the identity it established (signed,
    # checked by PullForward): that identity, by the same method; a proxy's header
    # arriving from the forwarding instance (not a trusted proxy) is not needed
    relayed = {FORWARDED_IDENTITY_KEY: ("CN=cam,O=Example", "tls"), "REMOTE_ADDR": "192.0.2.9"}
    by_relay = auth.http_caller(relayed)
    assert (by_relay.name, by_relay.admin, by_relay.method) == ("CN=cam,O=Example", True, "tls")
    assert auth.http_caller({FORWARDED_IDENTITY_KEY: ("carol", "proxy")}).name == "carol"
    with pytest.raises(AuthenticationFailed):  # its own credentials, checked here
        auth.http_caller({**relayed, "HTTP_AUTHORIZATION": "Bearer wrong"})


def test_username_token_replay_window() -> None:
    cache = NonceCache(timedelta(minutes=5), capacity=2)
    now = datetime.now(UTC)
    created = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def token(nonce: bytes, when: str | None = created, digest: bool = True) -> UsernameToken:
        return UsernameToken("u", "x", digest, nonce, when)

    cache.check(token(b"1"), now)
    with pytest.raises(TokenRejected, match="replayed"):
        cache.check(token(b"1"), now)
    cache.check(UsernameToken("v", "x", True, b"1", created), now)  # the same nonce, another user
    cache.check(token(b"2"), now)
    with pytest.raises(TokenRejected, match="too many nonces of this user"):
        cache.check(token(b"2b"), now)  # full: refuse, never forget early
    cache.check(UsernameToken("v", "x", True, b"2", created), now)  # per user: v has room
    with pytest.raises(TokenRejected, match="outside the replay window"):
        cache.check(token(b"3", "2020-01-01T00:00:00Z"), now)
    with pytest.raises(TokenRejected, match="outside the replay window"):
        cache.check(token(b"4", (now + timedelta(minutes=6)).isoformat()), now)
    with pytest.raises(TokenRejected, match="needs a Nonce and a Created"):
        cache.check(token(b"5", None), now)
    NonceCache(timedelta(minutes=5)).check(UsernameToken("u", "x", False), now)  # plain text


def test_rate_limiter_buckets() -> None:
    from types import SimpleNamespace

    from wsnmom.core.access import IdentityQuotas, Principal

    clock = [0.0]
    quotas = SimpleNamespace(rate=2.0, burst=None, total_rate=None)
    limiter = RateLimiter(quotas, False, clock=lambda: clock[0])
    alice = Principal("alice")
    assert [limiter.check(alice, None) for _ in range(4)] == [None] * 4  # burst: 2 s of rate
    assert limiter.check(alice, None) == ("rate", 1)
    assert limiter.check(Principal("bob"), None) is None  # per identity
    assert limiter.check(ANONYMOUS, "127.0.0.1") is None  # anonymous: per address
    clock[0] += 0.5
    assert limiter.check(alice, None) is None
    fast = Principal("fast", quotas=IdentityQuotas(rate=100.0))
    assert all(limiter.check(fast, None) is None for _ in range(150))
    total = RateLimiter(SimpleNamespace(rate=None, burst=3, total_rate=1.0), False, clock=lambda: 0)
    assert [total.check(ANONYMOUS, f"10.0.0.{i}") for i in range(4)][-1] == ("total_rate", 1)


def test_refusal_warnings_are_throttled(caplog: pytest.LogCaptureFixture) -> None:
    from wsnmom.core.guard import ThrottledLog

    throttled = ThrottledLog(logging.getLogger("wsnmom.test.throttle"), interval=60)
    with caplog.at_level(logging.WARNING, logger="wsnmom.test.throttle"):
        for i in range(100):
            throttled.warning("bob:rate", "refused %d", i)
        throttled.warning("alice:rate", "refused alice")
    assert [r.getMessage() for r in caplog.records] == ["refused 0", "refused alice"]


def test_proxy_identity_through_the_app(tmp_path: Path) -> None:
    """A gateway behind a proxy: the identity header counts only from trusted_proxies,
    on the WSGI fast path and through Flask (a query string takes the Flask view)."""
    from lxml import etree

    from tests.support.soap import NS, content_type, envelope, epr_address, fault_name
    from wsnmom.server import build_runtime

    settings = _settings(
        tmp_path,
        "[users.carol]\nadmin = false\n",
        trusted_proxies=["10.0.0.5"],
        auth__proxy_header="X-Client-Identity",
    )
    runtime = build_runtime(settings)
    try:
        http = runtime.app.test_client()
        data = envelope("<wsnt:CreatePullPoint/>")

        def post(url: str, body: bytes, remote: str, who: str) -> Any:
            return http.post(
                url,
                data=body,
                content_type=content_type("1.2"),
                headers={"X-Client-Identity": who},
                environ_base={"REMOTE_ADDR": remote},
            )

        created = post("/wsn/broker", data, "10.0.0.5", "carol")
        assert created.status_code == 200, created.data
        ref = etree.fromstring(created.data).find(".//wsnt:PullPoint", NS)
        assert ref is not None
        path = "/wsn/pullpoints/" + epr_address(ref).rsplit("/", 1)[-1]
        get = envelope("<wsnt:GetMessages/>")
        for url in (path, path + "?via=flask"):
            assert post(url, get, "10.0.0.5", "carol").status_code == 200
            other = post(url, get, "10.0.0.5", "dave")  # vouched for, not the owner
            assert fault_name(other.data) == "ResourceUnknownFault"
            forged = post(url, get, "192.0.2.7", "carol")  # not from the proxy: ignored
            assert forged.status_code == 401
    finally:
        runtime.close()


# --- issue 22, item 8: side channels -------------------------------------------------------
def test_unknown_names_cost_the_same_hash_as_wrong_passwords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Basic answered an unknown name in 2-10 ms and a real one in 190-290 ms (scrypt).
    Now every refusal pays one hash with the parameters of the file's hashes."""
    from wsnmom.soap_frontend import auth as auth_module

    alice = passwords.hash_password("pw", n=2**5, r=4, p=1)
    users = (
        f'[users.alice]\npassword = "{alice}"\n'
        f'[users.bob]\npassword = "{passwords.hash_password("pw2", n=2**5, r=4, p=1)}"\n'
        '[users."CN=cert-only"]\n'
        '[users.cam]\nwsse_password = "plain"\n'
    )
    auth = Authenticator(_settings(tmp_path, users, auth__admin_token="tok"))
    work: list[str] = []
    real = auth_module.verify_password

    def counted(password: str, stored: str) -> bool:
        scheme, n, r, p = stored.split("$")[:4]
        work.append(f"{scheme}${n}${r}${p}")
        return real(password, stored)

    monkeypatch.setattr(auth_module, "verify_password", counted)
    for name in ("alice", "nobody", "CN=cert-only", "cam", "admin", "x" * 300):
        work.clear()
        assert not auth.check_password(name, "wrong")
        assert work == ["scrypt$32$4$1"], (name, work)
    work.clear()
    assert auth.check_password("alice", "pw") and work == ["scrypt$32$4$1"]
    # without any hash in use, no refusal hashes: all are equally fast
    plain = Authenticator(_settings(tmp_path / "t", auth__admin_token="tok"))
    work.clear()
    assert not plain.check_password("nobody", "x") and not plain.check_password("admin", "x")
    assert work == []


def test_nonces_are_stored_only_for_authenticated_users(tmp_path: Path) -> None:
    """Nonces were stored before the user was known: unauthenticated clients filled the
    200,000-entry table in 9.4 min, then every UsernameToken with a nonce was refused."""
    from wsnmom.soap_frontend.wsse import token_digest as digest_of

    users = '[users.cam]\nwsse_password = "pw"\n[users.cam2]\nwsse_password = "pw2"\n'
    auth = Authenticator(_settings(tmp_path, users))
    auth.nonces = NonceCache(timedelta(minutes=5), capacity=3)
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def token(user: str, password: str, nonce: bytes) -> UsernameToken:
        return UsernameToken(user, digest_of(nonce, created, password), True, nonce, created)

    for i in range(50):  # unknown users, wrong digests, wrong text passwords
        for bad in (
            token(f"nobody{i}", "pw", b"n%d" % i),
            token("cam", "wrong", b"w%d" % i),
            UsernameToken("cam", "wrong", False, b"t%d" % i, created),
        ):
            with pytest.raises(AuthenticationFailed):
                auth.wsse_caller(bad)
    assert auth.nonces.stored() == 0
    for i in range(3):
        assert auth.wsse_caller(token("cam", "pw", b"ok%d" % i)).name == "cam"
    with pytest.raises(AuthenticationFailed):
        auth.wsse_caller(token("cam", "pw", b"ok0"))  # a replay
    with pytest.raises(AuthenticationFailed):
        auth.wsse_caller(token("cam", "pw", b"ok3"))  # cam's own table is full
    assert auth.wsse_caller(token("cam2", "pw2", b"ok0")).name == "cam2"  # others unaffected
    assert auth.nonces.stored() == 4


def test_a_proxy_vouches_only_for_identities_without_a_secret(tmp_path: Path) -> None:
    """With proxy_header, a header naming ``admin`` (or any identity with a password or
    token) made its sender that identity; a proxy now vouches only for secretless ones."""
    hashed = passwords.hash_password("pw", **CHEAP)
    users = (
        f'[users.alice]\npassword = "{hashed}"\n'
        '[users.cam]\nwsse_password = "x"\n'
        "[users.ops]\nadmin = true\n"
    )
    auth = Authenticator(
        _settings(
            tmp_path,
            users,
            trusted_proxies=["10.0.0.5"],
            auth__proxy_header="X-Client-Identity",
            auth__admin_token="tok",
        )
    )
    proxied = {"REMOTE_ADDR": "10.0.0.5"}
    for name in ("admin", "alice", "cam"):
        with pytest.raises(AuthenticationFailed):
            auth.http_caller({**proxied, "HTTP_X_CLIENT_IDENTITY": name})
    assert auth.http_caller({**proxied, "HTTP_X_CLIENT_IDENTITY": "ops"}).admin
    assert auth.http_caller({**proxied, "HTTP_X_CLIENT_IDENTITY": "carol"}).name == "carol"
    assert auth.http_caller(_basic("admin", "tok")).admin  # admin proves itself as ever


@pytest.mark.parametrize("everyone", ["*", "0.0.0.0/0", "::/0"])
def test_trusting_every_peer_with_a_proxy_header_needs_the_risk_named(
    tmp_path: Path, everyone: str
) -> None:
    """trusted_proxies = "*" with proxy_header started without a word: any client that
    sent the header was whoever it named."""
    settings = {
        "trusted_proxies": [everyone],
        "auth__proxy_header": "X-Client-Identity",
        "auth__admin_token": "tok",
    }
    with pytest.raises(ConfigError, match="i_know_any_client_can_claim_any_identity"):
        Authenticator(_settings(tmp_path, **settings))
    auth = Authenticator(
        _settings(tmp_path, auth__i_know_any_client_can_claim_any_identity=True, **settings)
    )
    remote = "2001:db8::9" if ":" in everyone else "192.0.2.9"
    forged = {"HTTP_X_CLIENT_IDENTITY": "carol", "REMOTE_ADDR": remote}
    assert auth.http_caller(forged).name == "carol"
    # a trusted_proxies of "*" without proxy_header only affects forwarded URLs: fine
    Authenticator(_settings(tmp_path, trusted_proxies=[everyone], auth__admin_token="tok"))


def test_password_checks_run_bounded_off_the_request_thread() -> None:
    """A flood of wrong passwords raised a bearer client's Notify median from 9 to 112 ms:
    every check ran on a request thread, as many at once as there were requests.  Now at
    most hash_threads run, on their own lowest-priority threads, hash_queue wait, and
    the rest are refused at once."""
    import os
    import threading

    from wsnmom.soap_frontend.hashing import NICENESS, HashWorkers, PasswordChecksBusy

    workers = HashWorkers(threads=1, queue=1)
    started, release = threading.Event(), threading.Event()
    seen: list[tuple[int, int | None]] = []

    def slow(password: str, stored: str) -> bool:
        tid = threading.get_native_id()
        priority = os.getpriority(os.PRIO_PROCESS, tid) if hasattr(os, "getpriority") else None
        seen.append((tid, priority))
        started.set()
        release.wait(10)
        return password == stored

    results: list[bool] = []
    running = threading.Thread(target=lambda: results.append(workers.run(slow, "a", "a")))
    running.start()
    assert started.wait(10)
    queued = threading.Thread(target=lambda: results.append(workers.run(slow, "b", "c")))
    queued.start()
    while workers._slots._value > 0:
        threading.Event().wait(0.005)
    with pytest.raises(PasswordChecksBusy):  # a third: refused at once, nothing ran
        workers.run(slow, "x", "x")
    release.set()
    running.join(10)
    queued.join(10)
    assert sorted(results) == [False, True]
    assert len(seen) == 2 and all(tid != threading.get_native_id() for tid, _ in seen)
    if seen[0][1] is not None:
        assert {priority for _, priority in seen} == {NICENESS}
    assert workers.run(slow, "d", "d")  # room again
    workers.close()


def test_a_basic_request_while_checks_are_busy_is_a_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wsnmom.soap_frontend.hashing import PasswordChecksBusy

    from tests.support.soap import content_type, envelope, fault_name
    from wsnmom.server import build_runtime

    hashed = passwords.hash_password("pw", **CHEAP)
    runtime = build_runtime(
        _settings(tmp_path, f'[users.alice]\npassword = "{hashed}"\n', auth__admin_token="tok")
    )
    try:
        auth = runtime.app.extensions["wsnmom.auth"]

        def busy(*args: Any) -> bool:
            raise PasswordChecksBusy("test: all busy")

        monkeypatch.setattr(auth.hashing, "run", busy)
        http = runtime.app.test_client()
        data = envelope("<wsnt:CreatePullPoint/>")
        resp = http.post(
            "/wsn/broker",
            data=data,
            content_type=content_type("1.2"),
            headers={"Authorization": _basic("alice", "x")["HTTP_AUTHORIZATION"]},
        )
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "1", resp.data
        assert fault_name(resp.data) == "ResourceUnavailableFault"
        bearer = http.post(
            "/wsn/broker",
            data=data,
            content_type=content_type("1.2"),
            headers={"Authorization": "Bearer tok"},
        )
        assert bearer.status_code == 200  # a token needs no hash: never refused for it
    finally:
        runtime.close()
