"""The WSDL's ``soap:address`` and ``schemaLocation`` values use the base of the endpoint
references: ``public_url``; forwarding headers only from trusted proxies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree
from wsnmom.core.config import load_settings
from wsnmom.soap_frontend.public_base import forwarded_base, is_trusted

from tests.support.soap import content_type, envelope, epr_address
from wsnmom.server import build_runtime

WSDL = "http://schemas.xmlsoap.org/wsdl/"
XSD = "http://www.w3.org/2001/XMLSchema"
SOAP11_WSDL = "http://schemas.xmlsoap.org/wsdl/soap/"
SOAP12_WSDL = "http://schemas.xmlsoap.org/wsdl/soap12/"


@pytest.fixture
def gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    overrides = {"data_dir": str(tmp_path), **getattr(request, "param", {})}
    runtime = build_runtime(load_settings(None, environ={}, overrides=overrides))
    try:
        yield runtime.app.test_client()
    finally:
        runtime.close()


def _addresses(wsdl: bytes) -> tuple[list[str], list[str]]:
    doc = etree.fromstring(wsdl)
    soap = [
        el.get("location")
        for ns in (SOAP11_WSDL, SOAP12_WSDL)
        for el in doc.iter(f"{{{ns}}}address")
    ]
    schemas = [el.get("schemaLocation") for el in doc.iter(f"{{{XSD}}}import")]
    assert soap and schemas
    return soap, schemas


def _pull_point_address(client: Any) -> str:
    data = envelope("<wsnt:CreatePullPoint/>")
    resp = client.post("/wsn/broker", data=data, content_type=content_type("1.2"))
    assert resp.status_code == 200, resp.data
    body = etree.fromstring(resp.data)
    epr = body.find(f".//{{{'http://docs.oasis-open.org/wsn/b-2'}}}PullPoint")
    assert epr is not None
    return epr_address(epr)


def _assert_base(client: Any, base: str, **headers: str) -> None:
    for path in ("/wsn/broker?wsdl", "/wsn/wsdl"):
        resp = client.get(path, headers=headers)
        soap, schemas = _addresses(resp.data)
        assert all(a.startswith(f"{base}/wsn/") for a in soap), soap
        assert all(s.startswith(f"{base}/wsn/schemas/") for s in schemas), schemas


@pytest.mark.parametrize(
    "gateway", [{"public_url": "https://wsn.example.org/gateway/"}], indirect=True
)
def test_public_url_is_the_base_of_wsdl_and_eprs(gateway: Any) -> None:
    base = "https://wsn.example.org/gateway"
    _assert_base(gateway, base)
    # behind TLS termination: the request itself is plain http to localhost
    _assert_base(gateway, base, **{"X-Forwarded-Proto": "http", "Host": "internal:8080"})
    assert _pull_point_address(gateway).startswith(f"{base}/wsn/pullpoints/")


@pytest.mark.parametrize("gateway", [{"port": 8123}], indirect=True)
def test_without_public_url_wsdl_and_eprs_share_the_listen_address(gateway: Any) -> None:
    _assert_base(gateway, "http://127.0.0.1:8123", Host="other-name:9999")
    assert _pull_point_address(gateway).startswith("http://127.0.0.1:8123/wsn/pullpoints/")


@pytest.mark.parametrize("gateway", [{"port": 8123}], indirect=True)
def test_forwarding_headers_are_ignored_from_untrusted_peers(gateway: Any) -> None:
    headers = {
        "Forwarded": "proto=https;host=evil.example",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "evil.example",
    }
    _assert_base(gateway, "http://127.0.0.1:8123", **headers)


@pytest.mark.parametrize(
    "gateway", [{"trusted_proxies": ["127.0.0.0/8"], "port": 8123}], indirect=True
)
def test_trusted_proxy_headers_set_the_wsdl_base(gateway: Any) -> None:
    # werkzeug's test client connects from 127.0.0.1
    _assert_base(
        gateway,
        "https://wsn.example.org",
        **{"X-Forwarded-Proto": "https", "X-Forwarded-Host": "wsn.example.org"},
    )
    _assert_base(
        gateway,
        "https://edge.example:8443",
        Forwarded=(
            'for=192.0.2.60;proto=http, for="198.51.100.17";proto=https;host=edge.example:8443'
        ),
    )
    # a malformed value is ignored: the listen address stays
    _assert_base(gateway, "http://127.0.0.1:8123", **{"X-Forwarded-Host": "a b/<x>"})


@pytest.mark.parametrize(
    "gateway", [{"host": "0.0.0.0", "port": 8124, "auth__required": "false"}], indirect=True
)
def test_wildcard_listen_address_uses_the_request_host(gateway: Any) -> None:
    _assert_base(gateway, "http://gw.example:8124", Host="gw.example:8124")


def test_wsdl_base_comes_from_the_service_settings_not_the_app() -> None:
    """Fake frontends without settings (unit tests of the app) still get a WSDL."""
    from wsnmom.soap_frontend.app import create_app

    from tests.soap_frontend.fake_service import FakeService

    client = create_app(FakeService()).test_client()
    soap, _ = _addresses(client.get("/wsn/wsdl", base_url="http://h:1").data)
    assert all(a.startswith("http://h:1/wsn/") for a in soap)


_PROTO, _HOST, _PORT = "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST", "HTTP_X_FORWARDED_PORT"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({_PROTO: "https"}, "https://gw:8080"),
        ({_PROTO: "https, http"}, "http://gw:8080"),
        ({_HOST: "a.example", _PORT: "8443"}, "http://a.example:8443"),
        ({_PROTO: "https", _HOST: "a.example", _PORT: "443"}, "https://a.example"),
        ({"HTTP_FORWARDED": 'proto=https;host="[2001:db8::1]:8443"'}, "https://[2001:db8::1]:8443"),
        ({"HTTP_FORWARDED": "proto=gopher"}, None),
        ({_HOST: "x\r\nInjected: 1"}, None),
        ({}, None),
    ],
)
def test_forwarded_base(environ: dict[str, str], expected: str | None) -> None:
    assert forwarded_base(environ, "http://gw:8080") == expected


def test_is_trusted() -> None:
    assert is_trusted("10.1.2.3", ["10.0.0.0/8"])
    assert is_trusted("::1", ["::1"])
    assert is_trusted("203.0.113.9", ["*"])
    assert not is_trusted("192.0.2.1", ["10.0.0.0/8", "127.0.0.1"])
    assert not is_trusted(None, ["10.0.0.0/8"])
    assert not is_trusted("not-an-ip", ["10.0.0.0/8"])
