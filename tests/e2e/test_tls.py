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

from tests.fixtures.server import free_port
from tests.support.soap import NS, content_type, envelope, epr_address, fault_name
from tests.support.tls import Certificates, TlsGateway
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
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


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
