"""Assembly of a running gateway and the ``wsnmom serve`` command.

``build_runtime(settings)`` wires: plugin manager (``wsnmom.core.plugins``) -> adapter for
``settings.adapter_url`` (opened) -> store for ``settings.store_url`` -> topic set (topic
namespace documents, fixed or ad hoc) -> ``BrokerService`` (outbound SOAP client
``wsnmom.soap_frontend.client.SoapClient``) -> Flask app
(``wsnmom.soap_frontend.app.create_app``).  ``Runtime.close()`` tears it down in reverse.

``wsnmom serve`` runs the app under waitress and shuts down gracefully on SIGTERM/SIGINT:
the HTTP server stops accepting, delivery threads stop, unsettled notifications stay in the
middleware's durable subscriptions and are delivered after the next start.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click

from wsnmom.core.adapter import Adapter
from wsnmom.core.config import ConfigError, Settings, load_settings
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.service import BrokerService
from wsnmom.core.store import Store, open_store
from wsnmom.topic_mapping.namespaces import TopicSet, load_topic_namespace

log = logging.getLogger("wsnmom.server")


@dataclass
class Runtime:
    """Everything a running gateway consists of."""

    settings: Settings
    plugins: Any
    adapter: Adapter
    store: Store
    topic_set: TopicSet
    service: BrokerService
    app: Any
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Stop the broker, then the adapter and the store; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.plugins.shutdown(self)
        except Exception:
            log.exception("plugin shutdown hook failed")
        self.service.close()
        try:
            self.adapter.close()
        finally:
            self.store.close()


def load_topic_set(settings: Settings) -> TopicSet:
    """The broker's topic set from the configured TopicNamespace documents."""
    namespaces = []
    for path in settings.topic_namespaces:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read topic namespace document {path}: {exc}") from exc
        namespaces.append(load_topic_namespace(data))
    return TopicSet(namespaces, fixed=settings.fixed_topic_set)


def default_outbound(settings: Settings) -> OutboundSoap:
    """The SOAP frontend's outbound client, with the configured destination policy."""
    from wsnmom.soap_frontend.client import SoapClient

    client: OutboundSoap = SoapClient(settings)
    return client


def build_runtime(settings: Settings, *, outbound: OutboundSoap | None = None) -> Runtime:
    """Assemble (and start) a gateway for ``settings``."""
    from wsnmom.core.plugins import get_plugin_manager
    from wsnmom.soap_frontend.app import create_app

    plugins = get_plugin_manager()
    topic_set = load_topic_set(settings)
    adapter = plugins.create_adapter(settings.adapter_url, settings.adapter_options)
    adapter.open()
    plugins.adapter_opened(adapter)
    try:
        store = open_store(settings.store_url)
    except Exception:
        adapter.close()
        raise
    try:
        service = BrokerService(
            settings,
            adapter,
            store,
            outbound or default_outbound(settings),
            topic_set=topic_set,
            plugins=plugins,
        )
    except Exception:
        adapter.close()
        store.close()
        raise
    app = create_app(service, settings)
    plugins.configure_app(app, service)
    runtime = Runtime(settings, plugins, adapter, store, topic_set, service, app)
    try:
        plugins.startup(runtime)
    except Exception:
        runtime.close()
        raise
    return runtime


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


@click.command("serve")
@click.option("--adapter", "adapter_url", help="Adapter URL (embedded://PATH, amqp://...).")
@click.option("--store", "store_url", help="Store URL (sqlite:///PATH).")
@click.option("--host", help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, help="Listen port (default 8080).")
@click.option("--public-url", help="Base URL clients reach the gateway at.")
@click.option("--threads", type=int, help="HTTP worker threads.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML configuration file (also $WSNMOM_CONFIG).",
)
def serve(
    adapter_url: str | None,
    store_url: str | None,
    host: str | None,
    port: int | None,
    public_url: str | None,
    threads: int | None,
    config_file: str | None,
) -> None:
    """Run the WS-Notification broker (embedded middleware on http://127.0.0.1:8080 by
    default)."""
    try:
        settings = load_settings(
            config_file,
            overrides={
                "adapter_url": adapter_url,
                "store_url": store_url,
                "host": host,
                "port": port,
                "public_url": public_url,
                "threads": threads,
            },
        )
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import waitress

    runtime = build_runtime(settings)
    server = waitress.create_server(
        runtime.app,
        host=settings.host,
        port=settings.port,
        threads=settings.threads,
        max_request_body_size=settings.max_request_bytes,
        ident="wsnmom",
    )
    previous = {s: signal.signal(s, _raise_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    click.echo(
        f"wsnmom broker at {settings.base_url}/wsn/broker "
        f"(adapter {settings.adapter_url}, store {settings.store_url})",
        err=True,
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
        runtime.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
