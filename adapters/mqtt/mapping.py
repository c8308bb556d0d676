"""Where WS topics live on MQTT, and which WS topic an MQTT message is on.

A topic ``{ns}a/b`` is the MQTT topic ``root/a/b``: the namespace's configured prefix (one
or more levels) or the one-level root derived from its URI, then the escaped path segments
(``topic_mapping``'s MQTT syntax).  Topic expressions become MQTT filters (``+``, ``#``),
one or more per expression; a subscription without a topic filter gets ``#``.  Internal
namespaces (pull point inboxes) never reach the broker: the adapter routes them in
process, so they have no filter.

With a ``topic_prefix`` every MQTT topic of the gateway lies under it (``prefix/root/a/b``),
"everything" is ``prefix/#``, and MQTT topics outside it are nobody's.

An MQTT topic under no known root is a topic of the fallback namespace
``urn:wsnmom:native`` whose path is the whole MQTT topic (after the prefix).  A derived
root is known once this process has used its namespace (a subscription or a publish), or
when an MQTT 5 message names its topic in the ``wsnmom-topic-*`` user properties and that
topic maps to exactly this MQTT topic.  Pure functions and caches; nothing here talks to a broker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from wsnmom.core.adapter import HEADER_TOPIC_NAMESPACE, HEADER_TOPIC_PATH, is_internal_namespace
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.escaping import is_ncname
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import MQTT
from wsnmom.topic_mapping.translate import (
    FALLBACK_NAMESPACE,
    NamespaceRoots,
    derived_root,
    native_to_topic,
    topic_to_native,
    translate,
)

__all__ = ["EVERYTHING", "UNMAPPED_NAMESPACE", "MqttMapping"]

#: the filter of a subscription without a topic filter
EVERYTHING = "#"
#: routing namespace of a message whose MQTT topic has no WS topic (nobody receives it)
UNMAPPED_NAMESPACE = "urn:wsnmom:internal:unmapped"
_CACHE_LIMIT = 100_000


class MqttMapping:
    """Topic <-> MQTT topic name, and patterns -> filters, for one adapter.  Thread-safe."""

    def __init__(self, namespaces: Mapping[str, str], topic_prefix: str = "") -> None:
        self.roots = NamespaceRoots.for_syntax(dict(namespaces), MQTT)
        #: "prefix/" or ""
        self.head = topic_prefix + "/" if topic_prefix else ""
        self.everything = self.head + EVERYTHING
        self._lock = threading.Lock()
        self._names: dict[Topic, str] = {}
        self._topics: dict[str, Topic] = {}
        #: namespaces whose root is known (configured ones from the start)
        self._registered: set[str] = set(namespaces)

    # -- topics -> names -------------------------------------------------------------------
    def name(self, topic: Topic) -> str:
        """The MQTT topic of ``topic``; NameNotRepresentable when it has none (too long,
        starting with ``$``, read back as another namespace's topic)."""
        found = self._names.get(topic)
        if found is not None:
            return found
        self.register(topic.namespace)
        try:
            name = self.head + topic_to_native(topic, MQTT, self.roots).name
        except ValueError as exc:  # NameNotRepresentable included
            raise NameNotRepresentable(f"{topic}: {exc}") from exc
        with self._lock:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            self._names[topic] = name
        return name

    def register(self, namespace: str) -> None:
        """Make MQTT topics under ``namespace``'s root map back to it."""
        if is_internal_namespace(namespace) or namespace.startswith(FALLBACK_NAMESPACE):
            return
        if namespace in self._registered:
            return
        known = self.roots.namespace_for_root(self.roots.root_for(namespace))
        with self._lock:
            self._registered.add(namespace)
            if known == namespace and self._topics:
                # names mapped to the fallback namespace before may lie under the new root
                self._topics = {
                    k: v for k, v in self._topics.items() if v.namespace != FALLBACK_NAMESPACE
                }

    # -- patterns -> filters ---------------------------------------------------------------
    def filters(self, patterns: Iterable[PathPattern] | None) -> frozenset[str]:
        """The MQTT filters a subscription with ``patterns`` needs (None: everything);
        patterns of internal namespaces need none.  NameNotRepresentable when a filter
        would be too long."""
        if patterns is None:
            return frozenset((self.everything,))
        external = [p for p in patterns if not is_internal_namespace(p.namespace)]
        if not external:
            return frozenset()
        for p in external:
            self.register(p.namespace)
        head = self.head
        return frozenset(head + n.pattern for n in translate(external, MQTT, self.roots).patterns)

    # -- names -> topics -------------------------------------------------------------------
    def topic(self, name: str, headers: Mapping[str, str] | None = None) -> Topic:
        """The routing topic of a message on MQTT topic ``name``.  The ``wsnmom-topic-*``
        headers settle which namespace a derived root belongs to when this process has not
        seen it yet; they never override the topic the name stands for."""
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        if headers:
            ns = headers.get(HEADER_TOPIC_NAMESPACE)
            path = headers.get(HEADER_TOPIC_PATH)
            # only a namespace whose root this name lies under (no registration of
            # whatever namespace a message's headers name)
            if (
                ns
                and path
                and not is_internal_namespace(ns)
                and (ns in self._registered or name.startswith(f"{self.head}{derived_root(ns)}/"))
            ):
                segments = tuple(path.split("/"))
                if all(is_ncname(s) for s in segments):
                    candidate = Topic(ns, segments)
                    try:
                        if self.name(candidate) == name:
                            topic = candidate
                    except NameNotRepresentable:
                        topic = None
        if topic is None:
            try:
                if not name.startswith(self.head):
                    raise NameNotRepresentable(f"{name!r} is outside the topic prefix")
                topic = native_to_topic(None, name[len(self.head) :], MQTT, self.roots)
            except (NameNotRepresentable, ValueError):
                topic = Topic(UNMAPPED_NAMESPACE, ("_x_",))
        with self._lock:
            if len(self._topics) >= _CACHE_LIMIT:
                self._topics.clear()
            self._topics[name] = topic
        return topic
