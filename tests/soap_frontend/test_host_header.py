"""DNS rebinding (issue 22, item 8): the default loopback gateway answered any ``Host``,
so a web page whose name resolved to 127.0.0.1 read the admin API (200) and could use
the WS-N endpoints.  Requests that act or read private state must now name the gateway
(its address, localhost, ``public_url``'s host, its listen name); public documents and
trusted proxies are not affected (soap_frontend/hosts.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core.config import load_settings

from tests.support.soap import content_type, envelope, fault_name
from wsnmom.server import Runtime, build_runtime

OVERVIEW = "/wsn/admin/api/overview"
CREATE = envelope("<wsnt:CreatePullPoint/>")


@pytest.fixture
def runtime(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Runtime]:
    overrides = {"data_dir": str(tmp_path), "port": 8099, **getattr(request, "param", {})}
    rt = build_runtime(load_settings(None, environ={}, overrides=overrides))
    try:
        yield rt
    finally:
        rt.close()


def _get(rt: Runtime, path: str, host: str, remote: str = "127.0.0.1") -> Any:
    return rt.app.test_client().get(
        path, headers={"Host": host}, environ_base={"REMOTE_ADDR": remote}
    )


def _post(rt: Runtime, host: str, remote: str = "127.0.0.1") -> Any:
    return rt.app.test_client().post(
        "/wsn/broker",
        data=CREATE,
        content_type=content_type("1.2"),
        headers={"Host": host},
        environ_base={"REMOTE_ADDR": remote},
    )


NAMES_OF_THE_GATEWAY = [
    "127.0.0.1:8099",
    "127.0.0.1",
    "localhost:8099",
    "LOCALHOST.",
    "app.localhost:8099",
    "[::1]:8099",
    "192.0.2.4:8099",  # an address never comes from rebinding
]


def test_a_rebinding_name_gets_neither_the_admin_api_nor_the_broker(runtime: Runtime) -> None:
    for host in ("evil.example", "evil.example:8099", "127.0.0.1.evil.example"):
        refused = _get(runtime, OVERVIEW, host)
        assert refused.status_code == 421, (host, refused.data)
        assert b"does not answer for the host" in refused.data
        assert _get(runtime, "/admin", host).status_code == 421
        soap = _post(runtime, host)
        assert soap.status_code == 421 and fault_name(soap.data) == "BaseFault", soap.data
        assert b"does not answer for the host" in soap.data
    assert runtime.service.registry.pull_points.owned_by(None) == 0  # nothing was created
    for host in NAMES_OF_THE_GATEWAY:
        assert _get(runtime, OVERVIEW, host).status_code == 200, host
        assert _post(runtime, host).status_code == 200, host
    assert runtime.service.registry.pull_points.owned_by(None) == len(NAMES_OF_THE_GATEWAY)


def test_public_documents_answer_any_host(runtime: Runtime) -> None:
    for path in ("/wsn/broker?wsdl", "/wsn/wsdl", "/wsn/policy", "/healthz", "/metrics"):
        assert _get(runtime, path, "evil.example").status_code == 200, path


@pytest.mark.parametrize(
    "runtime",
    [{"public_url": "https://wsn.example.org/gw", "trusted_proxies": ["10.0.0.5"]}],
    indirect=True,
)
def test_public_url_and_trusted_proxies(runtime: Runtime) -> None:
    assert _post(runtime, "wsn.example.org").status_code == 200
    assert _post(runtime, "WSN.example.org:443").status_code == 200
    assert _post(runtime, "evil.example").status_code == 421
    # a trusted proxy chose the virtual host: whatever Host it sends is its business
    assert _post(runtime, "backend-pool", remote="10.0.0.5").status_code == 200
    assert _post(runtime, "backend-pool", remote="10.0.0.6").status_code == 421


@pytest.mark.parametrize(
    "runtime",
    [{"host": "0.0.0.0", "auth__required": "false", "public_url": "http://gw.example:8099"}],
    indirect=True,
)
def test_wildcard_listener_with_public_url(runtime: Runtime) -> None:
    machine = socket.gethostname()
    for host in ("gw.example:8099", f"{machine}:8099", "10.1.2.3:8099"):
        assert _post(runtime, host).status_code == 200, host
    assert _post(runtime, "evil.example:8099").status_code == 421


@pytest.mark.parametrize("runtime", [{"host": "0.0.0.0", "auth__required": "false"}], indirect=True)
def test_wildcard_listener_without_public_url_follows_the_host(runtime: Runtime) -> None:
    """Documented: its WSDL and answers follow the request's Host (operations.md); the
    start-up warning asks for public_url, which turns the check on."""
    assert _post(runtime, "any-name.example:8099").status_code == 200


@pytest.mark.parametrize(
    "runtime",
    [
        {
            "host": "0.0.0.0",
            "auth__required": "false",
            "public_url": "http://localhost:8099",
            "allowed_hosts": ["gateway-*", "*.svc.example"],
        }
    ],
    indirect=True,
)
def test_allowed_hosts_name_more_names(runtime: Runtime) -> None:
    """Other containers reach a Compose gateway (public_url localhost) by its service
    name: allowed_hosts lists such names."""
    for host in ("gateway-rabbitmq:8080", "wsn.svc.example", "localhost:8080"):
        assert _post(runtime, host).status_code == 200, host
    assert _post(runtime, "rabbitmq:8080").status_code == 421


@pytest.mark.parametrize("runtime", [{"allowed_hosts": ["*"]}], indirect=True)
def test_allowed_hosts_star_turns_the_check_off(runtime: Runtime) -> None:
    assert _post(runtime, "evil.example").status_code == 200
