"""``PullForward`` (soap_frontend/pull_forward.py; its signature: forward_signature.py)
over real HTTP: a request to a pull point another instance reads is sent there with a
signature and its answer relayed with the reader's ``WSNMOM-Instance``; a forwarding
header that does not verify is refused (403); with no live reader, or one that cannot be
reached, the answer is ResourceUnavailableFault with 503 and ``Retry-After``.  The
cluster's two instances are two WSGI stacks in this process, the reader served by a real
HTTP server."""

from __future__ import annotations

import contextlib
import http.client
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests
from wsnmom.core.coordination import InstanceInfo, shard_of
from wsnmom.core.pull_owners import PullOwners
from wsnmom.soap_frontend.auth import FORWARDED_ADDRESS_KEY, FORWARDED_IDENTITY_KEY
from wsnmom.soap_frontend.forward_signature import (
    FORWARD_HEADER,
    FORWARDED_FOR_HEADER,
    FORWARDED_IDENTITY_HEADER,
    WINDOW,
    sign,
)
from wsnmom.soap_frontend.pull_forward import CONNECT_TIMEOUT, TIMEOUT, PullForward
from wsnmom.soap_frontend.request_ids import RequestIds
from wsnmom.soap_frontend.xml import WSNMOM

from tests.support.ports import closed_port
from tests.support.soap import content_type, envelope, fault_name
from tests.support.threads import serve
from wsnmom.testing.gateway import free_port

SECRET = "s" * 64


def signed(*args: Any, **named: Any) -> str:
    """:func:`sign` with a fresh nonce."""
    return sign(*args, nonce=secrets.token_hex(16), **named)


PP = "pp-1"
PATH = f"/wsn/pullpoints/{PP}"
BODY = envelope("<wsnt:GetMessages/>")


class Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None


def readers(
    instance: str,
    *,
    here: bool,
    table: list[InstanceInfo],
    secret: str = SECRET,
    nonces: set[str] | None = None,
    fed: dict[str, str] | None = None,
    fed_by: Callable[[str], str | None] | None = None,
    is_pull_point: Callable[[str], bool] = lambda rid: rid == PP,
) -> PullOwners:
    seen = set() if nonces is None else nonces

    def first_use(nonce: str, _expires: float) -> bool:
        if nonce in seen:
            return False
        seen.add(nonce)
        return True

    return PullOwners(
        active=True,
        instance=instance,
        shards=4,
        lease=3.0,
        delivers=lambda _id: here,
        instances=lambda: table,
        retry_after=5.0,
        secret=lambda: secret,
        first_use=first_use,
        fed_by=fed_by or (lambda sid: (fed or {}).get(sid)),
        is_pull_point=is_pull_point,
    )


def owner_info(url: str, *, age: float = 0.1) -> InstanceInfo:
    return InstanceInfo("g1", url, "v", age, ((shard_of(PP, 4), 1),), 2.0)


class Reader:
    """The reading instance: records what reached its application."""

    def __init__(self, nonces: set[str] | None = None, tls: Any = None) -> None:
        self.seen: list[tuple[str, bytes, dict[str, str]]] = []
        #: the identity each request named (``auth.FORWARDED_IDENTITY_KEY``)
        self.identities: list[tuple[str, str] | None] = []
        #: the client address each request named (``auth.FORWARDED_ADDRESS_KEY``)
        self.addresses: list[str | None] = []
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        stack = RequestIds(
            PullForward(self._app, readers("g1", here=True, table=[], nonces=nonces), 1 << 20),
            instance="g1",
        )
        self.server: WSGIServer = make_server("127.0.0.1", port, stack, handler_class=Quiet)
        if tls is not None:  # a trustme certificate: served over HTTPS
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.configure_cert(context)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://127.0.0.1:{port}"
        self.thread = serve(self.server)

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        headers = {k: str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        self.seen.append((str(environ["PATH_INFO"]), body, headers))
        self.identities.append(environ.get(FORWARDED_IDENTITY_KEY))
        self.addresses.append(environ.get(FORWARDED_ADDRESS_KEY))
        start(
            "200 OK",
            [
                ("Content-Type", "application/soap+xml"),
                ("X-Read", "yes"),
                ("Set-Cookie", "reader=g1; Path=/"),
            ],
        )
        return [b"<answer/>"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def reader() -> Iterator[Reader]:
    r = Reader()
    try:
        yield r
    finally:
        r.close()


def front(
    table: list[InstanceInfo],
    fed: dict[str, str] | None = None,
    is_pull_point: Callable[[str], bool] = lambda rid: rid == PP,
) -> tuple[str, Callable[[], None]]:
    """The instance a client asks (g0, not the reader), served over HTTP."""

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    port = free_port()
    stack = RequestIds(
        PullForward(
            local,
            readers("g0", here=False, table=table, fed=fed, is_pull_point=is_pull_point),
            1 << 20,
        ),
        "g0",
    )
    server = make_server("127.0.0.1", port, stack, handler_class=Quiet)
    serve(server)

    def close() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{port}", close


def post(url: str, path: str = PATH, **headers: str) -> requests.Response:
    return requests.post(
        url + path, data=BODY, headers={"Content-Type": content_type(), **headers}, timeout=10
    )


def test_a_request_for_a_pull_point_read_elsewhere_is_forwarded_and_relayed(
    reader: Reader,
) -> None:
    url, close = front([owner_info(reader.url)])
    try:
        r = post(url, Authorization="Basic dTpw", **{"X-Request-Id": "req-1"})
        assert r.status_code == 200 and r.content == b"<answer/>"
        # the answer names the instance that read, once; the request id stays the client's
        assert r.headers["WSNMOM-Instance"] == "g1"
        assert r.headers["X-Request-Id"] == "req-1"
        [(path, body, headers)] = reader.seen
        assert path == PATH and body == BODY
        # the client's credentials go along; the signature verifies
        assert headers["HTTP_AUTHORIZATION"] == "Basic dTpw"
        assert headers["HTTP_X_REQUEST_ID"] == "req-1"
        assert headers["HTTP_WSNMOM_FORWARDED"].startswith("g0 ")
        # other paths are answered where they arrive
        assert post(url, "/wsn/broker").content == b"answered here"
    finally:
        close()


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


def test_no_live_reader_or_an_unreachable_one_answers_try_again() -> None:
    with closed_port() as port:
        tables = {
            "nobody holds the shard": [],
            "its heartbeat is older than the lease": [owner_info("http://127.0.0.1:1", age=5)],
            "it cannot be reached": [owner_info(f"http://127.0.0.1:{port}")],
        }
        for why, table in tables.items():
            url, close = front(table)
            try:
                r = post(url)
            finally:
                close()
            assert r.status_code == 503, why
            assert r.headers["Retry-After"] == "5", why
            assert fault_name(r.content) == "ResourceUnavailableFault", why
            assert r.headers["WSNMOM-Instance"] == "g0", why


def served_by_cheroot(table: list[InstanceInfo]) -> tuple[str, Callable[[], None]]:
    """The instance a client asks (g0), served by cheroot, the HTTPS server's WSGI server
    (it hands a chunked body on as it came: ``Transfer-Encoding`` and no length)."""
    from cheroot import wsgi

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    port = free_port()
    stack = RequestIds(PullForward(local, readers("g0", here=False, table=table), 1 << 20), "g0")
    server = wsgi.Server(("127.0.0.1", port), stack, numthreads=2)
    server.prepare()
    threading.Thread(target=server.serve, daemon=True).start()
    return f"http://127.0.0.1:{port}", server.stop


def test_a_chunked_request_is_forwarded(reader: Reader) -> None:
    url, close = served_by_cheroot([owner_info(reader.url)])
    try:
        r = requests.post(
            url + PATH,
            data=iter([BODY[:10], BODY[10:]]),  # a generator: sent chunked
            headers={"Content-Type": content_type(), "Connection": "close"},
            timeout=10,
        )
        assert r.status_code == 200 and r.content == b"<answer/>"
        [(path, body, _headers)] = reader.seen
        assert path == PATH and body == BODY
    finally:
        close()


def test_a_chunked_request_over_the_limit_is_left_to_the_application(reader: Reader) -> None:
    url, close = served_by_cheroot([owner_info(reader.url)])
    try:
        big = BODY + b" " * (1 << 20)
        r = requests.post(
            url + PATH,
            data=iter([big[: 1 << 19], big[1 << 19 :]]),
            headers={"Content-Type": content_type(), "Connection": "close"},
            timeout=10,
        )
        assert r.content == b"answered here" and reader.seen == []
    finally:
        close()


def test_only_a_pull_point_s_own_path_is_forwarded(reader: Reader) -> None:
    url, close = front([owner_info(reader.url)])
    try:
        for path in (f"/x{PATH}", f"/wsn/admin/api{PATH}", f"/a%20b{PATH}", f"/a%3Fb{PATH}"):
            assert post(url, path).content == b"answered here", path
        assert reader.seen == []
        assert post(url, PATH).content == b"<answer/>"
    finally:
        close()


def test_the_reader_s_own_headers_are_not_relayed(reader: Reader) -> None:
    url, close = front([owner_info(reader.url)])
    try:
        r = post(url)
        assert r.status_code == 200 and r.content == b"<answer/>"
        # its answer's content type and the instance that read it, not its internals
        assert r.headers["Content-Type"] == "application/soap+xml"
        assert r.headers["WSNMOM-Instance"] == "g1"
        assert "X-Read" not in r.headers and "Set-Cookie" not in r.headers
    finally:
        close()


@contextlib.contextmanager
def silent_address() -> Iterator[str]:
    """A loopback address whose connections are never accepted: a listening socket whose
    accept queue is full, so that the kernel drops further SYNs (as a dead host's would
    go unanswered)."""
    listening = socket.socket()
    held: list[socket.socket] = []
    try:
        listening.bind(("127.0.0.1", 0))
        listening.listen(0)
        while True:
            s = socket.socket()
            s.settimeout(0.3)
            try:
                s.connect(listening.getsockname())
            except OSError:
                s.close()
                break
            held.append(s)
        host, port = listening.getsockname()
        yield f"http://{host}:{port}"
    finally:
        for s in held:
            s.close()
        listening.close()


def test_a_reader_that_does_not_accept_is_given_up_well_before_the_client_does() -> None:
    """A reader whose host went silent (its lease not run out yet) holds the forwarding
    thread only for :data:`CONNECT_TIMEOUT`, not for the answer's whole timeout."""
    assert CONNECT_TIMEOUT * 4 < TIMEOUT
    with silent_address() as address:
        url, close = front([owner_info(address)])
        try:
            r = requests.post(
                url + PATH,
                data=BODY,
                headers={"Content-Type": content_type()},
                timeout=CONNECT_TIMEOUT * 4,
            )
        finally:
            close()
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert fault_name(r.content) == "ResourceUnavailableFault"


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


def test_an_onvif_subscription_is_forwarded_to_the_reader_of_the_pull_point_it_feeds(
    reader: Reader,
) -> None:
    """``/onvif/subscriptions/<id>`` (PullMessages, Renew, Unsubscribe,
    SetSynchronizationPoint) goes where the pull point the subscription feeds is read; a
    subscription that feeds none (unknown) is answered where it arrives."""
    url, close = front([owner_info(reader.url)], fed={"sub-1": PP})
    try:
        r = post(url, "/onvif/subscriptions/sub-1")
        assert r.status_code == 200 and r.headers["WSNMOM-Instance"] == "g1"
        [(path, body, _)] = reader.seen
        assert path == "/onvif/subscriptions/sub-1" and body == BODY
        assert post(url, "/onvif/subscriptions/other").content == b"answered here"
        assert post(url, "/onvif/subscriptions/sub-1/x").content == b"answered here"
        assert len(reader.seen) == 1
    finally:
        close()


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


def test_a_request_naming_a_pull_point_in_wsa_to_at_a_shared_endpoint_is_forwarded(
    reader: Reader,
) -> None:
    """A GetMessages posted to the broker, or an ONVIF request posted to the event
    service, with the pull point's (or the ONVIF subscription's) address in ``wsa:To``
    goes to the reader as it came; a Notify whose payload merely holds such a path, a
    request addressed to the broker itself and a malformed one are answered here."""
    url, close = front([owner_info(reader.url)], fed={"sub-1": PP})

    def send(path: str, body: bytes) -> requests.Response:
        return requests.post(
            url + path, data=body, headers={"Content-Type": content_type()}, timeout=10
        )

    base = "http://gateway.example"
    try:
        forwarded = {
            "/wsn/broker": envelope("<wsnt:GetMessages/>", to=base + PATH),
            "/onvif/event_service": envelope(
                "<wsnt:Renew/>", to=base + "/onvif/subscriptions/sub-1"
            ),
        }
        for path, body in forwarded.items():
            r = send(path, body)
            assert r.status_code == 200 and r.headers["WSNMOM-Instance"] == "g1", path
        assert [(p, b) for p, b, _ in reader.seen] == list(forwarded.items())
        here = {
            "a payload naming a pull point": envelope(
                f"<wsnt:Notify><wsnt:NotificationMessage><wsnt:Message>{base}{PATH}"
                "</wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>",
                to=base + "/wsn/broker",
            ),
            "no wsa:To": envelope(f"<wsnt:Subscribe><x>{base}{PATH}</x></wsnt:Subscribe>"),
            "malformed": b"<s:Envelope " + PATH.encode(),
            "a longer path": envelope("<wsnt:GetMessages/>", to=base + PATH + "/x"),
        }
        for why, body in here.items():
            assert send("/wsn/broker", body).content == b"answered here", why
        assert len(reader.seen) == 2
    finally:
        close()


def test_an_onvif_subscription_is_try_again_while_the_store_cannot_say_what_it_feeds(
    reader: Reader,
) -> None:
    """A subscription not in this instance's memory (made through another instance a
    moment ago) is looked up in the store: while the store does not answer, the request is
    "try again" (503), never answered by an instance that may not read its pull point (a
    ResourceUnknownFault there would end the client's subscription)."""
    port = free_port()

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    def store_down(_subscription_id: str) -> str | None:
        raise OSError("the store does not answer")

    owners = readers("g0", here=False, table=[owner_info(reader.url)], fed_by=store_down)
    stack = RequestIds(PullForward(local, owners, 1 << 20), "g0")
    server = make_server("127.0.0.1", port, stack, handler_class=Quiet)
    serve(server)
    try:
        r = post(f"http://127.0.0.1:{port}", "/onvif/subscriptions/sub-1")
    finally:
        server.shutdown()
        server.server_close()
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert fault_name(r.content) == "ResourceUnavailableFault"
    assert reader.seen == []


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


def test_two_instances_each_taking_the_other_for_the_reader_forward_once() -> None:
    """During a shard move A may take B for the reader while B takes A: A's forward is
    served by B (whose core then answers "try again" if it does not read the pull point),
    never sent back: one hop, no loop."""
    served: dict[str, int] = {"g0": 0, "g1": 0}

    def stack(instance: str, table: list[InstanceInfo]) -> tuple[str, Callable[[], None]]:
        def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
            served[instance] += 1
            start("200 OK", [("Content-Type", "text/plain")])
            return [f"answered by {instance}".encode()]

        port = free_port()
        app = RequestIds(
            PullForward(local, readers(instance, here=False, table=table), 1 << 20), instance
        )
        server = make_server("127.0.0.1", port, app, handler_class=Quiet)
        serve(server)

        def close() -> None:
            server.shutdown()
            server.server_close()

        return f"http://127.0.0.1:{port}", close

    table_a: list[InstanceInfo] = []
    table_b: list[InstanceInfo] = []
    url_a, close_a = stack("g0", table_a)
    url_b, close_b = stack("g1", table_b)
    try:
        table_a.append(owner_info(url_b))  # A: g1 reads
        table_b.append(InstanceInfo("g0", url_a, "v", 0.1, ((shard_of(PP, 4), 1),), 2.0))
        r = post(url_a)
        assert r.status_code == 200 and r.content == b"answered by g1"
        assert served == {"g0": 0, "g1": 1}
    finally:
        close_a()
        close_b()


def test_a_request_naming_a_pull_point_by_its_resource_id_at_a_shared_endpoint_is_forwarded(
    reader: Reader,
) -> None:
    """The pull point's EPR carries a ``wsnmom:ResourceId`` reference parameter: a client
    that posts to the broker's address and echoes it (no ``wsa:To`` naming the pull point)
    reaches the reader, as the broker resolves its resource from that header.  Before,
    the instance that does not read it answered "try again" every time.  An id that is
    not a pull point's (a subscription's: any instance answers it) is answered here, and
    while the store cannot say, the answer is "try again"."""

    def param(rid: str) -> str:
        return (
            f'<wsnmom:ResourceId xmlns:wsnmom="{WSNMOM}" wsa:IsReferenceParameter="true">'
            f"{rid}</wsnmom:ResourceId>"
        )

    url, close = front([owner_info(reader.url)], fed={"sub-1": PP})

    def send(body: bytes) -> requests.Response:
        return requests.post(
            url + "/wsn/broker", data=body, headers={"Content-Type": content_type()}, timeout=10
        )

    try:
        named = envelope("<wsnt:GetMessages/>", to=url + "/wsn/broker", headers=param(PP))
        r = send(named)
        assert r.status_code == 200 and r.headers["WSNMOM-Instance"] == "g1"
        assert [(p, b) for p, b, _ in reader.seen] == [("/wsn/broker", named)]
        no_to = envelope("<wsnt:GetMessages/>", headers=param(PP))
        assert send(no_to).status_code == 200 and len(reader.seen) == 2
        # a subscription's id: answered here
        renew = envelope("<wsnt:Renew/>", to=url + "/wsn/broker", headers=param("sub-2"))
        assert send(renew).content == b"answered here"
        assert len(reader.seen) == 2
    finally:
        close()

    # the store does not answer: try again, never read where it may not be read
    def broken(rid: str) -> bool:
        raise OSError("store down")

    url, close = front([owner_info(reader.url)], is_pull_point=broken)
    try:
        r = requests.post(
            url + "/wsn/broker",
            data=envelope("<wsnt:GetMessages/>", headers=param(PP)),
            headers={"Content-Type": content_type()},
            timeout=10,
        )
        assert r.status_code == 503 and r.headers["Retry-After"]
        assert fault_name(r.content) == "ResourceUnavailableFault"
    finally:
        close()
    assert len(reader.seen) == 2
