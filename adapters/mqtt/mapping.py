"""Where WS topics live on MQTT, and which WS topic an MQTT message is on.

A topic ``{ns}a/b`` is the MQTT topic ``root/a/b``: the namespace's configured prefix (one
or more levels) or the one-level root derived from its URI, then the escaped path segments
(``topic_mapping``'s MQTT syntax).  Topic expressions become MQTT filters (``+``, ``#``),
one or more per expression; a subscription without a topic filter gets ``#``.  Internal
namespaces (pull point inboxes) never reach the broker: the adapter routes them in
process, so they have no filter.  The one exception is the dead-letter namespace
(``core.dead_letters``) on MQTT 5 (``dead_letters``): destination ``name`` is the MQTT
topic ``wsnmom/dead-letters/name`` (:data:`DEAD_LETTER_ROOT`, under the topic prefix),
published and subscribed like any other, so dead letters live on the broker.

The gateways of one topic prefix read each destination through the shared subscription
``$share/<dead_letter_share>/<topic>`` (MQTT 5): the broker hands each dead letter to one
of them, which holds it, as RabbitMQ's competing consumers do on one queue; with an empty
``dead_letter_share`` each gateway's box gets a copy of every one.

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

from wsnmom.core.adapter import (
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    INTERNAL_NAMESPACE_PREFIX,
    is_internal_namespace,
)
from wsnmom.core.dead_letter_records import DEAD_LETTER_NAMESPACE, check_destination
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

__all__ = [
    "DEAD_LETTER_ROOT",
    "EVERYTHING",
    "INTERNAL_ROOT",
    "RECORD_ROOT",
    "UNMAPPED_NAMESPACE",
    "MqttMapping",
]

#: the filter of a subscription without a topic filter
EVERYTHING = "#"
#: routing namespace of a message whose MQTT topic has no WS topic (nobody receives it)
UNMAPPED_NAMESPACE = "urn:wsnmom:internal:unmapped"
_CACHE_LIMIT = 100_000
#: the MQTT topic levels (under the topic prefix) above each dead-letter destination
DEAD_LETTER_ROOT = "wsnmom/dead-letters"
#: the MQTT topic levels (under the topic prefix) above the internal topics a cluster
#: routes through the broker (pull point inboxes): ``<root>/<namespace suffix>/<path>``
INTERNAL_ROOT = "wsnmom/internal"
#: the MQTT topic levels (under the topic prefix) of cluster mode's session records
#: (retained messages, read by the gateway only: no subscription's topic)
RECORD_ROOT = "wsnmom/sessions"


class MqttMapping:
    """Topic <-> MQTT topic name, and patterns -> filters, for one adapter.  Thread-safe."""

    def __init__(
        self,
        namespaces: Mapping[str, str],
        topic_prefix: str = "",
        *,
        dead_letters: bool = False,
        dead_letter_share: str = "",
        internal_on_broker: bool = False,
    ) -> None:
        self.roots = NamespaceRoots.for_syntax(dict(namespaces), MQTT)
        #: "prefix/" or ""
        self.head = topic_prefix + "/" if topic_prefix else ""
        #: whether dead letters are on the broker (MQTT 5), and the levels above them
        self.dead_letters = dead_letters
        self.dead_letter_head = f"{self.head}{DEAD_LETTER_ROOT}/"
        #: the filters of dead-letter boxes are shared subscriptions of this group (each
        #: dead letter reaches one gateway of it); "": plain ones (each gets a copy)
        self.dead_letter_share = f"$share/{dead_letter_share}/" if dead_letter_share else ""
        self.everything = self.head + EVERYTHING
        #: cluster mode: internal topics (pull point inboxes) go through the broker too,
        #: under :data:`INTERNAL_ROOT`, so every instance's Notify reaches the inbox
        self.internal_on_broker = internal_on_broker
        self.internal_head = f"{self.head}{INTERNAL_ROOT}/"
        self.record_head = f"{self.head}{RECORD_ROOT}/"
        self._lock = threading.Lock()
        self._names: dict[Topic, str] = {}
        self._topics: dict[str, Topic] = {}
        #: namespaces whose root is known (configured ones from the start)
        self._registered: set[str] = set(namespaces)

    def on_broker(self, namespace: str) -> bool:
        """Whether messages of ``namespace`` go through the broker (every namespace but
        the internal ones; dead letters too with ``dead_letters``)."""
        if not is_internal_namespace(namespace) or self.internal_on_broker:
            return True
        return self.dead_letters and namespace == DEAD_LETTER_NAMESPACE

    def is_dead_letter(self, topic: Topic) -> bool:
        """Whether ``topic`` is a dead-letter destination kept on the broker."""
        return self.dead_letters and topic.namespace == DEAD_LETTER_NAMESPACE

    # -- topics -> names -------------------------------------------------------------------
    def name(self, topic: Topic) -> str:
        """The MQTT topic of ``topic``; NameNotRepresentable when it has none (too long,
        starting with ``$``, read back as another namespace's topic)."""
        found = self._names.get(topic)
        if found is not None:
            return found
        if self.is_dead_letter(topic):
            try:
                if len(topic.path) != 1:
                    raise ValueError("not a dead-letter destination")
                return self.dead_letter_head + check_destination(topic.path[0])
            except ValueError as exc:
                raise NameNotRepresentable(f"{topic}: {exc}") from exc
        if self.internal_on_broker and is_internal_namespace(topic.namespace):
            return self.internal_head + "/".join(
                _level(x) for x in (_internal_suffix(topic.namespace), *topic.path)
            )
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
        found: set[str] = set()
        for p in patterns:
            if self.dead_letters and p.namespace == DEAD_LETTER_NAMESPACE:
                # one destination, or (wildcards) all of them: routed by the queue store
                if p.is_concrete and len(p.segments) == 1:
                    found.add(self.dead_letter_share + self.name(p.as_topic()))
                else:
                    found.add(self.dead_letter_share + self.dead_letter_head + EVERYTHING)
            elif self.internal_on_broker and is_internal_namespace(p.namespace):
                if p.is_concrete:
                    found.add(self.name(p.as_topic()))
                else:
                    suffix = _level(_internal_suffix(p.namespace))
                    found.add(f"{self.internal_head}{suffix}/{EVERYTHING}")
        external = [p for p in patterns if not is_internal_namespace(p.namespace)]
        if not external:
            return frozenset(found)
        for p in external:
            self.register(p.namespace)
        head = self.head
        found.update(head + n.pattern for n in translate(external, MQTT, self.roots).patterns)
        return frozenset(found)

    # -- names -> topics -------------------------------------------------------------------
    def topic(self, name: str, headers: Mapping[str, str] | None = None) -> Topic:
        """The routing topic of a message on MQTT topic ``name``.  The ``wsnmom-topic-*``
        headers settle which namespace a derived root belongs to when this process has not
        seen it yet; they never override the topic the name stands for."""
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        if self.dead_letters and name.startswith(self.dead_letter_head):
            return self._dead_letter_topic(name[len(self.dead_letter_head) :])
        if self.internal_on_broker and name.startswith(self.record_head):
            return Topic(UNMAPPED_NAMESPACE, ("_x_",))
        if self.internal_on_broker and name.startswith(self.internal_head):
            levels = name[len(self.internal_head) :].split("/")
            if len(levels) >= 2 and all(levels):
                return Topic(INTERNAL_NAMESPACE_PREFIX + levels[0], tuple(levels[1:]))
            return Topic(UNMAPPED_NAMESPACE, ("_x_",))
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

    @staticmethod
    def _dead_letter_topic(level: str) -> Topic:
        """The dead-letter topic of the MQTT topic level after :data:`DEAD_LETTER_ROOT`
        (nobody's when it cannot name a destination)."""
        try:
            return Topic(DEAD_LETTER_NAMESPACE, (check_destination(level),))
        except ValueError:
            return Topic(UNMAPPED_NAMESPACE, ("_x_",))


def _internal_suffix(namespace: str) -> str:
    """What follows the internal prefix in ``namespace``."""
    return namespace[len(INTERNAL_NAMESPACE_PREFIX) :]


def _level(text: str) -> str:
    """``text`` as one MQTT topic level; NameNotRepresentable when it cannot be one."""
    if not text or any(c in text for c in "/+#\x00") or text.startswith("$"):
        raise NameNotRepresentable(f"{text!r} cannot be an MQTT topic level")
    return text
