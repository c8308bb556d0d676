"""The ``wsnmom serve`` command: its options, parsed by click.

What it does with them (settings -> logging -> listening sockets -> runtime -> waitress)
is :mod:`wsnmom.serving`, imported when the command runs: ``wsnmom --help`` and the
other commands do not import the gateway's configuration model, its middleware and HTTP
stack.
"""

from __future__ import annotations

import click

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
    "tls__certfile": "--certfile",
    "tls__keyfile": "--keyfile",
    "tls__client_ca": "--client-ca",
}


@click.command("serve")
@click.option("--adapter", "adapter_url", help="Adapter URL (embedded://PATH, amqp://...).")
@click.option(
    "--store",
    "store_url",
    help="Store URL (sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB).",
)
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
@click.option(
    "--certfile",
    type=click.Path(dir_okay=False),
    help="PEM certificate (chain): serve HTTPS (tls.certfile).",
)
@click.option("--keyfile", type=click.Path(dir_okay=False), help="PEM key of --certfile.")
@click.option(
    "--client-ca",
    type=click.Path(dir_okay=False),
    help="PEM CA certificates of client certificates: mutual TLS (tls.client_ca).",
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
    certfile: str | None,
    keyfile: str | None,
    client_ca: str | None,
    debug: bool,
) -> None:
    """Run the WS-Notification broker (embedded middleware on http://127.0.0.1:8080 by
    default).  Exit statuses: docs/operations.md."""
    overrides = {
        "adapter_url": adapter_url,
        "store_url": store_url,
        "data_dir": data_dir,
        "host": host,
        "port": port,
        "public_url": public_url,
        "threads": threads,
        "middleware__wait": wait_for_middleware,
        "tls__certfile": certfile,
        "tls__keyfile": keyfile,
        "tls__client_ca": client_ca,
    }
    from wsnmom.serving import serve_settings

    serve_settings(config_file, overrides, OPTIONS, debug)
