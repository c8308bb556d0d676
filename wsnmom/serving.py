"""What ``wsnmom serve`` does once click has parsed its options
(:mod:`wsnmom.serve_command`): settings -> logging -> listening sockets -> runtime ->
waitress, until SIGTERM/SIGINT.

Start-up failures are one line on stderr naming the cause and what to do, and exit with
the status of their kind (:mod:`wsnmom.startup`); ``--debug`` prints the traceback too.
The adapter URL and options are checked first (nothing is connected), so a bad URL is
reported whatever holds the port; then the sockets are bound before the middleware is
opened, so a busy port costs nothing.

Shutdown is graceful: the HTTP server stops accepting, delivery threads stop, unsettled
notifications stay in the middleware's durable subscriptions and are delivered after the
next start.  A shutdown still under way after 1.5 s logs every thread's stack
(:mod:`wsnmom.slow_stop`).
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import traceback
from collections.abc import Mapping
from types import FrameType
from typing import Any, NoReturn

import click

from wsnmom import gc_tuning
from wsnmom.connections import ConnectionGuard, ConnectionPolicy
from wsnmom.core.config import ConfigError, Settings, load_settings
from wsnmom.core.redaction import redact_text, redact_url
from wsnmom.logs import configure_logging
from wsnmom.reserve import credential_vouch
from wsnmom.slow_stop import SlowStopWatch
from wsnmom.startup import StartupError, explain, open_listeners

log = logging.getLogger("wsnmom.server")
config_log = logging.getLogger("wsnmom.config")

_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _fail(error: StartupError, exc: BaseException | None, debug: bool) -> NoReturn:
    if debug and exc is not None:
        traceback.print_exception(exc)
    click.echo(f"wsnmom serve: {redact_text(error.message)}", err=True)
    sys.exit(int(error.status))


def _advise(settings: Settings) -> None:
    """Warn about settings that start but serve clients badly."""
    if settings.public_url is not None:
        return
    if settings.host.strip() in _WILDCARDS:
        log.warning(
            "listening on all addresses (%s) without public_url: endpoint references will "
            "say %s, which clients cannot use; set public_url (--public-url)",
            settings.host,
            settings.base_url,
        )
    elif settings.trusted_proxies:
        log.warning(
            "trusted_proxies without public_url: the WSDL follows the proxy's forwarded "
            "scheme and host but endpoint references say %s; set public_url",
            settings.base_url,
        )


def _advise_outbound(settings: Settings) -> None:
    """Warn when a gateway that clients beyond this machine reach may call loopback or
    private addresses: any of them can then make it call services that trust it for being
    local or internal (docs/security.md, the strict profile)."""
    out = settings.outbound
    open_to = [
        name
        for name, on in (("loopback", out.allow_loopback), ("private", out.allow_private))
        if on
    ]
    if not open_to or authenticator_loopback(settings.host):
        return
    log.warning(
        "the gateway listens on %s, beyond loopback, and calls consumers on %s addresses: "
        "a client can make it reach services on this machine or the internal network; "
        "set %s to false (the strict profile, docs/security.md) or restrict outbound.allow",
        settings.host,
        " and ".join(open_to),
        " and ".join(f"outbound.allow_{name}" for name in open_to),
    )


def _check_auth(settings: Settings) -> None:
    """Refuse settings that cannot authenticate (``ConfigError``); warn when the gateway
    serves anonymous clients beyond loopback."""
    from wsnmom.soap_frontend.auth import Authenticator

    authenticator = Authenticator(settings)
    if settings.tls.certfile:
        from wsnmom.https import tls_context

        tls_context(settings)  # unusable certificate or key files stop the start here
    elif settings.tls.client_ca:
        raise ConfigError("tls.client_ca needs tls.certfile: mutual TLS is served over HTTPS")
    if authenticator.enabled:
        sources = [
            name
            for name, on in (
                ("admin token", bool(settings.auth.admin_token)),
                (f"credentials file {settings.auth.users_file}", bool(settings.auth.users_file)),
                ("TLS client certificates", bool(settings.tls.client_ca)),
                (f"proxy header {settings.auth.proxy_header}", bool(settings.auth.proxy_header)),
                ("WS-Security UsernameToken", settings.auth.wsse),
            )
            if on
        ]
        log.info(
            "authentication %s: %d identities; %s",
            "required" if authenticator.required else "optional (anonymous clients served)",
            len(authenticator.credentials.identities),
            ", ".join(sources),
        )
    if not authenticator.required and not authenticator_loopback(settings.host):
        log.warning(
            "authentication is off (auth.required = false) and the gateway listens on %s: "
            "anyone who reaches it can create, read and end subscriptions, pull points and "
            "registrations; set auth.admin_token (WSNMOM_AUTH__ADMIN_TOKEN) to require it",
            settings.host,
        )


def authenticator_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback listen address."""
    from wsnmom.soap_frontend.auth import listens_on_loopback_only

    return listens_on_loopback_only(host)


def serve_settings(
    config_file: str | None, overrides: Mapping[str, Any], options: Mapping[str, str], debug: bool
) -> None:
    """Load the settings (``overrides`` from the command line, named in messages by
    ``options``), configure logging and run the gateway until SIGTERM/SIGINT."""
    warnings: list[str] = []
    try:
        settings = load_settings(
            config_file, overrides=overrides, options=options, warn=warnings.append
        )
    except Exception as exc:
        for warning in warnings:
            click.echo(f"wsnmom serve: warning: {redact_text(warning)}", err=True)
        _fail(explain(exc), exc, debug)
    configure_logging(settings.log_level, settings.log_format, settings.log_levels)
    for warning in warnings:
        config_log.warning("%s", warning)
    _advise(settings)
    _advise_outbound(settings)
    _run(settings, debug)


class _TlsServer:
    """cheroot's TLS server (:mod:`wsnmom.https`) behind waitress' ``run``/``close``."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def run(self) -> None:
        self.server.prepare()
        self.server.serve()

    def close(self) -> None:
        self.server.stop()


def _http_server(
    app: Any, sockets: list[socket.socket], settings: Settings, guard: ConnectionGuard
) -> Any:
    """waitress on ``sockets``, or with ``tls.certfile`` the HTTPS server; both behind
    ``guard`` (``[connections]``: limits and read deadlines)."""
    if settings.tls.certfile:
        from wsnmom.https import create_tls_server

        return _TlsServer(create_tls_server(app, sockets, settings, guard))
    import waitress

    from wsnmom import parking

    c = settings.connections
    server = waitress.create_server(
        app,
        sockets=[guard.wrap(s) for s in sockets],
        threads=settings.threads,
        max_request_body_size=settings.max_request_bytes,
        ident="wsnmom",
        # the guard refuses connections beyond connections.limit before waitress
        # would stop accepting; poll() has no FD_SETSIZE ceiling
        connection_limit=(c.limit or 100_000) + 16,
        asyncore_use_poll=True,
        channel_timeout=max(c.idle_timeout, c.header_timeout, c.body_timeout) or 120,
    )
    parking.install(server)  # long polls wait without a worker thread
    return server


def _log_serving(settings: Settings) -> None:
    broker, adapter = f"{settings.base_url}/wsn/broker", redact_url(settings.adapter_url)
    store = redact_url(settings.store_url)
    log.info(
        "wsnmom broker at %s (adapter %s, store %s)",
        broker,
        adapter,
        store,
        extra={"broker_url": broker, "adapter_url": adapter, "store_url": store},
    )


def _run(settings: Settings, debug: bool) -> None:
    from wsnmom.server import build_runtime, make_adapter

    sockets: list[socket.socket] = []
    try:
        unopened = make_adapter(settings)  # a bad adapter URL is reported whatever the port
        sockets = open_listeners(settings.host, settings.port)
        _check_auth(settings)  # after the listen address: a wrong host is reported as such
        runtime = build_runtime(settings, wait=True, adapter=unopened)
    except Exception as exc:
        for sock in sockets:
            sock.close()
        _fail(explain(exc), exc, debug)
    guard = ConnectionGuard(
        ConnectionPolicy.from_settings(settings), vouch=credential_vouch(runtime.app)
    )
    try:
        server = _http_server(runtime.app, sockets, settings, guard)
    except BaseException:
        runtime.close()
        raise
    gc_tuning.tune()  # the start-up heap is built: full collections no longer walk it
    guard.start()
    previous: dict[int, Any] = {}
    # from the first handler on, inside the ``try``: a stop asked for before the server
    # runs (the connector giving up right after ``serving``) still closes and says why;
    # before, one that came during the log line below ended the process silently, status 0
    try:
        for stop in (signal.SIGTERM, signal.SIGINT):
            previous[stop] = signal.signal(stop, _raise_exit)
        runtime.serving.set()
        _log_serving(settings)
        server.run()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        log.info("shutting down")
        # a stop slower than the 2 s hand-over logs every thread's stack (wsnmom.slow_stop)
        with SlowStopWatch("shutting down"):
            try:
                server.close()
            except Exception:
                log.debug("closing the HTTP server failed", exc_info=True)
            guard.stop()
            runtime.close()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if runtime.exit_status:
        click.echo(f"wsnmom serve: {redact_text(runtime.exit_message)}", err=True)
        sys.exit(runtime.exit_status)
