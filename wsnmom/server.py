"""Assembly of a running gateway.

``build_runtime(settings)`` wires: plugin manager (``wsnmom.core.plugins``) -> adapter for
``settings.adapter_url`` -> the store's lock (:mod:`wsnmom.data_lock`: one gateway per
store) -> adapter opened -> store for ``settings.store_url`` -> topic set (topic
namespace documents, fixed or ad hoc) -> ``BrokerService`` (outbound SOAP client
``wsnmom.soap_frontend.client.SoapClient``) -> Flask app
(``wsnmom.soap_frontend.app.create_app``).  ``Runtime.close()`` tears it down in reverse.

The ``wsnmom serve`` command is :mod:`wsnmom.serve_command` (options) and
:mod:`wsnmom.serving` (what it runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from wsnmom.core.adapter import Adapter, AdapterUnavailable
from wsnmom.core.config import ConfigError, Settings
from wsnmom.core.coordination import instance_id
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.redaction import redact_url
from wsnmom.core.service import BrokerService
from wsnmom.core.store import Store
from wsnmom.core.store_binding import bind_store
from wsnmom.core.store_migration import refuse_unfinished
from wsnmom.core.store_url import open_store, shared_store
from wsnmom.data_lock import StoreLock, lock_store
from wsnmom.topic_mapping.namespaces import load_topic_namespace
from wsnmom.topic_mapping.topic_set import TopicSet
from wsnmom.upstreams import UpstreamRelay

log = logging.getLogger("wsnmom.server")


class _OpenAttempt:
    """One ``Adapter.open()`` on its own thread, so that whoever waits for it can stop
    waiting at a deadline while the attempt is still under way (RabbitMQ's and Kafka's
    attempts each take up to their ``operation_timeout``/``connect_timeout``)."""

    def __init__(self, adapter: Adapter) -> None:
        self._adapter = adapter
        self.done = threading.Event()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="wsnmom-middleware-open", daemon=True).start()

    def _run(self) -> None:
        try:
            self._adapter.open()
        except BaseException as exc:  # handed to the waiting thread
            self.error = exc
        finally:
            self.done.set()


class MiddlewareConnector:
    """Opens the adapter of a gateway started before its middleware.

    A daemon thread calls ``Adapter.open()`` with backoff (0.5 s doubling to 10 s) until it
    succeeds, then restores the broker and runs the start-up hooks
    (``Runtime.connected``).  Meanwhile the HTTP server runs: ``/healthz`` answers,
    ``/readyz`` says 503 and WS-N operations are refused with HTTP 503.  With ``wait`` > 0
    (``middleware.wait``, ``--wait-for-middleware``) the gateway gives up ``wait`` seconds
    after ``started``, also while an attempt is still under way: the connector records the
    start-up error's exit status (9, unreachable) and stops the process (SIGTERM to
    itself, once ``Runtime.serving`` says the signal handlers are in place).  A refusal no
    retry can fix (credentials, access) stops it at once.
    """

    def __init__(
        self,
        runtime: Runtime,
        wait: float,
        *,
        started: float | None = None,
        attempt: _OpenAttempt | None = None,
    ) -> None:
        self._runtime = runtime
        self._wait = wait
        self._started = time.monotonic() if started is None else started
        self._attempt = attempt
        #: the adapter is open (until then an attempt may still be under way)
        self.opened = False
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

    def _left(self) -> float:
        """Seconds until the wait ends (infinite without a bound)."""
        if self._wait <= 0:
            return float("inf")
        return self._started + self._wait - time.monotonic()

    def _run(self) -> None:
        from wsnmom.startup import explain

        runtime = self._runtime
        delay = 0.5
        last: BaseException | None = None
        attempt = self._attempt
        while not self._stop.is_set():
            if attempt is None:
                attempt = _OpenAttempt(runtime.adapter)
            while not attempt.done.wait(min(0.1, max(self._left(), 0.01))):
                if self._stop.is_set():
                    return
                if self._left() <= 0:
                    self._time_is_up(last)
                    return
            error, attempt = attempt.error, None
            if error is None:
                self.opened = True
                break
            if not isinstance(error, AdapterUnavailable):
                self._give_up(int(explain(error).status), explain(error).message)
                return
            log.debug("middleware still unreachable: %s", error)
            last = error
            runtime.service.opening_failed(error)
            if self._stop.wait(max(0.0, min(delay, self._left()))):
                return
            if self._left() <= 0:
                self._time_is_up(last)
                return
            delay = min(delay * 2, 10.0)
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

    def _time_is_up(self, last: BaseException | None) -> None:
        from wsnmom.startup import explain

        error = explain(
            last
            or AdapterUnavailable(
                f"the middleware at {redact_url(self._runtime.settings.adapter_url)} did not answer"
            )
        )
        self._give_up(
            int(error.status),
            f"{error.message} (waited {self._wait:g} s: middleware.wait / --wait-for-middleware)",
        )

    def _give_up(self, status: int, message: str) -> None:
        log.error("%s; stopping", message)
        self._runtime.exit_message = message
        self._runtime.exit_status = status
        # before `wsnmom serve` handles SIGTERM, the signal would kill the process silently
        while not self._runtime.serving.wait(0.1):
            if self._stop.is_set():
                return
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
    #: set by ``wsnmom serve`` once it handles SIGTERM (the connector may then stop it)
    serving: threading.Event = field(default_factory=threading.Event, repr=False)
    #: the subscriptions at upstream producers (``wsnmom.upstreams``)
    upstreams: UpstreamRelay | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def connected(self) -> None:
        """The adapter is open: tell plugins, restore the broker, run the start-up hooks."""
        self.plugins.adapter_opened(self.adapter)
        self.service.start()
        if self.upstreams is not None:
            self.upstreams.start()
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
        if self.upstreams is not None:
            self.upstreams.stop()
        self.service.close()
        try:
            if self.connector is not None and not self.connector.opened:
                # an attempt to open may hold the adapter for its whole timeout: stopping
                # must not wait for it (the process is ending; the attempt is a daemon)
                closing = threading.Thread(target=self.adapter.close, daemon=True)
                closing.start()
                closing.join(timeout=1.0)
            else:
                self.adapter.close()
        finally:
            try:
                self.store.close()
            finally:
                self.store_lock.release()


#: how long start-up waits for the first attempt to open the middleware before it serves
#: HTTP anyway (``/healthz`` answers, WS-N requests get 503) and goes on in the background
FIRST_ATTEMPT = 0.5


def _first_attempt(adapter: Adapter, wait: float) -> _OpenAttempt:
    """Start opening ``adapter`` and give it ``FIRST_ATTEMPT`` seconds (at most ``wait``).

    Returns the attempt, finished successfully or still under way (the connector takes it
    over); raises what a finished attempt raised unless that is ``AdapterUnavailable``,
    which is logged with what happens next."""
    attempt = _OpenAttempt(adapter)
    attempt.done.wait(min(FIRST_ATTEMPT, wait) if wait > 0 else FIRST_ATTEMPT)
    if attempt.done.is_set() and attempt.error is not None:
        if not isinstance(attempt.error, AdapterUnavailable):
            raise attempt.error
        cause = str(attempt.error)
    elif attempt.done.is_set():
        return attempt
    else:
        cause = f"the middleware has not answered within {FIRST_ATTEMPT:g} s"
    if wait > 0:
        log.warning(
            "%s; trying for up to %g s (middleware.wait / --wait-for-middleware), then "
            "exiting with status 9; meanwhile /healthz answers and WS-N requests get HTTP 503",
            cause,
            wait,
        )
    else:
        log.warning(
            "%s; trying in the background until it answers; meanwhile /healthz answers, "
            "/readyz says 503 and WS-N requests get HTTP 503",
            cause,
        )
    return attempt


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
        if shared_store(settings.store_url):
            given = {name for name, _ in parse_qsl(urlsplit(settings.adapter_url).query)}
            for name, value in adapter_class.cluster_options.items():
                if name not in given:
                    options.setdefault(name, value)
        return adapter_class(settings.adapter_url, options)
    except (ValueError, TypeError) as exc:  # the URL or the options cannot be used
        raise ConfigError(f"adapter_url / adapter_options: {exc}") from exc


def _checked_store(settings: Settings, adapter: str) -> Store:
    """The store of ``settings``, opened, refused when a ``wsnmom store migrate`` into it
    did not finish (``core.store_migration``) or when it holds another adapter's resources
    (``core.store_binding``), and bound to ``adapter``."""
    store = open_store(settings.store_url, instance_id=instance_id(settings.cluster.instance_id))
    try:
        refuse_unfinished(store)
        bind_store(store, adapter)
    except BaseException:
        store.close()
        raise
    return store


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
    with contextlib.ExitStack() as undo:  # what a start that fails gives back, newest first
        store_lock = lock_store(settings.store_url)
        undo.callback(store_lock.release)
        started = time.monotonic()
        attempt: _OpenAttempt | None = None
        if wait:
            attempt = _first_attempt(adapter, settings.middleware.wait)
        else:
            adapter.open()
        undo.callback(adapter.close)
        opened = attempt is None or (attempt.done.is_set() and attempt.error is None)
        store = _checked_store(settings, type(adapter).name)
        undo.callback(store.close)
        policy = outbound_policy or OutboundPolicy(settings.outbound)
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
        undo.callback(service.close)
        app = create_app(service, settings)
        undo.pop_all()  # started: the runtime owns them now
    plugins.configure_app(app, service)
    runtime = Runtime(settings, plugins, adapter, store, topic_set, service, app, store_lock)
    runtime.upstreams = UpstreamRelay(
        settings.upstream, store, service, settings.base_url, epoch=service.cluster.leader_epoch
    )
    app.extensions["wsnmom.soap"].relay = runtime.upstreams.receive
    app.extensions["wsnmom.upstreams"] = runtime.upstreams
    if opened:
        try:
            runtime.connected()
        except BaseException:
            runtime.close()
            raise
    else:
        runtime.connector = MiddlewareConnector(
            runtime,
            settings.middleware.wait,
            started=started,
            attempt=attempt,
        )
        runtime.connector.start()
    return runtime
