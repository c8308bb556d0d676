"""The outbound client reads proxies and the CA bundle from the environment once:
deliveries go through ``http_proxy`` unless ``no_proxy`` names the host, a change of the
environment after start-up has no effect, and ``~/.netrc`` credentials are never sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.soap_frontend.client import OutboundEnvironment, SoapClient

from tests.fixtures.server import ConsumerServer
from tests.soap_frontend.test_client import _deliveries

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


def test_ca_bundle_from_the_environment(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    clean_env.setenv("CURL_CA_BUNDLE", str(bundle))
    assert SoapClient().session.verify == str(bundle)
    clean_env.setenv("REQUESTS_CA_BUNDLE", str(bundle) + ".first")
    assert OutboundEnvironment.from_environ().ca_bundle == str(bundle) + ".first"
