"""The outbound client reads proxies and the CA bundle from the environment once:
deliveries go through ``http_proxy`` unless ``no_proxy`` names the host, HTTPS consumers are
checked against the CA bundle and reached through ``https_proxy`` with a CONNECT tunnel
(proxy credentials from the proxy URL), a change of the environment after start-up has no
effect, and ``~/.netrc`` credentials are never sent."""

from __future__ import annotations

import base64
import select
import socket
import socketserver
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ports import DeliveryFailed
from wsnmom.soap_frontend.client import OutboundEnvironment, SoapClient

from tests.fixtures.server import ConsumerServer
from tests.soap_frontend.test_client import _deliveries
from tests.support.threads import serve

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


@pytest.fixture
def proxy() -> Iterator[ConsumerServer]:
    """Answers like a consumer; a request sent through it carries the absolute URL."""
    server = ConsumerServer()
    try:
        yield server
    finally:
        server.close()


def _notify(client: SoapClient, consumer: ConsumerServer) -> None:
    client.notify(
        EndpointReference(consumer.address("/c")),
        SoapVersion.SOAP12,
        _deliveries(1),
        use_raw=False,
        timeout=5,
    )


def test_delivery_goes_through_the_proxy(
    clean_env: pytest.MonkeyPatch, consumer: ConsumerServer, proxy: ConsumerServer
) -> None:
    clean_env.setenv("http_proxy", proxy.url)
    _notify(SoapClient(), consumer)
    assert [r.path for r in proxy.notifies()] == [consumer.address("/c")]
    assert consumer.notifies() == []


def test_no_proxy_host_is_called_directly(
    clean_env: pytest.MonkeyPatch, consumer: ConsumerServer, proxy: ConsumerServer
) -> None:
    clean_env.setenv("http_proxy", proxy.url)
    clean_env.setenv("no_proxy", "localhost,127.0.0.1")
    client = SoapClient()
    _notify(client, consumer)
    _notify(client, consumer)  # the second one from the per-host decision
    assert [r.path for r in consumer.notifies()] == ["/c", "/c"]
    assert proxy.notifies() == []


def test_environment_is_read_once(
    clean_env: pytest.MonkeyPatch, consumer: ConsumerServer, proxy: ConsumerServer
) -> None:
    client = SoapClient()
    clean_env.setenv("http_proxy", proxy.url)
    _notify(client, consumer)
    assert len(consumer.notifies()) == 1 and proxy.notifies() == []


def test_netrc_credentials_are_not_sent(
    clean_env: pytest.MonkeyPatch, consumer: ConsumerServer, tmp_path: Path
) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login user password secret\n")
    netrc.chmod(0o600)
    clean_env.setenv("NETRC", str(netrc))
    _notify(SoapClient(), consumer)
    (rec,) = consumer.notifies()
    assert "Authorization" not in rec.headers


def test_bundle_variables_in_order_of_precedence(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CURL_CA_BUNDLE", "/second.pem")
    assert OutboundEnvironment.from_environ().ca_bundle == "/second.pem"
    clean_env.setenv("REQUESTS_CA_BUNDLE", "/first.pem")
    assert OutboundEnvironment.from_environ().ca_bundle == "/first.pem"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_consumer(ca: trustme.CA) -> Iterator[ConsumerServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = ConsumerServer(tls=context)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def test_https_consumer_checked_against_the_bundle(
    clean_env: pytest.MonkeyPatch, tls_consumer: ConsumerServer, ca_file: str
) -> None:
    clean_env.setenv("REQUESTS_CA_BUNDLE", ca_file)
    _notify(SoapClient(), tls_consumer)
    assert [r.path for r in tls_consumer.notifies()] == ["/c"]


def test_https_consumer_with_an_unknown_ca_is_refused(
    clean_env: pytest.MonkeyPatch, tls_consumer: ConsumerServer
) -> None:
    with pytest.raises(DeliveryFailed, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
        _notify(SoapClient(), tls_consumer)
    assert tls_consumer.notifies() == []


class TunnelProxy:
    """A CONNECT-only HTTP proxy that records each tunnel's request head."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                client: socket.socket = self.request
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = client.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                outer.heads.append(head)
                host, _, port = head.split(b" ", 2)[1].decode().rpartition(":")
                with socket.create_connection((host, int(port))) as upstream:
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    _relay(client, upstream)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        serve(self.server)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _relay(a: socket.socket, b: socket.socket) -> None:
    while True:
        ready, _, _ = select.select([a, b], [], [], 5.0)
        if not ready:
            return
        for sock in ready:
            data = sock.recv(65536)
            if not data:
                return
            (b if sock is a else a).sendall(data)


@pytest.fixture
def tunnel() -> Iterator[TunnelProxy]:
    proxy = TunnelProxy()
    try:
        yield proxy
    finally:
        proxy.close()


def test_https_goes_through_the_proxy_in_a_tunnel(
    clean_env: pytest.MonkeyPatch,
    tls_consumer: ConsumerServer,
    ca_file: str,
    tunnel: TunnelProxy,
) -> None:
    clean_env.setenv("REQUESTS_CA_BUNDLE", ca_file)
    clean_env.setenv("https_proxy", tunnel.url.replace("http://", "http://u%40x:p%3Aw@"))
    _notify(SoapClient(), tls_consumer)
    assert [r.path for r in tls_consumer.notifies()] == ["/c"]
    (head,) = tunnel.heads
    assert head.startswith(f"CONNECT 127.0.0.1:{tls_consumer.port} ".encode())
    credentials = base64.b64encode(b"u@x:p:w")
    assert b"Proxy-Authorization: Basic " + credentials in head
    # the consumer never sees the proxy credentials
    assert "Proxy-Authorization" not in tls_consumer.notifies()[0].headers


def _named_tls_consumer(ca: trustme.CA, name: str, sni: list[str]) -> ConsumerServer:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(context)

    def record(sock: Any, server_name: str | None, ctx: Any) -> None:
        sni.append(server_name or "")

    context.sni_callback = record
    return ConsumerServer(tls=context)


def test_https_to_a_name_verifies_the_name_at_the_checked_address(
    clean_env: pytest.MonkeyPatch, ca: trustme.CA, ca_file: str
) -> None:
    """The connection goes to the address the policy checked (the injected resolver's),
    while SNI and the certificate check use the consumer's host name; a certificate for
    another name is refused."""
    clean_env.setenv("REQUESTS_CA_BUNDLE", ca_file)
    policy = OutboundPolicy(resolver=lambda host, port: ["127.0.0.1"])
    sni: list[str] = []
    server = _named_tls_consumer(ca, "consumer.test", sni)
    try:
        client = SoapClient(policy=policy)
        target = EndpointReference(f"https://consumer.test:{server.port}/c")
        client.notify(target, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=5)
        (rec,) = server.notifies()
        assert rec.headers["Host"] == f"consumer.test:{server.port}"
        assert sni == ["consumer.test"]
        other = EndpointReference(f"https://other.test:{server.port}/c")
        with pytest.raises(DeliveryFailed, match=r"CERTIFICATE_VERIFY_FAILED|match|mismatch"):
            client.notify(other, SoapVersion.SOAP12, _deliveries(1), use_raw=False, timeout=5)
        assert len(server.notifies()) == 1
    finally:
        server.close()
