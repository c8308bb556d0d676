"""Where WS topics live on RabbitMQ, and which WS topic a delivered AMQP message is on.

A topic namespace is a topic exchange (configured in ``exchanges``, else derived by
``topic_mapping``), the escaped topic path is the routing key, and topic patterns are
binding keys; "everything" is the binding ``#`` on the catch-all exchange.  The adapter
and the Spark bridge's RabbitMQ tap both use this class, so a queue the bridge binds sees
exactly what a WS-N subscription with the same filter sees.

Pure code (no pika): :func:`headers_of` reads the headers table of any object with a
``headers`` attribute (pika's ``BasicProperties``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from wsnmom.core.adapter import HEADER_TOPIC_NAMESPACE
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import RABBITMQ
from wsnmom.topic_mapping.translate import (
    NamespaceRoots,
    derived_root,
    native_to_topic,
    topic_to_native,
    translate,
)

__all__ = ["DEFAULT_ALL_EXCHANGE", "Binding", "RabbitMQNames", "headers_of"]

#: the catch-all exchange every namespace exchange the gateway uses is bound to
DEFAULT_ALL_EXCHANGE = "wsnmom.all"
#: entries kept in the (exchange, routing key) -> topic memo
_CACHE_SIZE = 10000

Binding = tuple[str, str]  # (exchange, binding key)


def _header_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str | int | float | bool):
        return str(value)
    return None


def headers_of(properties: Any) -> dict[str, str]:
    """The AMQP headers of ``properties`` as strings (values of other types dropped)."""
    raw = getattr(properties, "headers", None) or {}
    if all(type(key) is str and type(value) is str for key, value in raw.items()):
        return raw if type(raw) is dict else dict(raw)  # the usual case: no copy
    out: dict[str, str] = {}
    for key, value in raw.items():
        text = _header_text(value)
        if text is not None:
            out[str(key)] = text
    return out


class RabbitMQNames:
    """Topic <-> (exchange, routing key) and patterns -> bindings.  Thread-safe."""

    def __init__(
        self, exchanges: Mapping[str, str], all_exchange: str = DEFAULT_ALL_EXCHANGE
    ) -> None:
        self.roots = NamespaceRoots.for_syntax(exchanges, RABBITMQ)
        self.all_exchange = all_exchange
        self._lock = threading.Lock()
        self._topics: dict[Binding, Topic] = {}

    def exchange_for(self, namespace: str) -> str:
        """Exchange of a topic namespace (configured or derived)."""
        return topic_to_native(Topic(namespace, ("x",)), RABBITMQ, self.roots).root

    def native_name(self, topic: Topic) -> tuple[str, str]:
        """(exchange, routing key) of ``topic``; NameNotRepresentable when it has none."""
        try:
            native = topic_to_native(topic, RABBITMQ, self.roots)
        except ValueError as exc:  # a path segment that is not an NCName
            raise NameNotRepresentable(f"{topic}: {exc}") from exc
        return native.root, native.name

    def bindings_for(self, patterns: Sequence[PathPattern] | None) -> list[Binding]:
        """(exchange, binding key) pairs for a subscription's patterns (None: everything,
        which is ``#`` on the catch-all exchange)."""
        if patterns is None:
            return [(self.all_exchange, "#")]
        translation = translate(patterns, RABBITMQ, self.roots)
        return [(p.root, p.pattern) for p in translation.patterns]

    def topic_of(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> Topic:
        """Topic of a delivered message, from its exchange and routing key.

        An exchange this process has not mapped yet because its name was derived from a
        namespace (after a gateway restart) is learnt from the ``wsnmom-topic-ns`` header
        when that namespace derives to exactly this exchange.  NameNotRepresentable for an
        empty routing key.
        """
        where = (exchange, routing_key)
        topic = self._topics.get(where)
        if topic is not None:
            return topic
        known = bool(exchange) and self.roots.namespace_for_root((exchange,)) is not None
        if exchange and not known:
            namespace = headers.get(HEADER_TOPIC_NAMESPACE)
            if namespace and derived_root(namespace) == exchange:
                with contextlib.suppress(NameNotRepresentable):
                    self.roots.register(namespace)
                    known = True
        topic = native_to_topic(exchange, routing_key, RABBITMQ, self.roots)
        if known:
            # the exchange's namespace is registered for good: the answer cannot change
            with self._lock:
                if len(self._topics) >= _CACHE_SIZE:
                    self._topics.clear()
                self._topics[where] = topic
        return topic
