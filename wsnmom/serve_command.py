"""The ``wsnmom serve`` command: settings -> logging -> listening sockets -> runtime ->
waitress, until SIGTERM/SIGINT.

Start-up failures are one line on stderr naming the cause and what to do, and exit with
the status of their kind (:mod:`wsnmom.startup`); ``--debug`` prints the traceback too.
The sockets are bound before the middleware is opened, so a busy port costs nothing.

Shutdown is graceful: the HTTP server stops accepting, delivery threads stop, unsettled
notifications stay in the middleware's durable subscriptions and are delivered after the
next start.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import traceback
from types import FrameType
from typing import NoReturn

import click

from wsnmom.connections import ConnectionGuard, ConnectionPolicy
from wsnmom.core.config import Settings, load_settings
from wsnmom.core.redaction import redact_text, redact_url
from wsnmom.logs import configure_logging
from wsnmom.startup import StartupError, explain, open_listeners

log = logging.getLogger("wsnmom.server")
config_log = logging.getLogger("wsnmom.config")

#: the command-line option of each setting it overrides (for messages)
OPTIONS = {
    "adapter_url": "--adapter",
    "store_url": "--store",
    "data_dir": "--data-dir",
    "host": "--host",
    "port": "--port",
    "public_url": "--public-url",
    "threads": "--threads",
    "middleware__wait": "--wait-for-middleware",
}

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


@click.command("serve")
@click.option("--adapter", "adapter_url", help="Adapter URL (embedded://PATH, amqp://...).")
@click.option("--store", "store_url", help="Store URL (sqlite:///PATH).")
@click.option(
    "--data-dir",
    help="Directory of the store and the embedded middleware "
    "(default $XDG_DATA_HOME/wsnmom or ~/.local/share/wsnmom).",
)
@click.option("--host", help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port, 1-65535 (default 8080).")
@click.option("--public-url", help="Base URL clients reach the gateway at.")
@click.option("--threads", type=int, help="HTTP worker threads.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML configuration file (also $WSNMOM_CONFIG).",
)
@click.option(
    "--wait-for-middleware",
    "wait_for_middleware",
    type=float,
    help="Seconds to wait for an unreachable middleware at start-up before exiting with "
    "status 9 (default 0: wait forever, serving /healthz and answering WS-N requests with "
    "HTTP 503 meanwhile).",
)
@click.option("--debug", is_flag=True, help="Show the traceback of a start-up error.")
def serve(
    adapter_url: str | None,
    store_url: str | None,
    data_dir: str | None,
    host: str | None,
    port: int | None,
    public_url: str | None,
    threads: int | None,
    config_file: str | None,
    wait_for_middleware: float | None,
    debug: bool,
) -> None:
    """Run the WS-Notification broker (embedded middleware on http://127.0.0.1:8080 by
    default).  Exit statuses: docs/operations.md."""
    warnings: list[str] = []
    overrides = {
        "adapter_url": adapter_url,
        "store_url": store_url,
        "data_dir": data_dir,
        "host": host,
        "port": port,
        "public_url": public_url,
        "threads": threads,
        "middleware__wait": wait_for_middleware,
    }
    try:
        settings = load_settings(
            config_file, overrides=overrides, options=OPTIONS, warn=warnings.append
        )
    except Exception as exc:
        for warning in warnings:
            click.echo(f"wsnmom serve: warning: {redact_text(warning)}", err=True)
        _fail(explain(exc), exc, debug)
    configure_logging(settings.log_level, settings.log_format, settings.log_levels)
    for warning in warnings:
        config_log.warning("%s", warning)
    _advise(settings)
    _run(settings, debug)


def _run(settings: Settings, debug: bool) -> None:
    import waitress

    from wsnmom.server import build_runtime

    sockets: list[socket.socket] = []
    try:
        sockets = open_listeners(settings.host, settings.port)
        runtime = build_runtime(settings, wait=True)
    except Exception as exc:
        for sock in sockets:
            sock.close()
        _fail(explain(exc), exc, debug)
    guard = ConnectionGuard(ConnectionPolicy.from_settings(settings))
    c = settings.connections
    try:
        server = waitress.create_server(
            runtime.app,
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
    except BaseException:
        runtime.close()
        raise
    guard.start()
    previous = {s: signal.signal(s, _raise_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    broker, adapter = f"{settings.base_url}/wsn/broker", redact_url(settings.adapter_url)
    store = redact_url(settings.store_url)
    log.info(
        "wsnmom broker at %s (adapter %s, store %s)",
        broker,
        adapter,
        store,
        extra={"broker_url": broker, "adapter_url": adapter, "store_url": store},
    )
    try:
        server.run()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        log.info("shutting down")
        try:
            server.close()
        except Exception:
            log.debug("closing the HTTP server failed", exc_info=True)
        guard.stop()
        runtime.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if runtime.exit_status:
        click.echo(f"wsnmom serve: {redact_text(runtime.exit_message)}", err=True)
        sys.exit(runtime.exit_status)
