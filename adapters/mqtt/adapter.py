"""MQTT adapter: WS-Topics trees on MQTT topics, WS-N subscriptions kept durable by one
persistent session per gateway instance, through paho-mqtt (callback API version 2).

Features
    * **Mapping** (``MqttMapping``): the WS topic ``{ns}a/b`` is the MQTT topic
      ``prefix/a/b``; each namespace has a configured prefix (one or more levels) or a
      one-level root derived from its URI; levels are escaped by ``topic_mapping``'s MQTT
      syntax.  Topic expressions become MQTT filters (``+``, ``#``); what MQTT cannot
      express (``//`` before a literal) is widened and decided per message by the
      subscription's own patterns.  MQTT topics under no known prefix belong to the
      namespace ``urn:wsnmom:native`` (the whole MQTT topic is the path).
    * **Session shape** (``Session``): one persistent session (clean start false, QoS 1)
      subscribes to a disjoint set of filters covering every subscription (``FilterSet``);
      its messages are routed by topic into durable per-subscription queues the gateway
      keeps in ``<data_dir>/mqtt`` (the embedded adapter's SQLite queue store) and
      PUBACKed in arrival order once stored.  Subscriptions then behave like queues:
      per-message ack and nack, native pull, limits enforced as messages arrive, FIFO per
      subscription.  The broker keeps the session's messages while the gateway is down;
      the queues keep them while a subscription is paused.  10,000 subscriptions cost two
      connections and six threads in all (five on MQTT 3.1.1).
    * Publishing (``Publisher``): QoS 1, returns after the PUBACK; with ``retain`` (default)
      every message is retained, so GetCurrentMessage reads the broker's retained message
      of the topic (also one a native client retained).  Retained messages are never
      delivered as new notifications (MQTT 5 Retain Handling 2; on 3.1.1 messages with the
      RETAIN flag are dropped on arrival).
    * MQTT 5 (default): metadata in user properties, Content Type, Payload Format
      Indicator, "no matching subscribers" as ``routed=False``, subscription identifiers.
      MQTT 3.1.1 (``protocol = "3.1.1"``): topic and body only (``native_headers`` False).
    * Internal topics (pull point inboxes) never reach the broker: they are routed in
      process.  Dead letters are the exception on MQTT 5: destination ``name`` is the MQTT
      topic ``<topic_prefix>/wsnmom/dead-letters/name`` (QoS 1, never retained, context in
      ``wsnmom-*`` user properties), read back by the gateway's box through the session
      like any subscription; what the queues' limits drop reaches it through the queue
      store's outbox (:mod:`.outbox`).  On 3.1.1 (no user properties to carry the
      context) they stay in the queue store as internal topics.
    * Several gateway instances on one broker each have their own session and queues: a
      message reaches each WS-N subscription once, from the one instance that holds it.
      Each instance's box reads every dead letter of a destination (as a native
      subscriber would): replaying or purging one in one instance leaves the others'
      copies.
    * Cluster mode (``shared_by_instances``: several instances on one PostgreSQL store,
      MQTT 5 only): every durable subscription is a persistent session of its own on the
      broker (:mod:`.cluster_handle`), nothing of it on this instance's disk; the
      instance holding its shard connects it, and a reconnect is made only while core's
      fence says this instance still delivers it.  Pull point inboxes then go through
      the broker; no native pull, no peek, no limits but the broker's own
      (docs/scale-out.md "MQTT in cluster mode").
    * Reachability: ``available()`` is False while either connection is down; publishing
      and subscribing then fail at once (``AdapterUnavailable``); paho reconnects with
      backoff and the session resubscribes what the broker lacks.

Connection String
    ``mqtt://[user[:password]@]host[:port]`` (1883), ``mqtts://...`` (TLS, 8883); adapter
    options as query arguments (``?protocol=3.1.1``) or in ``adapter_options``.  Passwords
    never appear in log lines or ``repr``.

Options
    Declared once, each with its default and meaning, by ``MqttSettings`` (:mod:`.config`);
    docs/adapters/mqtt.md, "Options", has the table.  The gateway passes its data
    directory as ``data_dir``.

Code layout: this module is the facade (``MqttAdapter``: lifecycle, both modes,
subscriptions, current message, stats) and the single-instance handle (``MqttHandle``);
:mod:`.capabilities` says what the adapter can do by protocol and mode, and
:mod:`.publish_routing` where each published message goes.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from wsnmom.adapters.embedded.adapter import EmbeddedHandle
from wsnmom.core.adapter import (
    Adapter,
    AdapterError,
    AdapterUnavailable,
    Capabilities,
    OutboundMessage,
    PublishReceipt,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
    TopicUnavailable,
    is_internal_namespace,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.core.redaction import redact_url
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import Topic

from . import node as nodes
from .box_retire import retire_departed
from .capabilities import CAPABILITIES, capabilities_of
from .cluster_handle import ClusterHandle, describe
from .cluster_node import ClusterNode
from .config import MqttSettings, parse_settings
from .publish_routing import route_and_publish
from .taps import tap_provider
from .wire import metadata

__all__ = ["MqttAdapter", "MqttHandle"]

log = logging.getLogger("wsnmom.adapters.mqtt")


class MqttHandle(EmbeddedHandle):
    """A subscription's queue; deleting it also releases its MQTT filters."""

    __slots__ = ()

    def delete(self) -> None:
        """Destroy the subscription, its messages and (when unused) its filters."""
        adapter = self._adapter
        assert isinstance(adapter, MqttAdapter)
        adapter.delete_subscription(self.name)
        self.detach()

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Destroy the queue in the transaction that sends its messages to its dead-letter
        topic (the outbox on MQTT 5), then release its filters.  The transaction runs at a
        session barrier: what the broker confirmed before the call (a PUBACK comes before
        the broker delivers to this session) is in the queue by then, and goes too."""
        adapter = self._adapter
        assert isinstance(adapter, MqttAdapter)
        node = adapter._require()
        sent = node.session.at_barrier(
            functools.partial(node.engine.delete_into_dead_letters, self.name, reason, context),
            timeout,
        )
        node.session.release(self.name)
        self.detach()
        return sent or 0


class MqttAdapter(Adapter):
    """MQTT adapter (see the module docstring)."""

    name = "mqtt"
    schemes = ("mqtt", "mqtts")
    extra = "mqtt"
    uses_data_dir: ClassVar[bool] = True
    capabilities = CAPABILITIES

    declared_options = MqttSettings

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        self.settings: MqttSettings = parse_settings(url, options)
        if self.settings.data_dir is None:
            raise AdapterOptionError(
                "the MQTT adapter keeps its subscriptions' queues on disk: give it the "
                "option data_dir (wsnmom serve passes its data directory)"
            )
        if self.settings.spark_logs:
            try:
                tap_provider("spark_logs").check(self.settings.spark_logs)
            except ValueError as exc:
                raise AdapterOptionError(f"bad MQTT adapter option spark_logs: {exc}") from exc
        #: cluster mode (``shared_by_instances``): every subscription is a session of its
        #: own on the broker (docs/scale-out.md "MQTT in cluster mode")
        self._cluster = False
        self._may_deliver: Callable[[str], bool] | None = None
        self._cnode: ClusterNode | None = None
        #: this instance's id in the cluster (``joined_as``)
        self._instance = ""
        #: whether the store still holds a subscription (``kept_in_store``)
        self._stored: Callable[[str], bool] | None = None
        self._held: Callable[[Collection[str]], set[str]] | None = None
        self._chandles: weakref.WeakSet[ClusterHandle] = weakref.WeakSet()
        self.capabilities = self._capabilities()
        self._lock = threading.Lock()
        self._node: nodes.Node | None = None
        self._handles: weakref.WeakSet[MqttHandle] = weakref.WeakSet()

    def _capabilities(self, max_bytes: int | None = None) -> Capabilities:
        return capabilities_of(self.settings, cluster=self._cluster, max_bytes=max_bytes)

    def shared_by_instances(self, may_save: Callable[[str], bool] | None = None) -> None:
        """Cluster mode: every durable subscription becomes a persistent MQTT session of
        its own on the broker, delivered by the instance that ``may_save`` says holds it
        (docs/scale-out.md).  Needs MQTT 5 and no ``spark_logs``."""
        if not self.settings.v5:
            raise AdapterOptionError(
                "the MQTT adapter runs several gateway instances on one store (cluster "
                "mode) only with MQTT 5 (session expiry, user properties): remove "
                "protocol=3.1.1, or run one instance with its own store"
            )
        if self.settings.spark_logs:
            raise AdapterOptionError(
                "the MQTT adapter option spark_logs needs the instance's own session, "
                "which cluster mode does not have: run the Spark taps on a single "
                "instance (its own store) or with the standalone MQTT buffer"
            )
        with self._lock:
            if self._cluster:
                return
            node, self._node = self._node, None
            if node is not None and (self._handles or node.engine.subs):
                self._node = node
                raise AdapterError(
                    "the MQTT adapter holds subscriptions of a single instance already: "
                    "cluster mode must be chosen before any subscription is made"
                )
            self._cluster = True
            self._may_deliver = may_save
            self.capabilities = self._capabilities()
        if node is not None:
            # opened before core knew the store is shared (``wsnmom serve`` opens the
            # middleware first): the single-instance node goes, cluster mode opens, and
            # the node's session (no filters, nothing queued) is ended on the broker
            nodes.release(node)
            self._open_cluster()
            if node.users == 0 and self._cnode is not None:
                try:
                    self._cnode.sessions.delete(node.client_id)
                except AdapterError as exc:
                    log.warning("MQTT: cannot end the instance's unused session: %s", exc)

    def kept_in_store(self, stored: Callable[[str], bool]) -> None:
        """Core's answer whether the store still holds a subscription: a session found
        gone from the broker with its record is made again while it does (a broker that
        lost its state, docs/scale-out.md "MQTT in cluster mode")."""
        self._stored = stored
        cnode = self._cnode
        if cnode is not None:
            cnode.sessions.questions.stored = stored

    def kept_in_store_many(self, held: Callable[[Collection[str]], set[str]]) -> None:
        """``kept_in_store``'s plural: the store asked once per burst of lost sessions."""
        self._held = held
        cnode = self._cnode
        if cnode is not None:
            cnode.sessions.questions.held = held

    def joined_as(self, instance_id: str) -> None:
        """Note ``instance_id`` in the records of this instance's dead-letter boxes (the
        instance running periodic work retires them once it departed)."""
        self._instance = instance_id
        cnode = self._cnode
        if cnode is not None:
            cnode.sessions.owner = instance_id

    def retire_departed(self, live: Callable[[], Collection[str]]) -> list[str]:
        """Retire the dead-letter boxes of the instances not in ``live``
        (:mod:`.box_retire`): their letters are published again through the group, which
        this instance's own box of the destination reads (a box of a destination this
        instance does not read now is left for a later call).  Returns the client ids of
        the box sessions retired."""
        if not self._cluster:
            return []
        return retire_departed(
            self._require_cluster(), self._chandles, live, self.settings.subscribe_timeout
        )

    def __repr__(self) -> str:
        return f"<MqttAdapter {redact_url(self.url)} open={self._node is not None}>"

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Open the queues, connect the session (resubscribing what the broker lacks) and
        the publisher; idempotent."""
        if self._cluster:
            self._open_cluster()
            return
        with self._lock:
            if self._node is not None:
                return
            node = nodes.acquire(self.settings)
            self._node = node
        size = node.publisher.max_packet_size
        self.capabilities = self._capabilities(size - 1024 if size else None)
        log.info(
            "MQTT adapter open on %s (MQTT %s, session %s)",
            redact_url(self.url),
            self.settings.protocol,
            node.client_id,
        )

    def _open_cluster(self) -> None:
        """Cluster mode's ``open``: the publisher only (module cluster_node)."""
        with self._lock:
            if self._cnode is not None:
                return
            try:
                cnode = ClusterNode(self.settings, self._may_deliver)
            except OSError as exc:
                raise AdapterError(f"cannot use {self.settings.queue_dir!r}: {exc}") from exc
            cnode.sessions.owner = self._instance
            cnode.sessions.questions.stored = self._stored
            cnode.sessions.questions.held = self._held
            cnode.start()
            self._cnode = cnode
        size = cnode.publisher.max_packet_size
        self.capabilities = self._capabilities(size - 1024 if size else None)
        log.info(
            "MQTT adapter open on %s in cluster mode (a session per subscription, instance %s)",
            redact_url(self.url),
            cnode.client_id,
        )

    def close(self) -> None:
        """Stop this adapter's handles (unsettled messages return) and release the node."""
        with self._lock:
            cnode, self._cnode = self._cnode, None
        if cnode is not None:
            for chandle in list(self._chandles):
                chandle.stop()
            cnode.close()
        with self._lock:
            node, self._node = self._node, None
        if node is None:
            return
        for handle in list(self._handles):
            handle.stop()
            handle.detach()
        nodes.release(node)

    def _require_cluster(self) -> ClusterNode:
        cnode = self._cnode
        if cnode is None:
            raise AdapterUnavailable("the MQTT adapter is not open")
        return cnode

    def _require(self) -> nodes.Node:
        node = self._node
        if node is None:
            raise AdapterUnavailable("the MQTT adapter is not open")
        return node

    def ping(self, timeout: float = 1.0) -> bool:
        """Whether both connections to the broker are up."""
        if self._cluster:
            return self._cnode is not None and self._cnode.connected
        node = self._node
        return node is not None and node.connected

    def available(self) -> bool:
        """False while a connection to the broker is down (no I/O)."""
        if self._cluster:
            return self._cnode is not None and self._cnode.connected
        node = self._node
        return node is not None and node.connected

    def unavailable_reason(self) -> str | None:
        """Why a connection to the broker is down (``Link.reason``; no I/O)."""
        node: nodes.Node | ClusterNode | None = self._cnode if self._cluster else self._node
        if node is None:
            return "the MQTT adapter is not open"
        return node.reason or None

    # -- publishing -------------------------------------------------------------------------
    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        """Publish one message (QoS 1) and wait for the PUBACK."""
        return self.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        """Publish everything, then wait for every PUBACK; messages on internal topics are
        stored in the queues directly (one transaction), dead letters on MQTT 5 are
        published without RETAIN."""
        if not messages:
            return []
        node: nodes.Node | ClusterNode | None = self._cnode if self._cluster else self._node
        if node is None:
            raise AdapterUnavailable("the MQTT adapter is not open")
        return route_and_publish(node, messages, timeout, self._chandles if self._cluster else None)

    # -- subscriptions ----------------------------------------------------------------------
    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        """Create or re-attach to the queue ``spec.name`` and make sure the session holds
        filters for its patterns (returns once the broker acknowledged them).  In cluster
        mode: make sure the subscription's own session exists with its filters."""
        if self._cluster:
            return self._cluster_subscription(spec)
        node = self._require()
        try:
            filters = node.mapping.filters(spec.patterns)
        except NameNotRepresentable as exc:
            raise TopicUnavailable(f"no MQTT filter for the subscription: {exc}") from exc
        engine = node.engine
        known = engine.subs.get(engine.by_name.get(spec.name, -1))
        if not filters or (
            known is not None and known.patterns == spec.patterns and known.limits == spec.limits
        ):
            # nothing new to route (a re-attach, a pull point inbox): attach at once
            st = engine.attach(spec.name, spec.patterns, spec.limits, spec.dead_letters)
            node.session.assign(spec.name, filters)
        else:
            # attached at a barrier after its SUBSCRIBEs: routed what was published after
            # it was created, not what was in flight before
            st = node.session.assign(
                spec.name,
                filters,
                functools.partial(
                    engine.attach, spec.name, spec.patterns, spec.limits, spec.dead_letters
                ),
            )
        handle = MqttHandle(self, engine, st.id, st.name)
        self._handles.add(handle)
        return handle

    def _cluster_subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        cnode = self._require_cluster()
        try:
            chandle = ClusterHandle(cnode.sessions, spec)
        except NameNotRepresentable as exc:
            raise TopicUnavailable(f"no MQTT filter for the subscription: {exc}") from exc
        if spec.origin != "elsewhere":
            # a subscription made through another instance was declared there before its
            # Subscribe was answered: a declare here would read its record, and one read
            # before that instance wrote it connects, cutting off whoever delivers it
            cnode.sessions.declare(
                chandle.client_id,
                chandle.filters,
                self.settings.subscribe_timeout,
                spec.name,
                new=spec.origin == "new",
            )
        self._chandles.add(chandle)
        return chandle

    def delete_subscription(self, name: str) -> None:
        """Destroy the queue ``name`` and release its filters; idempotent."""
        if self._cluster:
            sessions = self._require_cluster().sessions
            sessions.delete(sessions.client_id(name))
            return
        node = self._require()
        node.engine.delete_subscription(name)
        node.session.release(name)

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """Depths of many queues in one transaction."""
        if self._cluster:
            return [None if isinstance(h, ClusterHandle) else h.depth() for h in handles]
        engine = self._require().engine
        out: list[int | None] = [None] * len(handles)
        ours = [
            (i, h._sid)
            for i, h in enumerate(handles)
            if isinstance(h, MqttHandle) and h._engine is engine and not h._detached
        ]
        for (i, _), depth in zip(ours, engine.depths([sid for _, sid in ours]), strict=True):
            out[i] = depth
        for i, h in enumerate(handles):
            if out[i] is None:
                out[i] = 0 if isinstance(h, MqttHandle) else h.depth()
        return out

    def subscription_names(self) -> list[str] | None:
        """Names of every queue (subscription) this gateway instance keeps (cluster mode:
        the subscriptions whose sessions' records are on the broker,
        ``SubscriptionSessions.names``; None when a record names none, written before
        records named their subscription)."""
        if self._cluster:
            sessions = self._require_cluster().sessions
            try:
                return sessions.names(self.settings.subscribe_timeout)
            except AdapterUnavailable:
                raise
            except AdapterError as exc:
                log.warning("MQTT: %s", exc)
                return None
        return self._require().engine.subscription_names()

    # -- current message --------------------------------------------------------------------
    def current_message(self, topic: Topic) -> StoredMessage | None:
        """The message the broker retains on ``topic`` (also one a native client
        retained), None when there is none or retaining is off."""
        node: nodes.Node | ClusterNode | None = self._cnode if self._cluster else self._node
        if node is None:
            raise AdapterUnavailable("the MQTT adapter is not open")
        if not self.settings.retain or is_internal_namespace(topic.namespace):
            return None
        try:
            name = node.mapping.name(topic)
        except NameNotRepresentable:
            return None
        found = node.publisher.retained(name, self.settings.subscribe_timeout)
        if found is None or not found.payload:
            return None
        headers, content_type = metadata(
            found.properties if self.settings.v5 else None, found.payload
        )
        return StoredMessage(
            topic=topic, body=found.payload, headers=headers, content_type=content_type
        )

    # -- information ------------------------------------------------------------------------
    def stats(self) -> Mapping[str, Any]:
        """Counts for tests and metrics: filters, subscriptions, arrivals, messages handed
        to taps (``spark_logs``), the publisher's window and the most messages it had
        unacknowledged at once, and the dead-letter outbox's (:meth:`.Outbox.stats`)."""
        if self._cluster:
            cnode = self._require_cluster()
            return {
                "client_id": cnode.client_id,
                "cluster": True,
                **describe(list(self._chandles)),
                "publish_window": cnode.publisher.window,
                "publish_peak_inflight": cnode.publisher.peak_inflight,
            }
        node = self._require()
        s = node.session.stats
        return {
            "client_id": node.client_id,
            "filters": len(node.session.filters),
            "subscriptions": len(node.engine.subs),
            "received": s.received,
            "committed": s.committed,
            "dropped_retained": s.dropped_retained,
            "dropped_twins": s.dropped_twins,
            "dropped_qos0": s.dropped_qos0,
            "tapped": node.session.taps.delivered,
            "tap_failures": node.session.taps.failures,
            "backlog": node.session.backlog(),
            "publish_window": node.publisher.window,
            "publish_peak_inflight": node.publisher.peak_inflight,
            **node.outbox.stats(),
        }
