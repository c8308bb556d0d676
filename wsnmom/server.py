"""Assembly of a running gateway.

``build_runtime(settings)`` wires: plugin manager (``wsnmom.core.plugins``) -> adapter for
``settings.adapter_url`` -> the store's lock (:mod:`wsnmom.data_lock`: one gateway per
store) -> adapter opened -> store for ``settings.store_url`` -> topic set (topic
namespace documents, fixed or ad hoc) -> ``BrokerService`` (outbound SOAP client
``wsnmom.soap_frontend.client.SoapClient``) -> Flask app
(``wsnmom.soap_frontend.app.create_app``).  ``Runtime.close()`` tears it down in reverse.

The ``wsnmom serve`` command is :mod:`wsnmom.serve_command`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsnmom.core.adapter import Adapter
from wsnmom.core.config import ConfigError, Settings
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.service import BrokerService
from wsnmom.core.store import Store, open_store
from wsnmom.data_lock import StoreLock, lock_store
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
    store_lock: StoreLock = field(default_factory=lambda: StoreLock(None, None), repr=False)
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
            try:
                self.store.close()
            finally:
                self.store_lock.release()


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
    try:
        adapter = plugins.create_adapter(settings.adapter_url, settings.adapter_options)
    except (ValueError, TypeError) as exc:  # the URL or the options cannot be used
        raise ConfigError(f"adapter_url / adapter_options: {exc}") from exc
    store_lock = lock_store(settings.store_url)
    try:
        adapter.open()
        plugins.adapter_opened(adapter)
    except BaseException:
        store_lock.release()
        raise
    try:
        store = open_store(settings.store_url)
    except BaseException:
        adapter.close()
        store_lock.release()
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
    except BaseException:
        adapter.close()
        store.close()
        store_lock.release()
        raise
    app = create_app(service, settings)
    plugins.configure_app(app, service)
    runtime = Runtime(settings, plugins, adapter, store, topic_set, service, app, store_lock)
    try:
        plugins.startup(runtime)
    except Exception:
        runtime.close()
        raise
    return runtime
