"""Everything one gateway instance holds for one MQTT broker: the queue store, the
persistent session with its ingest worker, the publishing connection and the mapping.

A node belongs to a queue directory (``<data_dir>/mqtt``), which the queue store locks to
one process; within a process every adapter opened on the same directory shares the node
(the conformance kit and tools open several at once), so the session's client id is only
ever connected once.  The last adapter to close closes it.

With the option ``spark_logs`` the session also feeds the Spark bridge's buffer logs
(taps, see :mod:`.taps`).  On MQTT 5 dead letters live on the broker: the queue store puts
what its limits drop in its outbox, which :class:`~.outbox.Outbox` publishes.

Threads per node, whatever the number of subscriptions: paho's network thread for the
session and one for the publisher, the ingest worker, the outbox sender (MQTT 5), and the
queue store's dispatcher and checkpoint threads.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import AdapterError

from .config import MqttSettings
from .mapping import MqttMapping
from .outbox import Outbox
from .publisher import Publisher
from .session import Session
from .state import SessionState
from .taps import Taps, tap_provider

__all__ = ["Node", "acquire", "release"]

log = logging.getLogger("wsnmom.adapters.mqtt")


class Node:
    """The shared state of one queue directory (see the module docstring)."""

    def __init__(self, settings: MqttSettings) -> None:
        self.settings = settings
        self.directory = settings.queue_dir
        self.users = 0
        self.mapping = MqttMapping(
            settings.namespaces,
            settings.topic_prefix,
            dead_letters=settings.v5,
            dead_letter_share=settings.dead_letter_share,
        )
        self.engine = Engine(
            os.path.join(self.directory, "queues"),
            synchronous=settings.synchronous,
            keep_current=False,
            outbox=self.mapping.is_dead_letter,
        )
        try:
            self.state = SessionState(self.directory)
            self.client_id = self.state.settle_client_id(settings.client_id)
            self.session = Session(
                settings, self.client_id, self.engine, self.mapping, self.state, _taps(settings)
            )
            self.publisher = Publisher(settings, self.client_id + "-p")
            self.outbox = Outbox(
                self.engine,
                self.mapping,
                self.publisher,
                settings.subscribe_timeout,
                ready=self.session.subscribed,
            )
            self.engine.on_outbox = self.outbox.kick
        except BaseException:
            self.engine.close()
            raise

    def subscriptions(self) -> Iterator[tuple[str, frozenset[str]]]:
        """(name, filters) of every subscription in the queue store."""
        for st in list(self.engine.subs.values()):
            try:
                yield st.name, self.mapping.filters(st.patterns)
            except ValueError as exc:
                log.error("MQTT: subscription %s has no MQTT filter: %s", st.name, exc)

    def start(self) -> None:
        """Connect the session (restoring its filters) and the publisher."""
        try:
            self.session.start(self.subscriptions())
            self.publisher.start()
            if self.mapping.dead_letters:  # MQTT 3.1.1: nothing is ever put in the outbox
                self.outbox.start()
        except BaseException:
            self.close()
            raise

    @property
    def connected(self) -> bool:
        return self.session.link.connected and self.publisher.link.connected

    @property
    def reason(self) -> str:
        """Why a connection is down ("" when both are up; no I/O)."""
        return self.session.link.reason or self.publisher.link.reason

    def close(self) -> None:
        """Stop the session (what arrived is stored and acknowledged), the publisher and
        the queue store."""
        try:
            self.outbox.stop()
            self.session.stop()
            self.publisher.stop()
        finally:
            self.engine.close()
            self.state.close()


def _taps(settings: MqttSettings) -> Taps:
    """The session's taps: the Spark bridge's buffer logs named by ``spark_logs``."""
    if not settings.spark_logs:
        return Taps()
    return Taps(tap_provider("spark_logs").taps(settings.spark_logs))


_nodes: dict[str, Node] = {}
_lock = threading.Lock()


def acquire(settings: MqttSettings) -> Node:
    """The started node of ``settings``' queue directory; call :func:`release`."""
    key = os.path.realpath(settings.queue_dir)
    with _lock:
        node = _nodes.get(key)
        if node is None:
            try:
                node = Node(settings)
            except (OSError, sqlite3.Error) as exc:
                raise AdapterError(f"cannot use {settings.queue_dir!r}: {exc}") from exc
            except ValueError as exc:  # a spark_logs entry the bridge refuses
                raise AdapterError(f"bad MQTT adapter option spark_logs: {exc}") from exc
            node.start()
            _nodes[key] = node
        node.users += 1
        return node


def release(node: Node) -> None:
    """Drop one user of ``node``; the last one closes it."""
    with _lock:
        node.users -= 1
        if node.users > 0:
            return
        _nodes.pop(os.path.realpath(node.directory), None)
    node.close()
