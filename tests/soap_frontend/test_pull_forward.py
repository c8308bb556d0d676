"""``PullForward`` (soap_frontend/pull_forward.py; its signature: forward_signature.py)
over real HTTP: a request to a pull point another instance reads is sent there with a
signature and its answer relayed with the reader's ``WSNMOM-Instance``; a forwarding
header that does not verify is refused (403, and what else a forward may claim and what
verifies it: test_pull_forward_trust.py); with no live reader, or one that cannot be
reached, the answer is ResourceUnavailableFault with 503 and ``Retry-After``.  The
cluster's two instances are two WSGI stacks in this process, the reader served by a real
HTTP server (tests/support/pull_forward_rig.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import make_server

import pytest
import requests
from wsnmom.core.coordination import InstanceInfo, shard_of
from wsnmom.soap_frontend.pull_forward import CONNECT_TIMEOUT, TIMEOUT, PullForward
from wsnmom.soap_frontend.request_ids import RequestIds
from wsnmom.soap_frontend.xml import WSNMOM

from tests.support.ports import closed_port
from tests.support.pull_forward_rig import (
    BODY,
    PATH,
    PP,
    Quiet,
    Reader,
    front,
    owner_info,
    post,
    readers,
)
from tests.support.soap import content_type, envelope, fault_name
from tests.support.threads import serve
from wsnmom.testing.gateway import free_port


@pytest.fixture
def reader() -> Iterator[Reader]:
    with Reader() as r:
        yield r


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
