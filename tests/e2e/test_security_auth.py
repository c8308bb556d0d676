"""Authentication, ownership, ACLs and quotas end to end (issue 16, findings 4 and 5):
real gateways over HTTP driven with raw envelopes, zeep, ``wsnmom.client`` and the shell
client.  Two gateways are started for the module (~3 s): one that requires
authentication (admin token + credentials file) and one without it (anonymous clients
share one quota)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from lxml import etree
from wsnmom.soap_frontend.passwords import hash_password, hash_token

from tests.fixtures.server import RunningServer, free_port, serving
from tests.support.soap import (
    CONCRETE,
    FULL,
    NS,
    content_type,
    envelope,
    epr_address,
    fault_name,
    notify_body,
    subscribe_body,
)
from wsnmom.client import AuthenticationFailed, WsnClient

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
BOB_TOKEN = "bob-" + uuid.uuid4().hex
TOPICS = "urn:test:security"
WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"


def _users_file(path: Path) -> Path:
    cheap = {"n": 2**4}  # the test's hashes: a real scrypt, cheap parameters
    text = f"""
[users.alice]
password = "{hash_password("alice-pw", **cheap)}"

[users.bob]
password = "{hash_password("bob-pw")}"
tokens = ["{hash_token(BOB_TOKEN)}"]

[users.camera]
wsse_password = "camera-pw"
subscribe = ["{{{TOPICS}}}camera//."]
notify = ["{{{TOPICS}}}camera//."]

[users.small]
password = "{hash_password("small-pw", **cheap)}"
subscriptions = 3
rate = 2
"""
    path.write_text(text)
    path.chmod(0o600)
    return path


def _start(env: dict[str, str], tag: str) -> Iterator[RunningServer]:
    data_dir = Path(tempfile.mkdtemp(prefix=f"wsnmom-sec-{tag}-"))
    env = {k: v.replace("{dir}", str(data_dir)) for k, v in env.items()}
    if "WSNMOM_AUTH__USERS_FILE" in env:
        _users_file(Path(env["WSNMOM_AUTH__USERS_FILE"]))
    server = RunningServer(
        "embedded", f"embedded://{data_dir / 'mw'}", data_dir, free_port(), extra_env=env
    )
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def secured() -> Iterator[RunningServer]:
    yield from _start(
        {
            "WSNMOM_AUTH__ADMIN_TOKEN": ADMIN_TOKEN,
            "WSNMOM_AUTH__USERS_FILE": "{dir}/users.toml",
            "WSNMOM_QUOTAS__NOTIFY_FANOUT_BYTES": "200000",
        },
        "on",
    )


@pytest.fixture(scope="module")
def open_gateway() -> Iterator[RunningServer]:
    yield from _start({"WSNMOM_QUOTAS__SUBSCRIPTIONS": "5"}, "off")


def _basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(
    url: str, body: str, headers: dict[str, str] | None = None, version: str = "1.2", **kw: Any
) -> requests.Response:
    return requests.post(
        url,
        data=envelope(body, version=version, **kw),
        headers={"Content-Type": content_type(version), **(headers or {})},
        timeout=10,
    )


def _sub_body(topic: str = "tns:t") -> str:
    return subscribe_body("http://127.0.0.1:9/consumer", topic, ns=TOPICS, dialect=FULL)


def _subscribe(server: RunningServer, headers: dict[str, str], topic: str = "tns:t") -> str:
    resp = post(server.broker_url, _sub_body(topic), headers)
    assert resp.status_code == 200, resp.content
    ref = etree.fromstring(resp.content).find(".//wsnt:SubscriptionReference", NS)
    assert ref is not None
    return epr_address(ref)


def _metric(server: RunningServer, name: str, **labels: str) -> float:
    text = requests.get(server.base_url + "/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{name}_total\{{{re.escape(want)}\}} (\S+)$" if want else rf"^{name} (\S+)$"
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


# --- authentication ------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_refusals_are_401_faults_that_reveal_nothing(secured: RunningServer, version: str) -> None:
    answers = [
        post(secured.broker_url, _sub_body(), None, version),
        post(secured.broker_url, _sub_body(), _basic("alice", "wrong"), version),
        post(secured.broker_url, _sub_body(), _basic("nobody", "x"), version),
        post(secured.broker_url, _sub_body(), _bearer("not-a-token"), version),
        post(secured.broker_url, _sub_body(), {"Authorization": "Digest x"}, version),
    ]
    bodies = set()
    for resp in answers:
        assert resp.status_code == 401, resp.content
        challenges = resp.raw.headers.getlist("WWW-Authenticate")
        assert 'Basic realm="wsnmom", charset="UTF-8"' in challenges
        assert 'Bearer realm="wsnmom"' in challenges
        fault = etree.fromstring(resp.content).find(".//{*}Fault")
        assert fault is not None
        code = "".join(fault.itertext())
        assert "wsse:FailedAuthentication" in code
        # the same words whatever went wrong (ids and times stripped)
        bodies.add(re.sub(rb"urn:uuid:[0-9a-f-]+", b"", resp.content))
    assert len(bodies) == 1
    assert b"alice" not in bodies.pop()
    # the WSDL, schemas and health stay public
    assert requests.get(secured.broker_url + "?wsdl", timeout=5).status_code == 200
    assert requests.get(secured.base_url + "/healthz", timeout=5).status_code == 200


def test_basic_bearer_and_admin_token(secured: RunningServer) -> None:
    _subscribe(secured, _basic("alice", "alice-pw"))
    _subscribe(secured, _basic("bob", "bob-pw"))  # the default scrypt cost
    _subscribe(secured, _bearer(BOB_TOKEN))
    _subscribe(secured, _bearer(ADMIN_TOKEN))
    _subscribe(secured, _basic("admin", ADMIN_TOKEN))
    # a wrong password is counted (this test's own refusal: no other test's left-overs)
    failures = _metric(secured, "wsnmom_auth_failures", reason="basic")
    wrong = post(secured.broker_url, _sub_body(), _basic("alice", "not-alice-pw"))
    assert wrong.status_code == 401, wrong.content
    assert _metric(secured, "wsnmom_auth_failures", reason="basic") == failures + 1


def test_finding_4_non_owners_cannot_touch_or_probe_resources(secured: RunningServer) -> None:
    """Finding 4: knowing an id, anyone could Pause, Renew, read, Notify into, Destroy or
    Unsubscribe another client's resources."""
    alice, bob = _basic("alice", "alice-pw"), _bearer(BOB_TOKEN)
    sub = _subscribe(secured, alice)
    resp = post(secured.broker_url, "<wsnt:CreatePullPoint/>", alice)
    pp_ref = etree.fromstring(resp.content).find(".//wsnt:PullPoint", NS)
    assert pp_ref is not None
    pull_point = epr_address(pp_ref)
    gone_sub = sub.rsplit("/", 1)[0] + "/" + "0" * 32
    gone_pp = pull_point.rsplit("/", 1)[0] + "/" + "0" * 32
    operations = [
        (sub, gone_sub, "<wsnt:PauseSubscription/>"),
        (
            sub,
            gone_sub,
            "<wsnt:Renew><wsnt:TerminationTime>PT1M</wsnt:TerminationTime></wsnt:Renew>",
        ),
        (sub, gone_sub, "<wsnt:Unsubscribe/>"),
        (sub, gone_sub, "<wsrf-rp:GetResourcePropertyDocument/>"),
        (pull_point, gone_pp, "<wsnt:GetMessages/>"),
        (pull_point, gone_pp, "<wsnt:DestroyPullPoint/>"),
        (pull_point, gone_pp, notify_body((None, "<x/>"), ns=TOPICS, dialect=CONCRETE)),
    ]
    denied_before = _metric(secured, "wsnmom_access_denied", fault="ResourceUnknownFault")
    for address, unknown, body in operations:
        theirs = post(address, body, bob)
        nothing = post(unknown, body, bob)
        assert theirs.status_code == nothing.status_code == 500, theirs.content
        assert fault_name(theirs.content) == fault_name(nothing.content) == "ResourceUnknownFault"
        strip = re.compile(rb"urn:uuid:[0-9a-f-]+|<[^>]*Timestamp>[^<]*<|[0-9a-f]{32}")
        assert strip.sub(b"", theirs.content) == strip.sub(b"", nothing.content)
    assert _metric(secured, "wsnmom_access_denied", fault="ResourceUnknownFault") >= (
        denied_before + len(operations)
    )
    # alice's resources are intact; an admin may act on them
    ok = post(sub, "<wsnt:PauseSubscription/>", alice)
    assert ok.status_code == 200, ok.content
    assert post(sub, "<wsnt:Unsubscribe/>", _bearer(ADMIN_TOKEN)).status_code == 200
    assert post(pull_point, "<wsnt:GetMessages/>", alice).status_code == 200


def test_broker_properties_list_only_the_callers_topics(secured: RunningServer) -> None:
    alice = _basic("alice", "alice-pw")
    hidden = f"secret{uuid.uuid4().hex[:8]}"
    resp = post(
        secured.broker_url,
        notify_body((f"tns:{hidden}", "<x/>"), ns=TOPICS, dialect=CONCRETE),
        alice,
    )
    assert resp.status_code == 202, resp.content
    doc = "<wsrf-rp:GetResourcePropertyDocument/>"
    assert hidden.encode() in post(secured.broker_url, doc, alice).content
    camera = _post_wsse(secured.broker_url, doc, _wsse("camera", "camera-pw"))
    assert camera.status_code == 200 and hidden.encode() not in camera.content


# --- WS-Security UsernameToken ---------------------------------------------------------------
def _wsse(user: str, password: str, digest: bool = True, created: str | None = None) -> str:
    from datetime import UTC, datetime

    from wsnmom.soap_frontend.wsse import PASSWORD_DIGEST, PASSWORD_TEXT, token_digest

    nonce = uuid.uuid4().bytes
    created = created or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = token_digest(nonce, created, password) if digest else password
    kind = PASSWORD_DIGEST if digest else PASSWORD_TEXT
    wsu = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
    return (
        f'<wsse:Security xmlns:wsse="{WSSE}" xmlns:wsu="{wsu}"><wsse:UsernameToken>'
        f"<wsse:Username>{user}</wsse:Username>"
        f'<wsse:Password Type="{kind}">{value}</wsse:Password>'
        f"<wsse:Nonce>{base64.b64encode(nonce).decode()}</wsse:Nonce>"
        f"<wsu:Created>{created}</wsu:Created></wsse:UsernameToken></wsse:Security>"
    )


def _post_wsse(url: str, body: str, header: str) -> requests.Response:
    return requests.post(
        url,
        data=envelope(body, headers=header),
        headers={"Content-Type": content_type()},
        timeout=10,
    )


def test_username_token_digest_text_replay_and_stale(secured: RunningServer) -> None:
    camera_topic = "tns:camera/door"
    body = _sub_body(camera_topic)
    token = _wsse("camera", "camera-pw")
    assert _post_wsse(secured.broker_url, body, token).status_code == 200
    assert _post_wsse(secured.broker_url, body, token).status_code == 401  # replayed nonce
    stale = _wsse("camera", "camera-pw", created="2020-01-01T00:00:00Z")
    assert _post_wsse(secured.broker_url, body, stale).status_code == 401
    assert _post_wsse(secured.broker_url, body, _wsse("camera", "nope")).status_code == 401
    text = _wsse("alice", "alice-pw", digest=False)
    assert _post_wsse(secured.broker_url, _sub_body(), text).status_code == 200
    # a hashed password cannot check a digest: only wsse_password can
    assert (
        _post_wsse(secured.broker_url, _sub_body(), _wsse("alice", "alice-pw")).status_code == 401
    )
    # the camera's ACL: its topics only, answered 403
    refused = _post_wsse(secured.broker_url, _sub_body("tns:other"), _wsse("camera", "camera-pw"))
    assert refused.status_code == 403 and fault_name(refused.content) == (
        "SubscribeCreationFailedFault"
    )


def test_zeep_with_basic_auth_and_username_token(secured: RunningServer) -> None:
    import zeep
    from zeep.transports import Transport
    from zeep.wsse.username import UsernameToken

    wsdl = secured.broker_url + "?wsdl"
    session = requests.Session()
    session.auth = ("alice", "alice-pw")
    client = zeep.Client(wsdl, transport=Transport(session=session))
    broker = client.bind("NotificationBrokerService", "NotificationBrokerSoap12Port")
    created = broker.CreatePullPoint()
    assert created.PullPoint.Address._value_1.startswith(secured.base_url)

    camera = zeep.Client(wsdl, wsse=UsernameToken("camera", "camera-pw", use_digest=True))
    camera_broker = camera.bind("NotificationBrokerService", "NotificationBrokerSoap12Port")
    assert camera_broker.CreatePullPoint().PullPoint.Address._value_1

    anonymous = zeep.Client(wsdl).bind("NotificationBrokerService", "NotificationBrokerSoap12Port")
    with pytest.raises(zeep.exceptions.Fault) as info:
        anonymous.CreatePullPoint()
    assert info.value.message == "The security token could not be authenticated or authorized"


def test_python_client_credentials(secured: RunningServer) -> None:
    ns = {"tns": TOPICS}
    for kwargs in (
        {"user": "alice", "password": "alice-pw"},
        {"token": BOB_TOKEN},
        {"user": "camera", "password": "camera-pw", "wsse": "digest"},
        {"user": "alice", "password": "alice-pw", "wsse": "text"},
    ):
        with WsnClient(secured.broker_url, namespaces=ns, timeout=10, **kwargs) as wsn:
            pp = wsn.create_pull_point()
            pp.notify("<c/>", "tns:camera/door")
            assert [m.payload_xml for m in pp.get_messages(5)] == [b"<c/>"]
            pp.destroy()
    with (
        WsnClient(secured.broker_url, namespaces=ns, timeout=10) as wsn,
        pytest.raises(AuthenticationFailed) as info,
    ):
        wsn.create_pull_point()
    assert info.value.status == 401


def test_shell_client_credentials(secured: RunningServer) -> None:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wsnmom", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", **(env or {})},
        )

    broker = ["--broker", secured.broker_url]
    ok = run(
        "notify", *broker, "--user", "alice", "--password", "alice-pw", f"{{{TOPICS}}}a", "<a/>"
    )
    assert ok.returncode == 0, ok.stderr
    ok = run("notify", *broker, f"{{{TOPICS}}}a", "<a/>", env={"WSN_TOKEN": BOB_TOKEN})
    assert ok.returncode == 0, ok.stderr
    wsse = run(
        "notify", *broker, "--user", "camera", "--password", "camera-pw", "--wsse", "digest",
        f"{{{TOPICS}}}camera/door", "<a/>",
    )  # fmt: skip
    assert wsse.returncode == 0, wsse.stderr
    refused = run("notify", *broker, f"{{{TOPICS}}}a", "<a/>")
    assert refused.returncode == 1 and "authenticated" in refused.stderr
    listing = run("subscriptions", "list", *broker, "--token", ADMIN_TOKEN)
    assert listing.returncode == 0, listing.stderr
    not_admin = run("subscriptions", "list", *broker, "--token", BOB_TOKEN)
    assert not_admin.returncode == 1 and "admins only" in not_admin.stderr


def test_admin_api_needs_an_admin(secured: RunningServer) -> None:
    url = secured.base_url + "/wsn/admin/api/subscriptions"
    _subscribe(secured, _basic("alice", "alice-pw"))  # one to list, whatever ran before
    assert requests.get(url, timeout=5).status_code == 401
    assert requests.get(url, headers=_bearer(BOB_TOKEN), timeout=5).status_code == 403
    resp = requests.get(url, headers=_bearer(ADMIN_TOKEN), timeout=5)
    assert resp.status_code == 200 and resp.json()["count"] >= 1


# --- quotas ----------------------------------------------------------------------------------
def test_finding_5_anonymous_subscription_flood_is_bounded(open_gateway: RunningServer) -> None:
    """Finding 5: one anonymous client created 20,003 subscriptions in 20 s."""
    created = 0
    refused: requests.Response | None = None
    for _ in range(8):
        resp = post(open_gateway.broker_url, _sub_body())
        if resp.status_code != 200:
            refused = resp
            break
        created += 1
    assert created == 5 and refused is not None
    assert refused.status_code == 500 and fault_name(refused.content) == (
        "SubscribeCreationFailedFault"
    )
    assert b"anonymous owns its maximum of 5 subscriptions (quotas.subscriptions)" in (
        refused.content
    )
    assert _metric(open_gateway, "wsnmom_quota_refusals", quota="subscriptions") >= 1


def test_identity_quota_rate_and_fanout(secured: RunningServer) -> None:
    small = _basic("small", "small-pw")
    answers = [post(secured.broker_url, _sub_body(), small) for _ in range(4)]  # the burst
    assert [a.status_code for a in answers] == [200, 200, 200, 500]
    assert b"small owns its maximum of 3 subscriptions (quotas.subscriptions)" in (
        answers[3].content
    )
    # the rate: 2/s with a burst of 4 -- a quick series meets 429 with Retry-After
    answers = [post(secured.broker_url, "<wsnt:CreatePullPoint/>", small) for _ in range(8)]
    limited = [a for a in answers if a.status_code == 429]
    assert limited, [a.status_code for a in answers]
    assert int(limited[0].headers["Retry-After"]) >= 1
    assert fault_name(limited[0].content) == "ResourceUnavailableFault"
    assert _metric(secured, "wsnmom_quota_refusals", quota="rate") >= 1
    # fan-out: 40 subscriptions on one topic x 10 kB > 200 kB
    alice = _basic("alice", "alice-pw")
    for _ in range(25):
        _subscribe(secured, alice, "tns:fan")
    payload = "<p>" + "x" * 10_000 + "</p>"
    resp = post(
        secured.broker_url, notify_body(("tns:fan", payload), ns=TOPICS, dialect=CONCRETE), alice
    )
    assert resp.status_code == 413, resp.content
    assert b"quotas.notify_fanout_bytes" in resp.content


def test_a_notify_to_a_pull_point_is_bound_by_the_fanout_quota(secured: RunningServer) -> None:
    """A Notify sent to a pull point copies its payload into the middleware once: past
    ``quotas.notify_fanout_bytes`` (200 kB here) it is refused as the broker's Notify is,
    413 and a BaseFault naming the bound, and nothing reaches the pull point (the sentinel
    sent after it is all GetMessages hands out).  Before, it was accepted whatever its
    size (up to the request size limit)."""
    alice = _basic("alice", "alice-pw")
    resp = post(secured.broker_url, "<wsnt:CreatePullPoint/>", alice)
    pp_ref = etree.fromstring(resp.content).find(".//wsnt:PullPoint", NS)
    assert pp_ref is not None, resp.content
    pull_point = epr_address(pp_ref)
    big = "<p>" + "x" * 210_000 + "</p>"
    resp = post(pull_point, notify_body(("tns:pp-fan", big), ns=TOPICS, dialect=CONCRETE), alice)
    assert resp.status_code == 413, resp.content
    assert fault_name(resp.content) == "BaseFault"
    assert b"quotas.notify_fanout_bytes (200000)" in resp.content
    sentinel = notify_body(("tns:pp-fan", "<sentinel/>"), ns=TOPICS, dialect=CONCRETE)
    assert post(pull_point, sentinel, alice).status_code == 202  # one-way, accepted
    got = post(pull_point, "<wsnt:GetMessages/>", alice)
    assert got.status_code == 200, got.content
    assert b"sentinel" in got.content and b"xxxx" not in got.content
    assert _metric(secured, "wsnmom_quota_refusals", quota="notify_fanout_bytes") >= 1
