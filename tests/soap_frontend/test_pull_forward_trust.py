"""What a request forwarded to the pull point's reader (``PullForward``,
soap_frontend/pull_forward.py; forward_signature.py) may claim, and what verifies it: a
forwarding header that does not verify, or is replayed, or was signed for another method,
query or path, is refused; a made-up header is refused quietly; the client's identity
(its certificate, a trusted proxy's) and its address cross with the forward, and the
reader counts the request (and its rate limit) against that address; an HTTPS reader is
checked against the outbound CA bundle; while the reader cannot read the secret, the
answer is try again.  The rig (two WSGI stacks in this process, the reader on a real HTTP
server) is tests/support/pull_forward_rig.py, as for test_pull_forward.py.
"""

from __future__ import annotations

import http.client
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import make_server

import pytest
from wsnmom.core.pull_owners import PullOwners
from wsnmom.soap_frontend.auth import FORWARDED_ADDRESS_KEY
from wsnmom.soap_frontend.forward_signature import (
    FORWARD_HEADER,
    FORWARDED_FOR_HEADER,
    FORWARDED_IDENTITY_HEADER,
    WINDOW,
)
from wsnmom.soap_frontend.pull_forward import PullForward
from wsnmom.soap_frontend.request_ids import RequestIds

from tests.support.pull_forward_rig import (
    BODY,
    PATH,
    SECRET,
    Quiet,
    Reader,
    front,
    owner_info,
    post,
    readers,
    signed,
)
from tests.support.soap import content_type, envelope, fault_name
from tests.support.threads import serve
from wsnmom.testing.gateway import free_port


@pytest.fixture
def reader() -> Iterator[Reader]:
    with Reader() as r:
        yield r


def test_a_forwarding_header_that_does_not_verify_is_refused(reader: Reader) -> None:
    now = int(time.time())
    good = signed(SECRET, "g0", now, PATH, BODY)
    refused = {
        "made up": f"g0 {now} {'0' * 64}",
        "another secret": signed("x" * 64, "g0", now, PATH, BODY),
        "another path": signed(SECRET, "g0", now, "/wsn/pullpoints/other", BODY),
        "another body": signed(SECRET, "g0", now, PATH, BODY + b" "),
        "too old": signed(SECRET, "g0", now - int(WINDOW) - 5, PATH, BODY),
        "malformed": "g0",
    }
    for why, value in refused.items():
        r = post(reader.url, **{FORWARD_HEADER: value})
        assert r.status_code == 403, why
        assert "Fault" in r.text, why
    assert reader.seen == []  # nothing reached the application
    assert post(reader.url, **{FORWARD_HEADER: good}).status_code == 200


def test_a_client_known_by_its_certificate_or_a_proxy_keeps_its_identity(reader: Reader) -> None:
    """A client without an ``Authorization`` header (its TLS certificate, a trusted proxy's
    identity header) is named to the reader in the signed request: the reader's
    authenticator takes that identity, not the forwarding instance's anonymous call."""
    port = free_port()

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    def identity(environ: dict[str, Any]) -> tuple[str, str] | None:
        # the forwarding instance's authenticator (here: what its TLS server verified)
        name = environ.get("HTTP_X_TEST_CERT")
        return (str(name), "tls") if name else None

    stack = RequestIds(
        PullForward(
            local, readers("g0", here=False, table=[owner_info(reader.url)]), 1 << 20, identity
        ),
        "g0",
    )
    server = make_server("127.0.0.1", port, stack, handler_class=Quiet)
    serve(server)
    url = f"http://127.0.0.1:{port}"
    try:
        assert post(url, **{"X-Test-Cert": "CN=cämera 1,O=Example"}).status_code == 200
        assert reader.identities == [("CN=cämera 1,O=Example", "tls")]
        # with an Authorization header the reader checks that itself
        assert post(url, Authorization="Basic dTpw", **{"X-Test-Cert": "CN=x"}).ok
        assert reader.identities[1:] == [None]
    finally:
        server.shutdown()
        server.server_close()
    # a client cannot name an identity: without a signature, or with one for another
    now = int(time.time())
    named = {FORWARDED_IDENTITY_HEADER: "tls CN%3Dadmin"}
    assert post(reader.url, **named).status_code == 200  # not forwarded: ignored
    assert reader.identities[2:] == [None]
    unsigned = {FORWARD_HEADER: signed(SECRET, "g0", now, PATH, BODY), **named}
    assert post(reader.url, **unsigned).status_code == 403
    with_identity = signed(SECRET, "g0", now, PATH, BODY, "tls CN%3Dcam")
    assert post(reader.url, **{FORWARD_HEADER: with_identity, **named}).status_code == 403
    assert len(reader.identities) == 3


def test_the_reader_counts_a_forwarded_request_against_its_client_s_address(
    reader: Reader,
) -> None:
    """Per-address limits (anonymous clients) at the reader see the client's address, not
    the forwarding instance's: it travels signed in ``WSNMOM-Forwarded-For``."""
    url, close = front([owner_info(reader.url)])
    host, port = url.removeprefix("http://").split(":")
    try:
        # the client connects from another loopback address than the instances
        connection = http.client.HTTPConnection(
            host, int(port), timeout=10, source_address=("127.0.0.2", 0)
        )
        try:
            connection.request("POST", PATH, body=BODY, headers={"Content-Type": content_type()})
            assert connection.getresponse().read() == b"<answer/>"
        finally:
            connection.close()
        assert reader.addresses == ["127.0.0.2"]
    finally:
        close()
    # a client cannot name an address: without a signature, or with one for another
    now = int(time.time())
    named = {FORWARDED_FOR_HEADER: "192.0.2.1"}
    assert post(reader.url, **named).status_code == 200
    assert reader.addresses[1:] == [None]
    unsigned = {FORWARD_HEADER: signed(SECRET, "g0", now, PATH, BODY), **named}
    assert post(reader.url, **unsigned).status_code == 403
    other = {FORWARD_HEADER: signed(SECRET, "g0", now, PATH, BODY, "", "192.0.2.2"), **named}
    assert post(reader.url, **other).status_code == 403
    assert len(reader.addresses) == 2


def test_the_rate_limit_counts_the_forwarded_client_s_address() -> None:
    from wsnmom.core.config import QuotaSettings, Settings
    from wsnmom.soap_frontend import create_app

    from tests.soap_frontend.fake_service import FakeService
    from tests.support.soap import notify_body

    app = create_app(
        FakeService(), Settings(quotas=QuotaSettings(rate=0.001, burst=1), max_request_bytes=4096)
    )
    client = app.test_client()
    notify = envelope(notify_body(("tns:a", "<p:x xmlns:p='urn:p'>1</p:x>")))

    def status(forwarded_for: str) -> int:
        # both come from the forwarding instance's address
        base = {"REMOTE_ADDR": "10.0.0.1", FORWARDED_ADDRESS_KEY: forwarded_for}
        r = client.post("/wsn/broker", data=notify, content_type=content_type(), environ_base=base)
        return r.status_code

    assert status("192.0.2.1") < 300
    assert status("192.0.2.1") == 429  # its one request of the burst is spent
    assert status("192.0.2.2") < 300  # another client behind the same instance


def test_a_replayed_forward_is_refused_by_the_reader_and_by_every_other_instance() -> None:
    """A forwarded request captured on its way and sent again within its validity, to the
    same reader or to another instance (the nonce is recorded where all see it: here one
    set, in a cluster the store), is refused with 403 and a fault saying so; the
    application saw it once."""
    nonces: set[str] = set()
    first, second = Reader(nonces), Reader(nonces)
    url, close = front([owner_info(first.url)])
    try:
        assert post(url).content == b"<answer/>"
        [(_, _, captured)] = first.seen
        header = captured["HTTP_WSNMOM_FORWARDED"]
        assert len(header.split(" ")) == 4  # instance, time, nonce, MAC
        replay = {FORWARD_HEADER: header, FORWARDED_FOR_HEADER: "127.0.0.1"}
        assert captured["HTTP_WSNMOM_FORWARDED_FOR"] == "127.0.0.1"
        for target in (first, second):
            r = post(target.url, **replay)
            assert r.status_code == 403
            assert fault_name(r.content) is not None and "replayed" in r.text
        assert len(first.seen) == 1 and second.seen == []
        # a fresh forward of the same request goes through: each forward has its nonce
        assert post(url).content == b"<answer/>"
        assert len(first.seen) == 2
        assert first.seen[1][2]["HTTP_WSNMOM_FORWARDED"] != header
        # the nonce is covered by the MAC: another nonce in the captured header fails
        parts = header.split(" ")
        forged = " ".join([*parts[:2], secrets.token_hex(16), parts[3]])
        r = post(second.url, **{**replay, FORWARD_HEADER: forged})
        assert r.status_code == 403 and "replayed" not in r.text
        assert second.seen == []
    finally:
        close()
        first.close()
        second.close()


def test_the_signature_covers_the_method_and_the_query(reader: Reader) -> None:
    now = int(time.time())
    for why, value in {
        "signed for GET": signed(SECRET, "g0", now, PATH, BODY, method="GET"),
        "signed with a query": signed(SECRET, "g0", now, PATH + "?count=5", BODY),
    }.items():
        assert post(reader.url, **{FORWARD_HEADER: value}).status_code == 403, why
    assert reader.seen == []


def test_an_https_reader_is_checked_against_the_outbound_ca_bundle(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``https://`` cluster address: the reader's certificate is checked against the
    CA bundle of every outbound HTTPS (``REQUESTS_CA_BUNDLE``, else certifi's): trusted
    there, the request is forwarded; not trusted, it is "try again" (503), never sent."""
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    reader = Reader(tls=ca.issue_cert("127.0.0.1"))
    try:
        assert reader.url.startswith("https://")
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        url, close = front([owner_info(reader.url)])
        try:
            r = post(url)
            assert r.status_code == 503 and fault_name(r.content) == "ResourceUnavailableFault"
        finally:
            close()
        assert reader.seen == []
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "ca.pem"))
        url, close = front([owner_info(reader.url)])
        try:
            r = post(url)
            assert r.status_code == 200 and r.headers["WSNMOM-Instance"] == "g1"
        finally:
            close()
        assert len(reader.seen) == 1
    finally:
        reader.close()


def test_the_forwarded_path_is_the_one_signed_and_served(reader: Reader) -> None:
    """A path holding characters a request line reserves (an admin's peek of an id with a
    ``?``, a space) reaches the reader as that path, percent-encoded, not cut at the ``?``
    into another path and a query; and a signature for a path with a ``?`` in it is not one
    for the path before it with the rest as query."""
    from wsnmom.core.pull_owners import Reader as Holder

    forward = PullForward(lambda _e, _s: [b""], readers("g0", here=False, table=[]), 1 << 20)
    holder = Holder(False, "g1", reader.url)
    for path in ("/wsn/admin/api/pullpoints/a?b/peek", "/wsn/admin/api/pullpoints/a b/peek"):
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "count=2"}
        answer = forward.relay(environ, holder, "a", b"")
        assert answer.status.startswith("200"), path
        assert reader.seen[-1][0] == path
    # the header made for the path "pp-1?x", sent again (by someone on the way) with the
    # request line of pull point pp-1 and the query "x": it does not verify
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"{PATH}?x", "CONTENT_TYPE": content_type()}
    forward.relay(environ, holder, "a", BODY)
    value = reader.seen[-1][2]["HTTP_WSNMOM_FORWARDED"]
    r = post(reader.url, f"{PATH}?x", **{FORWARD_HEADER: value})
    assert r.status_code == 403 and "for the cluster's instances" in r.text
    assert all(seen[0] != PATH for seen in reader.seen)


def test_a_made_up_header_with_other_characters_is_refused_quietly(
    reader: Reader, caplog: pytest.LogCaptureFixture
) -> None:
    """A forwarding header with characters outside ASCII (a time of Unicode digits, an
    instance name in Latin-1) is refused as any that does not verify: 403, logged as a
    refusal, never as a failure of the cluster's secret with a traceback."""
    now = int(time.time())
    nonce = secrets.token_hex(16)
    for value in (f"g0 {now}\u00b2 {nonce} {'0' * 64}", f"g\u00e9 {now} {nonce} {'0' * 64}"):
        caplog.clear()
        r = post(reader.url, **{FORWARD_HEADER: value})
        assert r.status_code == 403, value
        assert not [rec for rec in caplog.records if rec.levelname == "WARNING"], value
    assert reader.seen == []


def test_a_forwarded_request_is_try_again_while_the_reader_cannot_read_the_secret() -> None:
    """A reader that has not read the cluster's secret yet while the store does not
    answer cannot check a forwarded request: "try again" (503, relayed to the client as
    such), not a refusal of the header as made up (403, a Sender fault the client would
    not retry)."""

    def store_down() -> str:
        raise OSError("the store does not answer")

    def app(_environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"served"]

    owners = PullOwners(
        active=True,
        instance="g1",
        shards=4,
        lease=3.0,
        delivers=lambda _id: True,
        instances=lambda: [],
        retry_after=5.0,
        secret=store_down,
    )
    port = free_port()
    server = make_server("127.0.0.1", port, PullForward(app, owners, 1 << 20), handler_class=Quiet)
    serve(server)
    try:
        value = signed(SECRET, "g0", int(time.time()), PATH, BODY)
        r = post(f"http://127.0.0.1:{port}", **{FORWARD_HEADER: value})
    finally:
        server.shutdown()
        server.server_close()
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert fault_name(r.content) == "ResourceUnavailableFault"
