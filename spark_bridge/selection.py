"""Which notifications a Spark source selects: a WS-Topics expression (any dialect) with its
namespace prefixes, optionally a MessageContent XPath, compiled exactly as the gateway
compiles a subscription's filter (``wsnmom.core.filters``).

The sources use the compiled expression twice, as the gateway does: its patterns become the
native subscription (Kafka topics to read, RabbitMQ binding keys, MQTT topic filters), and
every record is checked again in process (the *residual* filter) after it was decoded with
``wsnmom.core.codec``, because native patterns may be wider than the expression and the
topic headers of a message are authoritative over its native routing name.

Everything here is plain data built from string options, so that it pickles into Spark
tasks; the compiled filter is rebuilt lazily in each process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsnmom.core.errors import WsnError
from wsnmom.core.filters import CompiledFilter, MessageContentFilter, compile_topic_filter
from wsnmom.core.model import ExpressionSource
from wsnmom.spark_bridge.options import get_bool
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, SIMPLE, XPATH
from wsnmom.topic_mapping.model import PathPattern
from wsnmom.topic_mapping.namespaces import load_topic_namespace
from wsnmom.topic_mapping.topic_set import TopicSet

__all__ = [
    "DIALECT_NAMES",
    "OPTION_NAMES",
    "Compiled",
    "Selection",
    "SelectionError",
    "parse_mapping",
]

#: the options of a selection (``Selection.from_options``), as the docs spell them
OPTION_NAMES = (
    "topic",
    "dialect",
    "namespaces",
    "topicNamespaces",
    "fixedTopicSet",
    "messageContent",
    "messageContentNamespaces",
)

#: short dialect names accepted besides the dialect URIs
DIALECT_NAMES = {"simple": SIMPLE, "concrete": CONCRETE, "full": FULL, "xpath": XPATH}


class SelectionError(ValueError):
    """A topic expression or MessageContent filter that cannot be used (the message says
    why, in the words of the WS-N fault the gateway would answer)."""


def parse_mapping(value: str | Mapping[str, str] | None, what: str) -> dict[str, str]:
    """A prefix -> URI mapping from a mapping, a JSON object, or ``p=uri,q=uri`` text."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SelectionError(f"{what} is not a JSON object: {exc}") from exc
        if not isinstance(data, dict):
            raise SelectionError(f"{what} must be a JSON object")
        return {str(k): str(v) for k, v in data.items()}
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        prefix, sep, uri = item.partition("=")
        if not sep or not uri.strip():
            raise SelectionError(f"{what}: {item.strip()!r} is not prefix=URI")
        out[prefix.strip()] = uri.strip()
    return out


@dataclass(frozen=True)
class Selection:
    """A source's filter as the user wrote it (see the module docstring).

    ``topic`` None selects every notification, as a subscription without a topic filter:
    every topic of every non-internal namespace, topicless notifications included.
    """

    topic: str | None = None
    dialect: str | None = None
    namespaces: Mapping[str, str] = field(default_factory=dict)
    #: TopicNamespace documents (the gateway's ``topic_namespaces``): aliases, XPath dialect
    topic_namespaces: tuple[str, ...] = ()
    fixed_topic_set: bool = False
    message_content: str | None = None
    message_content_namespaces: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Selection:
        """From Spark options (lower-case keys): ``topic``, ``dialect``, ``namespaces``,
        ``topicnamespaces``, ``fixedtopicset``, ``messagecontent``,
        ``messagecontentnamespaces``."""
        topic = options.get("topic") or None
        content = options.get("messagecontent") or None
        docs = options.get("topicnamespaces") or ""
        return cls(
            topic=topic,
            dialect=options.get("dialect") or None,
            namespaces=parse_mapping(options.get("namespaces"), "namespaces"),
            topic_namespaces=tuple(p.strip() for p in docs.split(",") if p.strip()),
            fixed_topic_set=get_bool(options, "fixedtopicset", False),
            message_content=content,
            message_content_namespaces=parse_mapping(
                options.get("messagecontentnamespaces"), "messageContentNamespaces"
            ),
        )

    def to_options(self) -> dict[str, str]:
        """The Spark options that give this selection back (``from_options``)."""
        out: dict[str, str] = {}
        if self.topic is not None:
            out["topic"] = self.topic
        if self.dialect is not None:
            out["dialect"] = self.dialect
        if self.namespaces:
            out["namespaces"] = json.dumps(dict(self.namespaces))
        if self.topic_namespaces:
            out["topicNamespaces"] = ",".join(self.topic_namespaces)
        if self.fixed_topic_set:
            out["fixedTopicSet"] = "true"
        if self.message_content is not None:
            out["messageContent"] = self.message_content
        if self.message_content_namespaces:
            out["messageContentNamespaces"] = json.dumps(dict(self.message_content_namespaces))
        return out

    def topic_set(self) -> TopicSet:
        """The topic set the expression is validated against (empty and open unless
        TopicNamespace documents are given)."""
        namespaces = []
        for path in self.topic_namespaces:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise SelectionError(f"cannot read topic namespace document {path}: {exc}") from exc
            namespaces.append(load_topic_namespace(data))
        return TopicSet(namespaces, fixed=self.fixed_topic_set)

    def compile(self) -> CompiledFilter:
        """The compiled filter; SelectionError for an expression the gateway would refuse."""
        dialect = self.dialect
        if dialect is not None:
            dialect = DIALECT_NAMES.get(dialect.strip().lower(), dialect.strip())
        try:
            topic = None
            if self.topic is not None:
                ns: dict[str | None, str] = {p: u for p, u in self.namespaces.items()}
                topic = compile_topic_filter(
                    ExpressionSource(dialect, self.topic, ns), self.topic_set()
                )
            content = None
            if self.message_content is not None:
                cns: dict[str | None, str] = {
                    p: u for p, u in self.message_content_namespaces.items()
                }
                content = MessageContentFilter(ExpressionSource(None, self.message_content, cns))
        except WsnError as exc:
            raise SelectionError(f"{type(exc).__name__}: {exc}") from exc
        return CompiledFilter(topic=topic, content=content)

    def describe(self) -> str:
        """Short human-readable form for log lines and errors."""
        if self.topic is None:
            text = "every topic"
        else:
            text = f"topic {self.topic!r}"
            if self.namespaces:
                text += " (" + ", ".join(f"{p}={u}" for p, u in self.namespaces.items()) + ")"
        if self.message_content is not None:
            text += f" and content {self.message_content!r}"
        return text


class Compiled:
    """A selection compiled once per process (``Selection.compile`` is not free)."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.filter = selection.compile()

    @property
    def patterns(self) -> tuple[PathPattern, ...] | None:
        """Native subscription patterns: None for every topic."""
        return self.filter.native_patterns

    def __getstate__(self) -> dict[str, Any]:
        return {"selection": self.selection}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.selection = state["selection"]
        self.filter = self.selection.compile()
