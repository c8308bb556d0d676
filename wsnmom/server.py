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
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsnmom.core.adapter import Adapter, AdapterUnavailable
from wsnmom.core.config import ConfigError, Settings
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.service import BrokerService
from wsnmom.core.store import Store, open_store
from wsnmom.data_lock import StoreLock, lock_store
from wsnmom.topic_mapping.namespaces import TopicSet, load_topic_namespace

log = logging.getLogger("wsnmom.server")


class MiddlewareConnector:
    """Opens the adapter of a gateway started before its middleware.

    A daemon thread calls ``Adapter.open()`` with backoff (0.5 s doubling to 10 s) until it
    succeeds, then restores the broker and runs the start-up hooks
    (``Runtime.connected``).  Meanwhile the HTTP server runs: ``/healthz`` answers,
    ``/readyz`` says 503 and WS-N operations are refused with HTTP 503.  With ``wait`` > 0
    (``middleware.wait``, ``--wait-for-middleware``) the gateway gives up after that many
    seconds: the connector records the start-up error's exit status (9, unreachable) and
    stops the process (SIGTERM to itself).  A refusal no retry can fix (credentials,
    access) stops it at once.
    """

    def __init__(self, runtime: Runtime, wait: float) -> None:
        self._runtime = runtime
        self._wait = wait
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="wsnmom-middleware-connector", daemon=True
        )

    def start(self) -> None:
        """Start trying."""
        self._thread.start()

    def stop(self) -> None:
        """Stop trying (the gateway is closing)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=15)

    def _run(self) -> None:
        from wsnmom.startup import explain

        runtime = self._runtime
        started = time.monotonic()
        delay = 0.5
        while not self._stop.is_set():
            try:
                runtime.adapter.open()
            except AdapterUnavailable as exc:
                log.debug("middleware still unreachable: %s", exc)
                if self._wait > 0 and time.monotonic() - started >= self._wait:
                    error = explain(exc)
                    self._give_up(
                        int(error.status),
                        f"{error.message} (waited {self._wait:g} s: middleware.wait / "
                        "--wait-for-middleware)",
                    )
                    return
                remaining = self._wait - (time.monotonic() - started) if self._wait > 0 else delay
                self._stop.wait(max(0.05, min(delay, remaining)))
                delay = min(delay * 2, 10.0)
                continue
            except Exception as exc:
                error = explain(exc)
                self._give_up(int(error.status), error.message)
                return
            break
        if self._stop.is_set():
            return
        log.info("the middleware answers: restoring the broker")
        try:
            runtime.connected()
        except Exception as exc:
            log.exception("restoring the broker failed")
            self._give_up(1, f"restoring the broker failed: {exc}")
            return
        log.info("the broker serves requests")

    def _give_up(self, status: int, message: str) -> None:
        log.error("%s; stopping", message)
        self._runtime.exit_message = message
        self._runtime.exit_status = status
        os.kill(os.getpid(), signal.SIGTERM)


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
    #: opens the middleware in the background when it was unreachable at start
    connector: MiddlewareConnector | None = field(default=None, repr=False)
    #: set when the gateway must stop with this exit status (the middleware never came),
    #: with the one-line reason
    exit_status: int | None = field(default=None, repr=False)
    exit_message: str = field(default="", repr=False)
    _closed: bool = field(default=False, repr=False)

    def connected(self) -> None:
        """The adapter is open: tell plugins, restore the broker, run the start-up hooks."""
        self.plugins.adapter_opened(self.adapter)
        self.service.start()
        self._report_unowned()
        self.plugins.startup(self)

    def _report_unowned(self) -> None:
        """With authentication on, say how many restored resources belong to nobody
        (created anonymously, or before owners were recorded): only admins manage them."""
        auth = getattr(self.app, "extensions", {}).get("wsnmom.auth")
        if auth is None or not auth.required:
            return
        registry = self.service.registry
        counts = {
            "subscriptions": registry.subscriptions.owned_by(None),
            "pull points": registry.pull_points.owned_by(None),
            "registrations": registry.registrations.owned_by(None),
        }
        if any(counts.values()):
            log.warning(
                "%s have no owner (created anonymously or before owners were recorded): "
                "with authentication required only admins can manage them",
                ", ".join(f"{n} {kind}" for kind, n in counts.items() if n),
            )

    def close(self) -> None:
        """Stop the broker, then the adapter and the store; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.connector is not None:
            self.connector.stop()
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


def default_outbound(settings: Settings, policy: OutboundPolicy | None = None) -> OutboundSoap:
    """The SOAP frontend's outbound client, checking addresses with ``policy`` (the
    broker's; one built from ``settings.outbound`` when None)."""
    from wsnmom.soap_frontend.client import SoapClient

    client: OutboundSoap = SoapClient(settings, policy=policy)
    return client


def make_adapter(settings: Settings) -> Adapter:
    """The adapter ``settings`` name, constructed but not opened (nothing is connected).

    :raises UnknownAdapterScheme: no plugin serves the URL's scheme.
    :raises ConfigError: the URL or the adapter options cannot be used.
    """
    from wsnmom.core.plugins import get_plugin_manager

    try:
        adapter_class = get_plugin_manager().resolve(settings.adapter_url)
        options = dict(settings.adapter_options)
        if adapter_class.uses_data_dir and settings.data_dir:
            options.setdefault("data_dir", settings.data_dir)
        return adapter_class(settings.adapter_url, options)
    except (ValueError, TypeError) as exc:  # the URL or the options cannot be used
        raise ConfigError(f"adapter_url / adapter_options: {exc}") from exc


def build_runtime(
    settings: Settings,
    *,
    outbound: OutboundSoap | None = None,
    wait: bool = False,
    outbound_policy: OutboundPolicy | None = None,
    adapter: Adapter | None = None,
) -> Runtime:
    """Assemble (and start) a gateway for ``settings``.

    With ``wait`` an unreachable middleware (``AdapterUnavailable``) does not fail the
    start: the runtime is returned with its broker not started yet, and a
    :class:`MiddlewareConnector` opens the adapter in the background, restores the broker
    and runs the start-up hooks once the middleware answers (see its docstring).  Without
    ``wait`` the ``AdapterUnavailable`` is raised.

    ``outbound_policy`` is the one outbound-address policy the broker and the outbound
    client share (default: from ``settings.outbound``, resolving names with the system
    resolver).  ``adapter`` is one from :func:`make_adapter` (not opened yet), when the
    caller checked the adapter URL earlier; by default it is made here.
    """
    from wsnmom.core.plugins import get_plugin_manager
    from wsnmom.soap_frontend.app import create_app

    plugins = get_plugin_manager()
    topic_set = load_topic_set(settings)
    if adapter is None:
        adapter = make_adapter(settings)
    store_lock = lock_store(settings.store_url)
    opened = False
    try:
        adapter.open()
        opened = True
    except AdapterUnavailable as exc:
        if not wait:
            store_lock.release()
            raise
        log.warning("%s; serving HTTP meanwhile, WS-N requests get HTTP 503 until then", exc)
    except BaseException:
        store_lock.release()
        raise
    try:
        store = open_store(settings.store_url)
    except BaseException:
        adapter.close()
        store_lock.release()
        raise
    policy = outbound_policy or OutboundPolicy(settings.outbound)
    try:
        service = BrokerService(
            settings,
            adapter,
            store,
            outbound or default_outbound(settings, policy),
            topic_set=topic_set,
            plugins=plugins,
            autostart=False,
            outbound_policy=policy,
        )
    except BaseException:
        adapter.close()
        store.close()
        store_lock.release()
        raise
    try:
        app = create_app(service, settings)
    except BaseException:
        service.close()
        adapter.close()
        store.close()
        store_lock.release()
        raise
    plugins.configure_app(app, service)
    runtime = Runtime(settings, plugins, adapter, store, topic_set, service, app, store_lock)
    if opened:
        try:
            runtime.connected()
        except BaseException:
            runtime.close()
            raise
    else:
        runtime.connector = MiddlewareConnector(runtime, settings.middleware.wait)
        runtime.connector.start()
    return runtime
