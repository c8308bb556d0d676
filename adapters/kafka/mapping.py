"""Where WS topics live on Kafka, and which WS topic a Kafka record is on.

Three kinds of Kafka topic (called *logs* here, as in ``adapters.logbase``):

* **per-path** logs (namespace mode ``path``): one Kafka topic per WS topic,
  ``[prefix.]root.level.level`` through ``topic_mapping``'s Kafka translation (escaped
  levels, configured or derived roots).  Every record of such a log is on that one topic.
* **per-namespace** logs (mode ``namespace``): one Kafka topic for a whole namespace; a
  record's WS topic path is its key (``a/b/c``), else its ``wsnmom-topic-path`` header,
  else the configured ``default_path``.
* the **internal** log: pull point inboxes (``core.adapter.is_internal_namespace``), keyed
  by the inbox topic in Clark notation (``{urn:wsnmom:internal:pull-point}p12``).  Never
  part of "everything" (``patterns=None``).

The gateway *follows* (reads with its head reader) the internal log, every configured
per-namespace log, and every Kafka topic under the prefix (with no prefix: every topic
whose name does not start with ``_``, Kafka's convention for internal topics).  A followed
Kafka topic under no known root maps to the fallback namespace ``urn:wsnmom:native``
(the whole name is the path), so natively produced records on any followed topic reach
WS-N subscribers.  Pure functions and caches; nothing here talks to Kafka.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from wsnmom.core.adapter import HEADER_TOPIC_NAMESPACE, HEADER_TOPIC_PATH, is_internal_namespace
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.escaping import is_ncname
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import KAFKA
from wsnmom.topic_mapping.translate import (
    FALLBACK_NAMESPACE,
    NamespaceRoots,
    derived_root,
    native_to_topic,
    topic_to_native,
)

from .config import KafkaSettings

__all__ = [
    "CONTENT_TYPE_HEADERS",
    "HEADER_CONTENT_TYPE",
    "UNMAPPED_NAMESPACE",
    "Destination",
    "KafkaMapping",
]

#: routing namespace of a record that has no representable topic (internal, so nobody
#: receives it unless they name it; the engine still advances past it)
UNMAPPED_NAMESPACE = "urn:wsnmom:internal:unmapped"
#: record header carrying the body's media type (also read: Content-Type, contentType)
HEADER_CONTENT_TYPE = "content-type"
CONTENT_TYPE_HEADERS = (HEADER_CONTENT_TYPE, "Content-Type", "contentType")
_CACHE_LIMIT = 100_000
#: longest legal Kafka topic name
_MAX_NAME = KAFKA.max_length or 249


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a WS topic's records go: the Kafka topic and the record key."""

    log: str
    key: bytes | None
    #: True for a per-path log (one WS topic per Kafka topic)
    per_path: bool


def _path_text(path: tuple[str, ...]) -> str:
    return "/".join(path)


def _parse_path(text: str) -> tuple[str, ...] | None:
    segments = tuple(text.split("/"))
    return segments if all(is_ncname(s) for s in segments) else None


class KafkaMapping:
    """Topic <-> Kafka topic and key for one adapter's settings.  Thread-safe."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.prefix = settings.topic_prefix
        self.internal_topic = settings.internal_topic
        self.default_mode = settings.mode
        default_path = _parse_path(settings.default_path)
        if default_path is None:
            raise ValueError(f"default_path {settings.default_path!r} is not a topic path")
        self.default_path = default_path
        self._namespaces = dict(settings.namespaces)
        roots: dict[str, str] = {}
        #: per-namespace log name -> namespace (configured and seen)
        self._shared: dict[str, str] = {}
        for namespace, cfg in self._namespaces.items():
            if cfg.mode == "path" and cfg.root is not None:
                roots[namespace] = cfg.root
            elif cfg.mode == "namespace":
                log = cfg.topic or self._full(cfg.root or derived_root(namespace))
                if log in self._shared or log == self.internal_topic:
                    raise ValueError(f"Kafka topic {log!r} is configured twice")
                self._shared[log] = namespace
        self.roots = NamespaceRoots.for_syntax(roots, KAFKA)
        self._lock = threading.Lock()
        self._log_topics: dict[str, Topic] = {}
        self._destinations: dict[Topic, Destination] = {}

    # -- names ------------------------------------------------------------------------------
    def _full(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def _mode(self, namespace: str) -> str:
        cfg = self._namespaces.get(namespace)
        return cfg.mode if cfg is not None else self.default_mode

    def shared_log(self, namespace: str) -> str | None:
        """The per-namespace log of ``namespace``, None when it is stored per path."""
        if is_internal_namespace(namespace):
            return self.internal_topic
        if self._mode(namespace) != "namespace":
            return None
        cfg = self._namespaces.get(namespace)
        if cfg is not None and cfg.topic is not None:
            return cfg.topic
        log = self._full(cfg.root if cfg is not None and cfg.root else derived_root(namespace))
        with self._lock:
            self._shared.setdefault(log, namespace)
        return log

    def destination(self, topic: Topic) -> Destination:
        """Where records on ``topic`` go; NameNotRepresentable when ``topic`` has no legal
        Kafka name (too long)."""
        found = self._destinations.get(topic)
        if found is not None:
            return found
        namespace = topic.namespace
        if is_internal_namespace(namespace):
            dest = Destination(self.internal_topic, str(topic).encode(), per_path=False)
        else:
            shared = self.shared_log(namespace)
            if shared is not None:
                dest = Destination(shared, _path_text(topic.path).encode(), per_path=False)
            else:
                name = self._full(topic_to_native(topic, KAFKA, self.roots).name)
                if len(name) > _MAX_NAME:
                    raise NameNotRepresentable(
                        f"the Kafka topic of {topic} would have {len(name)} characters "
                        f"(at most {_MAX_NAME})"
                    )
                dest = Destination(name, _path_text(topic.path).encode(), per_path=True)
                with self._lock:
                    self._log_topics.setdefault(name, topic)
        with self._lock:
            if len(self._destinations) >= _CACHE_LIMIT:
                self._destinations.clear()
            self._destinations[topic] = dest
        return dest

    def register(self, namespace: str) -> None:
        """Make records of ``namespace``'s logs map back to it (derived roots are only
        known once used)."""
        if is_internal_namespace(namespace) or namespace.startswith(FALLBACK_NAMESPACE):
            return
        if self.shared_log(namespace) is not None:
            return
        if self.roots.namespace_for_root(self.roots.root_for(namespace)) != namespace:
            return  # a fallback root, or a collision topic_mapping reports on use
        with self._lock:
            # logs mapped to the fallback namespace before may lie under the new root
            self._log_topics = {
                k: v for k, v in self._log_topics.items() if v.namespace != FALLBACK_NAMESPACE
            }

    # -- following --------------------------------------------------------------------------
    def follows(self, log: str) -> bool:
        """Whether the gateway reads Kafka topic ``log``."""
        if log == self.internal_topic or log in self._shared:
            return True
        if self.prefix:
            return log.startswith(self.prefix + ".")
        return not log.startswith("_")

    def shared_logs(self) -> list[str]:
        """The per-namespace logs known (configured and seen) and the internal log."""
        with self._lock:
            return sorted({self.internal_topic, *self._shared})

    def is_shared(self, log: str) -> bool:
        """Whether ``log`` is a per-namespace or the internal log."""
        return log == self.internal_topic or log in self._shared

    # -- records -> topics ------------------------------------------------------------------
    def cached_log_topic(self, log: str) -> Topic | None:
        """The WS topic of per-path log ``log`` when it is known already (no record needs
        to be looked at), else None (shared, internal or not seen yet)."""
        if log == self.internal_topic or log in self._shared:
            return None
        return self._log_topics.get(log)

    def log_topic(self, log: str, headers: Mapping[str, str] | None = None) -> Topic:
        """The WS topic of per-path log ``log``.  A record's own topic headers settle which
        namespace a derived root belongs to when this process has not seen it yet."""
        topic = self._log_topics.get(log)
        if topic is not None:
            return topic
        topic = None
        if headers:
            ns = headers.get(HEADER_TOPIC_NAMESPACE)
            path = headers.get(HEADER_TOPIC_PATH)
            segments = _parse_path(path) if path else None
            if ns and segments and not is_internal_namespace(ns):
                candidate = Topic(ns, segments)
                try:
                    if self.destination(candidate).log == log:
                        topic = candidate
                except NameNotRepresentable:
                    topic = None
        if topic is None:
            rest = log[len(self.prefix) + 1 :] if self.prefix else log
            try:
                topic = native_to_topic(None, rest, KAFKA, self.roots)
            except (NameNotRepresentable, ValueError):
                topic = Topic(UNMAPPED_NAMESPACE, ("_x_",))
        with self._lock:
            if len(self._log_topics) >= _CACHE_LIMIT:
                self._log_topics.clear()
            self._log_topics[log] = topic
        return topic

    def record_topic(self, log: str, key: bytes | None, headers: Mapping[str, str]) -> Topic:
        """The routing topic of a record of ``log`` with ``key`` and ``headers``."""
        if log == self.internal_topic:
            if key:
                text = key.decode("utf-8", "replace")
                if text.startswith("{") and "}" in text:
                    ns, _, path = text[1:].partition("}")
                    segments = _parse_path(path)
                    if segments is not None and is_internal_namespace(ns):
                        return Topic(ns, segments)
            return Topic(UNMAPPED_NAMESPACE, ("_x_",))
        namespace = self._shared.get(log)
        if namespace is not None:
            # the key first: the gateway keys by the routing path, while its topic headers
            # may name the topic a message was first published on
            segments = _parse_path(key.decode("utf-8", "replace")) if key else None
            if segments is None:
                header = headers.get(HEADER_TOPIC_PATH)
                segments = _parse_path(header) if header else None
            return Topic(namespace, segments or self.default_path)
        return self.log_topic(log, headers)

    # -- subscriptions ----------------------------------------------------------------------
    def may_carry(self, log: str, patterns: tuple[PathPattern, ...] | None) -> bool:
        """Whether ``log`` can hold a record matching ``patterns`` (None: every
        non-internal topic).  Exact for per-path logs; per namespace for shared ones."""
        if log == self.internal_topic:
            return patterns is not None and any(
                is_internal_namespace(p.namespace) for p in patterns
            )
        namespace = self._shared.get(log)
        if namespace is not None:
            return patterns is None or any(p.namespace == namespace for p in patterns)
        if not self.follows(log):
            return False
        if patterns is None:
            return True
        topic = self.log_topic(log)
        return any(p.matches(topic) for p in patterns)
