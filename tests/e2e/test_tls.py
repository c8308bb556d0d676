"""HTTPS served by the gateway itself, with mutual TLS (``--certfile``, ``--keyfile``,
``--client-ca``): certificates from ``trustme``, loopback only.  Two gateways for the
module (~4 s): client certificates required, and optional (with an admin token)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from lxml import etree

from tests.fixtures.server import free_port, serving
from tests.support.soap import (
    NS,
    content_type,
    envelope,
    epr_address,
    fault_name,
    notify_body,
    subscribe_body,
)
from tests.support.tls import Certificates, TlsGateway
from tests.support.waiting import wait_until
from wsnmom.client import WsnClient

pytestmark = pytest.mark.e2e

TOKEN = "tls-admin-token"


@pytest.fixture(scope="module")
def certs() -> Iterator[Certificates]:
    folder = Path(tempfile.mkdtemp(prefix="wsnmom-tls-certs-"))
    try:
        yield Certificates(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _gateway(certs: Certificates, client_cert: str, env: dict[str, str]) -> Iterator[TlsGateway]:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-tls-"))
    users = data_dir / "users.toml"
    users.write_text("[users.device-2]\nadmin = true\n")
    users.chmod(0o600)
    server = TlsGateway(
        "embedded",
        f"embedded://{data_dir / 'mw'}",
        data_dir,
        free_port(),
        extra_env={
            "WSNMOM_TLS__CLIENT_CERT": client_cert,
            "WSNMOM_AUTH__TLS_IDENTITY": "cn",
            "WSNMOM_AUTH__USERS_FILE": str(users),
            **env,
        },
        certs=certs,
        client_cert=client_cert,
    )
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def mutual(certs: Certificates) -> Iterator[TlsGateway]:
    yield from _gateway(certs, "required", {})


@pytest.fixture(scope="module")
def optional(certs: Certificates) -> Iterator[TlsGateway]:
    yield from _gateway(certs, "optional", {"WSNMOM_AUTH__ADMIN_TOKEN": TOKEN})


def _post(
    gateway: TlsGateway, url: str, body: str, cert: str | None, **kw: Any
) -> requests.Response:
    assert gateway.certs is not None
    return requests.post(
        url,
        data=envelope(body),
        headers={"Content-Type": content_type(), **kw.pop("headers", {})},
        verify=gateway.certs.path("ca"),
        cert=gateway.certs.path(cert) if cert else None,
        timeout=10,
        **kw,
    )


def test_client_certificates_are_identities(mutual: TlsGateway) -> None:
    assert mutual.broker_url.startswith("https://")
    resp = _post(mutual, mutual.broker_url, "<wsnt:CreatePullPoint/>", "device-1")
    assert resp.status_code == 200, resp.content
    ref = etree.fromstring(resp.content).find(".//wsnt:PullPoint", NS)
    assert ref is not None
    address = epr_address(ref)
    assert address.startswith(mutual.base_url + "/wsn/pullpoints/")  # EPRs say https
    # device-1 owns it: device-2 is an admin (credentials file), a stranger is not known
    assert _post(mutual, address, "<wsnt:GetMessages/>", "device-1").status_code == 200
    assert _post(mutual, address, "<wsnt:GetMessages/>", "device-2").status_code == 200
    wsdl = requests.get(
        mutual.broker_url + "?wsdl",
        verify=mutual.certs.path("ca") if mutual.certs else True,
        cert=mutual.certs.path("device-1") if mutual.certs else None,
        timeout=5,
    )
    assert b'location="https://127.0.0.1:' in wsdl.content


def test_without_a_valid_certificate_the_handshake_fails(mutual: TlsGateway) -> None:
    for cert in (None, "stranger"):
        with pytest.raises(requests.exceptions.SSLError):
            _post(mutual, mutual.broker_url, "<wsnt:CreatePullPoint/>", cert)
    # plain HTTP to the HTTPS port is no answer either; the gateway goes on serving
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{mutual.port}/healthz", timeout=3)
    assert _post(mutual, mutual.broker_url, "<wsnt:CreatePullPoint/>", "device-1").ok


def test_a_silent_client_does_not_hold_the_handshakes_back(mutual: TlsGateway) -> None:
    """cheroot would do the TLS handshake on its accepting thread: one connection that
    sends nothing would delay everyone by the server's timeout (10 s)."""
    silent = [socket.create_connection(("127.0.0.1", mutual.port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        started = time.monotonic()
        resp = _post(mutual, mutual.broker_url, "<wsnt:CreatePullPoint/>", "device-1")
        assert resp.status_code == 200
        # not held back by the silent ones (that is the server's 10 s timeout)
        assert time.monotonic() - started < 6.0
    finally:
        for sock in silent:
            sock.close()


def _notify_big(gateway: TlsGateway, ns: str, count: int) -> None:
    for n in range(count):
        payload = f'<p:v xmlns:p="urn:p" n="{n}">{"x" * BIG}</p:v>'
        body = notify_body(("tns:big", payload), ns=ns)
        resp = _post(gateway, gateway.broker_url, body, "device-1")
        assert resp.status_code in (200, 202), resp.content


def _numbers(data: bytes) -> list[int]:
    return [int(v.get("n", "-1")) for v in etree.fromstring(data).iter("{urn:p}v")]


def _send_queue(local_port: int, remote_port: int) -> int | None:
    """The bytes in the send queue of this host's IPv4 TCP socket from ``local_port`` to
    ``remote_port`` (``/proc/net/tcp``'s tx_queue), None when there is no such socket."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == (
            remote_port
        ):
            return int(queues.split(":")[0], 16)
    return None


#: message size of the cut answer: its 12 messages fit in the kernel's send queue on
#: loopback (cheroot's ``sendall`` returns), not in the client's 4 KB receive window
BIG = 2 * 1024


def test_a_get_messages_answer_the_client_went_away_from_comes_again(mutual: TlsGateway) -> None:
    """Over HTTPS too, a GetMessages answer is settled once its bytes left the host
    (``wsnmom.sent_answers.settle_once_sent``): cheroot's write returns once the answer is
    in the kernel's send queue.  The client (a 4 KB receive buffer) reads the head, waits
    until the rest of the answer sits in the gateway's send queue (cheroot's write
    returned), and closes.  Before, the answer was settled when that write returned and
    its messages were lost (checked: timed out waiting for them)."""
    ns = f"urn:test:tls-cut-{time.monotonic_ns()}"
    created = _post(mutual, mutual.broker_url, "<wsnt:CreatePullPoint/>", "device-1")
    ref = etree.fromstring(created.content).find(".//wsnt:PullPoint", NS)
    assert ref is not None
    pp = epr_address(ref)
    consumer = subscribe_body(pp, "tns:big", ns=ns)
    assert _post(mutual, mutual.broker_url, consumer, "device-1").status_code == 200
    count = 12
    _notify_big(mutual, ns, count)
    assert mutual.certs is not None
    context = ssl.create_default_context(cafile=mutual.certs.path("ca"))
    context.load_cert_chain(mutual.certs.path("device-1"))
    ask = f"<wsnt:MaximumNumber>{count}</wsnt:MaximumNumber>"
    body = envelope(f"<wsnt:GetMessages>{ask}</wsnt:GetMessages>")
    request = (
        f"POST /{pp.split('/', 3)[3]} HTTP/1.1\r\nHost: 127.0.0.1:{mutual.port}\r\n"
        f"Content-Type: {content_type()}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    def cut() -> bool:
        """Ask, read the head, let the gateway's write return, go; whether the answer
        carried messages."""
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(30)
        raw.connect(("127.0.0.1", mutual.port))
        client_port = raw.getsockname()[1]
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(request)
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = sock.recv(1024)
                assert chunk, got
                got += chunk
            head, _, _ = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            if length <= BIG:
                return False  # no message yet
            # the rest (more than the client's window) in the gateway's send queue, no
            # longer growing: cheroot's sendall has returned
            rest = length - (len(got) - len(head) - 4) - 8192
            seen: list[int | None] = []

            def written() -> bool:
                seen.append(_send_queue(mutual.port, client_port))
                return (
                    len(seen) >= 3
                    and seen[-1] == seen[-2] == seen[-3]
                    and ((seen[-1] or 0) >= rest)
                )

            wait_until(written, 30, what=f"the answer in the send queue, seen {seen[-3:]}")
        return True  # closed with the answer unread: the kernel resets the connection

    wait_until(cut, 30, what="an answer with messages")
    got: list[int] = []

    def all_again() -> bool:
        answer = _post(mutual, pp, f"<wsnt:GetMessages>{ask}</wsnt:GetMessages>", "device-1")
        assert answer.status_code == 200, answer.content
        got.extend(_numbers(answer.content))
        return set(got) >= set(range(count))

    wait_until(all_again, 30, what=f"messages 0..{count - 1} again, got {got}")
    assert _post(mutual, pp, "<wsnt:DestroyPullPoint/>", "device-1").status_code == 200


def test_optional_certificates_and_other_credentials(optional: TlsGateway) -> None:
    body = "<wsnt:CreatePullPoint/>"
    assert _post(optional, optional.broker_url, body, "device-1").status_code == 200
    anonymous = _post(optional, optional.broker_url, body, None)
    assert anonymous.status_code == 401 and b"FailedAuthentication" in anonymous.content
    bearer = _post(
        optional, optional.broker_url, body, None, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bearer.status_code == 200
    # the Python client over HTTPS: trusting the CA; a bearer token or a certificate
    assert optional.certs is not None
    ca = optional.certs.path("ca")
    with WsnClient(optional.broker_url, verify=ca, token=TOKEN) as wsn:
        assert wsn.create_pull_point().address.startswith("https://")
    cert = optional.certs.path("device-1")
    with WsnClient(optional.broker_url, verify=ca, cert=cert) as wsn:
        assert wsn.create_pull_point().address.startswith("https://")
    shell = subprocess.run(
        [sys.executable, "-m", "wsnmom", "notify", "--broker", optional.broker_url,
         "--cacert", ca, "--cert", cert, "{urn:test:tls}a", "<a/>"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    check = subprocess.run(
        [sys.executable, "-m", "wsnmom", "check", optional.broker_url, "--cacert", ca,
         "--token", TOKEN],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0 and "a WS-Notification broker" in check.stdout, check.stdout
    denied = _post(optional, optional.broker_url, "<wsnt:GetMessages/>", "device-1")
    assert fault_name(denied.content) == "ResourceUnknownFault"  # no pull point addressed


def test_rfc4514_subjects() -> None:
    from wsnmom.https import common_name, rfc4514

    subject = (
        (("countryName", "NO"),),
        (("organizationName", "Acme, Inc."),),
        (("commonName", "dev 1"), ("userId", "42")),
    )
    assert rfc4514(subject) == "CN=dev 1+UID=42,O=Acme\\, Inc.,C=NO"
    assert common_name(subject) == "dev 1"
    ssl.create_default_context()  # the module needs nothing else from ssl here
