"""HTTPS served by the gateway itself (``tls.certfile``): the TLS context, the identity of
a client certificate, and the HTTP server that speaks TLS.

waitress has no TLS, so with a certificate the gateway serves through cheroot's threaded
HTTP server and the standard library's ``ssl``.  cheroot would do the TLS handshake of a
new connection on its accepting thread (a client that connects and then sends nothing
would hold every other client back for the server's timeout), and then read each request
on a worker thread (slow clients would hold every worker).  Here the accepting thread only
wraps the socket (:class:`IngressAdapter`, no handshake); the handshake and the reading of
every request happen without blocking in :class:`~wsnmom.tls_ingress.Ingress`, which hands
a worker only complete requests; the ``[connections]`` guard admits connections and cuts
those past a deadline, as it does for waitress (``wsnmom.connections``).  The client
certificate is read when the request's environ is built, after the handshake.

Mutual TLS (``tls.client_ca``): ``client_cert = "required"`` refuses a client without a
certificate signed by that CA at the handshake; ``"optional"`` asks for one and lets the
client authenticate otherwise.  A verified certificate's identity (its RFC 4514 subject,
or its common name with ``auth.tls_identity = "cn"``) is put in the environ under
:data:`~wsnmom.soap_frontend.auth.TLS_IDENTITY_KEY`, which the authenticator reads.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import Iterator, Mapping
from typing import Any, cast

from wsnmom.connections import ConnectionGuard, Tracked
from wsnmom.core.config import ConfigError, Settings
from wsnmom.soap_frontend.auth import TLS_IDENTITY_KEY
from wsnmom.tls_ingress import GuardedTlsConnection, Ingress

__all__ = ["create_tls_server", "rfc4514", "tls_context"]

log = logging.getLogger("wsnmom.server")

#: a certificate subject as ``SSLSocket.getpeercert()`` gives it: RDNs of (type, value)
Subject = tuple[tuple[tuple[str, str], ...], ...]

#: RFC 4514 short names of the attribute types ``SSLSocket.getpeercert()`` reports
_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "1.2.840.113549.1.9.1",
}


def _escape(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def rfc4514(subject: Subject) -> str:
    """The RFC 4514 string of a ``getpeercert()`` subject (most specific RDN first)."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def common_name(subject: Subject) -> str | None:
    """The (last) common name of a ``getpeercert()`` subject."""
    names = [v for rdn in subject for k, v in rdn if k == "commonName"]
    return names[-1] if names else None


def tls_context(settings: Settings) -> ssl.SSLContext:
    """The server context for ``settings.tls``.  :raises ConfigError: unusable files."""
    tls = settings.tls
    if not tls.certfile:
        raise ConfigError("tls.certfile is not set")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tls.certfile / tls.keyfile: cannot load {tls.certfile}"
            f"{' / ' + tls.keyfile if tls.keyfile else ''}: {exc}"
        ) from exc
    if tls.client_ca:
        try:
            context.load_verify_locations(cafile=tls.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls.client_ca: cannot load {tls.client_ca}: {exc}") from exc
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.client_cert == "required" else ssl.CERT_OPTIONAL
        )
    return context


class _TlsEnviron(Mapping[str, str]):
    """The environ entries of one TLS connection, computed on first use (after the
    handshake, which happened while the request was read)."""

    def __init__(self, sock: ssl.SSLSocket, identity: str) -> None:
        self._sock = sock
        self._identity = identity
        self._values: dict[str, str] | None = None

    def _computed(self) -> dict[str, str]:
        if self._values is None:
            values = {"HTTPS": "on", "SSL_PROTOCOL": self._sock.version() or ""}
            cert = self._sock.getpeercert()
            subject = cast(Subject | None, cert.get("subject") if cert else None)
            if subject:
                name = common_name(subject) if self._identity == "cn" else rfc4514(subject)
                if name:
                    values[TLS_IDENTITY_KEY] = name
            self._values = values
        return self._values

    def __getitem__(self, key: str) -> str:
        return self._computed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())


def _adapter_class() -> type[Any]:
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    class IngressAdapter(BuiltinSSLAdapter):
        """cheroot's standard-library TLS adapter that only wraps a new connection (no
        handshake on the accepting thread) in a :class:`GuardedTlsConnection` taking over
        the admitted plain socket's place in the guard."""

        def __init__(
            self,
            context: ssl.SSLContext,
            identity: str,
            certfile: str,
            keyfile: str,
            guard: ConnectionGuard,
        ) -> None:
            super().__init__(certificate=certfile, private_key=keyfile)
            context.sslsocket_class = GuardedTlsConnection
            self.context = context  # the gateway's, with its client verification
            self.identity = identity
            self.guard = guard

        def wrap(self, sock: socket.socket) -> tuple[ssl.SSLSocket, Mapping[str, str]]:
            try:
                tls = self.context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            except BaseException:
                sock.close()
                raise
            if isinstance(sock, Tracked) and isinstance(tls, Tracked):
                self.guard.adopt(sock, tls)
            return tls, _TlsEnviron(tls, self.identity)

    return IngressAdapter


def create_tls_server(
    app: Any, sockets: list[socket.socket], settings: Settings, guard: ConnectionGuard
) -> Any:
    """A cheroot WSGI server speaking TLS on the first of ``sockets`` (bound already; the
    others are closed: HTTPS listens on one address), its connections admitted and cut
    by ``guard``.  ``start()`` serves until ``stop()``."""
    from cheroot import wsgi

    from wsnmom.tls_parking import ParkingConnection, ParkingGateway, let_go

    context = tls_context(settings)
    first, extra = sockets[0], sockets[1:]
    for sock in extra:
        log.warning("HTTPS listens on %s only, not on %s", first.getsockname(), sock.getsockname())
        sock.close()
    address = first.getsockname()[:2]
    listening = guard.wrap(first, tls=True)
    c = settings.connections
    #: a worker's socket timeout (the ingress reads requests; this bounds answering)
    timeout = math.ceil(max(c.idle_timeout, c.header_timeout, c.body_timeout)) or 120

    class Server(wsgi.Server):
        """Serves on the socket the gateway bound at start (no second bind); connections
        go through the ingress before each request (``wsnmom.tls_ingress``); a long poll
        waits without its worker (``wsnmom.tls_parking``)."""

        ConnectionClass = ParkingConnection
        ingress: Ingress

        def bind(self, family: int, type: int, proto: int = 0) -> None:
            self.socket = listening

        def prepare(self) -> None:
            super().prepare()
            # accept() refuses connections over the limits in a loop: it must never wait
            self.socket.setblocking(False)
            self.ingress = Ingress(
                super().process_conn,
                lambda conn: conn.close(),
                limit=settings.max_request_bytes + 64 * 1024,
                timeout=timeout,
            )
            self.ingress.start()

        def process_conn(self, conn: Any) -> None:
            self.ingress.accept(conn)  # a new connection: its handshake and first request

        def put_conn(self, conn: Any) -> None:
            if let_go(conn):
                return  # parked: back to a worker when its long poll answers
            if self.ready:
                self.ingress.add(conn)  # kept alive: its next request
            else:
                conn.close()

        def stop(self) -> None:
            ingress = getattr(self, "ingress", None)
            super().stop()
            if ingress is not None:
                ingress.stop()

        def error_log(self, msg: str = "", level: int = 20, traceback: bool = False) -> None:
            # failed handshakes (no or a wrong client certificate, plain HTTP) land here
            log.log(logging.DEBUG if level < logging.ERROR else logging.INFO, "https: %s", msg)

    server = Server(
        address,
        app,
        numthreads=settings.threads,
        server_name="wsnmom",
        timeout=timeout,
        shutdown_timeout=5,
    )
    server.max_request_body_size = settings.max_request_bytes
    server.gateway = ParkingGateway
    certfile = str(settings.tls.certfile)
    server.ssl_adapter = _adapter_class()(
        context, settings.auth.tls_identity, certfile, settings.tls.keyfile or certfile, guard
    )
    return server
