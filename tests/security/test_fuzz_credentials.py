"""Fuzzing a gateway with authentication on (an admin token, a credentials file with ACLs,
a rate quota and a UsernameToken identity): mutated envelopes of every operation with
credentials none, right, wrong, junk ``Authorization`` headers and mutated WS-Security
UsernameTokens.  Every answer is checked as in test_fuzz.py (also 401 with its challenge,
403 and 429 here), and at the end the gateway survived and the admin's resources are still
the admin's.  The gateway and what a run watches: fuzz_target.py; the mutations:
fuzz_inputs.py.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree
from wsnmom.soap_frontend.passwords import hash_password
from wsnmom.soap_frontend.wsse import PASSWORD_DIGEST, PASSWORD_TEXT, token_digest

from tests.support.waiting import wait_until

from . import corpus
from .conftest import post
from .fuzz_inputs import TEXT, bytes_mutation, content_type_of, mutate
from .fuzz_target import (
    ADMIN_TOKEN,
    ALICE,
    CAMERA_PASSWORD,
    Target,
    fuzz_settings,
    make_target,
    survived,
)

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz]


@pytest.fixture(scope="module")
def secured_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """The gateway with authentication: the admin token, alice (HTTP Basic, topic ACLs, a
    request rate quota) and camera (WS-Security UsernameToken)."""
    users = tmp_path_factory.mktemp("fuzz-auth") / "users.toml"
    users.write_text(
        f"""
[users.alice]
password = "{hash_password("alice-pw", n=2**4)}"
subscribe = ["{{http://www.example.org/NotificationProducerExample}}SomeTopic//."]
notify = ["{{http://www.example.org/NotificationProducerExample}}SomeTopic//."]
rate = 5

[users.camera]
wsse_password = "{CAMERA_PASSWORD}"
"""
    )
    users.chmod(0o600)
    yield from make_target(
        {"WSNMOM_AUTH__ADMIN_TOKEN": ADMIN_TOKEN, "WSNMOM_AUTH__USERS_FILE": str(users)},
        secured=True,
    )


# ------------------------------------------------------------------- with authentication
#: ``Authorization`` values that are wrong in every way a header can be
JUNK_AUTHORIZATION = [
    b"",
    b"Basic",
    b"Basic ",
    b"Basic !!!",
    b"Basic " + base64.b64encode(b"no-colon"),
    b"Basic " + base64.b64encode(b":"),
    b"Basic " + base64.b64encode(b"alice:" + b"x" * 5000),
    b"Basic " + base64.b64encode("\u00e9l\u00e8ve:pw".encode()),
    b"Basic " + base64.b64encode(b"\xff\xfe:\x00"),
    b"Bearer",
    b"Bearer " + b"A" * 10000,
    b"Bearer fuzz-admin-token ",
    b"bearer fuzz-admin-token",
    b"Digest username=alice",
    b"Negotiate YIIB",
    b"\xc3\xa9",
]


#: who a request claims to be (right credentials more often than not)
CALLERS = [
    *["admin"] * 3,
    *["alice"] * 2,
    *["camera"] * 2,
    *["none", "wrong", "junk", "random"],
]


def _authorization(kind: str, data: st.DataObject) -> dict[str, Any]:
    if kind == "admin":
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    if kind == "alice":
        return {"Authorization": ALICE}
    if kind == "wrong":
        return {"Authorization": "Basic " + base64.b64encode(b"alice:nope").decode()}
    if kind == "junk":
        return {"Authorization": data.draw(st.sampled_from(JUNK_AUTHORIZATION))}
    if kind == "random":
        prefix = data.draw(st.sampled_from([b"Basic ", b"Bearer ", b""]))
        junk = data.draw(st.binary(max_size=300)).translate(None, b"\r\n\x00")
        return {"Authorization": (prefix + junk).lstrip()}  # (what an HTTP client sends)
    return {}


def _username_token(data: st.DataObject, *, right: bool) -> str:
    """A WS-Security header: camera's right token (digest or text), or one with drawn
    values, parts left out or the wrong password type."""
    nonce = data.draw(st.binary(min_size=16, max_size=32) if right else st.binary(max_size=32))
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    user, password = "camera", CAMERA_PASSWORD
    kinds = [PASSWORD_DIGEST, PASSWORD_TEXT] + ([] if right else ["urn:other", ""])
    kind = data.draw(st.sampled_from(kinds))
    if right:
        pass
    elif data.draw(st.booleans()):  # drawn values instead of the right ones
        user = data.draw(st.sampled_from(["camera", "alice", "admin", ""]) | TEXT)
        password = data.draw(TEXT)
        created = data.draw(st.sampled_from([created, "2000-01-01T00:00:00Z"]) | TEXT)
    value = token_digest(nonce, created, password) if kind == PASSWORD_DIGEST else password
    parts = {
        "user": f"<wsse:Username>{escape(user)}</wsse:Username>",
        "password": f'<wsse:Password Type="{kind}">{escape(value)}</wsse:Password>',
        "nonce": f"<wsse:Nonce>{base64.b64encode(nonce).decode()}</wsse:Nonce>",
        "created": f"<wsu:Created>{escape(created)}</wsu:Created>",
    }
    if not right:
        for left_out in data.draw(st.lists(st.sampled_from(sorted(parts)), max_size=2)):
            parts.pop(left_out, None)
    token = "<wsse:UsernameToken>" + "".join(parts.values()) + "</wsse:UsernameToken>"
    return (
        f'<wsse:Security xmlns:wsse="{WSSE}" xmlns:wsu="{WSU}">'
        + token * (1 if right else data.draw(st.integers(1, 2)))
        + "</wsse:Security>"
    )


WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"


@fuzz_settings("auth")
@given(data=st.data())
def test_credentials(secured_target: Target, data: st.DataObject) -> None:
    """Operations with right, wrong and junk credentials (HTTP headers and UsernameTokens)
    on a gateway where authentication is required."""
    target = secured_target
    op = data.draw(st.sampled_from(sorted(corpus.BODIES)))
    version = data.draw(st.sampled_from(["1.1", "1.2"]))
    url = data.draw(st.sampled_from(target.urls))
    body = corpus.BODIES[op].replace("{consumer}", target.sink.address())
    caller = data.draw(st.sampled_from(CALLERS))
    if caller == "camera":
        header = _username_token(data, right=True)
    elif data.draw(st.sampled_from([False, False, False, True])):
        header = _username_token(data, right=False)
    else:
        header = ""
    tree = etree.fromstring(corpus.envelope(body, version, to=url, headers=header).encode())
    for _ in range(data.draw(st.sampled_from([0, 0, 0, 1, 2]))):
        mutate(tree, data)
    raw = etree.tostring(tree)
    if data.draw(st.sampled_from([False, False, False, True])):
        raw = bytes_mutation(raw, data)
    target.send(
        url, raw, content_type_of(version, data), "credentials", _authorization(caller, data)
    )


def test_the_secured_gateway_survived(secured_target: Target) -> None:
    """As above, and the resources the admin made are still the admin's."""
    survived(secured_target)
    alice = {"Authorization": ALICE}
    for url in (secured_target.canary_subscription, secured_target.canary_pull_point):

        def answer(url: str = url) -> list[requests.Response]:
            got = post(url, "<wsrf-rp:GetResourcePropertyDocument/>", headers=alice)
            return [] if got.status_code == 429 else [got]  # alice's rate quota: wait

        (other,) = wait_until(answer, what="an answer within alice's rate")
        assert other.status_code == 500 and b"ResourceUnknownFault" in other.content
