"""A gateway serving HTTPS (``--certfile``, optionally ``--client-ca``) with certificates
from ``trustme``, for the TLS tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import trustme

from tests.fixtures.server import RunningServer
from wsnmom.testing.gateway import GatewayFailed


@dataclass
class Certificates:
    """A CA, the gateway's certificate (127.0.0.1, localhost), client certificates
    ``device-1`` and ``device-2`` it signed and a ``stranger``'s it did not, as PEM files
    in ``dir``."""

    dir: Path
    ca: trustme.CA = field(default_factory=trustme.CA)

    def __post_init__(self) -> None:
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        server.private_key_and_cert_chain_pem.write_to_path(str(self.dir / "server.pem"))
        self.ca.cert_pem.write_to_path(str(self.dir / "ca.pem"))
        for name in ("device-1", "device-2"):
            leaf = self.ca.issue_cert(f"{name}.example", common_name=name, organization_name="Acme")
            leaf.private_key_and_cert_chain_pem.write_to_path(str(self.dir / f"{name}.pem"))
        stranger = trustme.CA().issue_cert("x.example", common_name="device-1")
        stranger.private_key_and_cert_chain_pem.write_to_path(str(self.dir / "stranger.pem"))

    def path(self, name: str) -> str:
        return str(self.dir / f"{name}.pem")


@dataclass
class TlsGateway(RunningServer):
    """``wsnmom serve`` over HTTPS with ``certs``."""

    certs: Certificates | None = None
    client_cert: str = "required"
    #: ask for client certificates (``--client-ca``)
    mutual: bool = True

    @property
    def base_url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def command(self) -> list[str]:
        assert self.certs is not None
        command = [*super().command(), "--certfile", self.certs.path("server")]
        if self.mutual:
            command += ["--client-ca", self.certs.path("ca")]
        return command

    def _wait_ready(self, timeout: float, path: str = "/readyz") -> None:
        assert self.process is not None and self.certs is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GatewayFailed(self.log_tail())
            try:
                resp = requests.get(
                    self.base_url + path,
                    verify=self.certs.path("ca"),
                    cert=self.certs.path("device-1"),
                    timeout=5,  # one try; the deadline bounds the wait
                )
                if resp.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise GatewayFailed(self.log_tail())
