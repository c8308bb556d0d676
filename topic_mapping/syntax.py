"""Native topic syntaxes: how a middleware spells a topic name and its wildcards.

A :class:`WildcardSyntax` is a declarative description that the translation functions in
:mod:`wsnmom.topic_mapping.translate` and :mod:`wsnmom.topic_mapping.escaping` compile
against.  Adapters put one in their ``Capabilities``; the three built-in middleware
families have ready-made instances (:data:`RABBITMQ`, :data:`MQTT`, :data:`KAFKA`) and a
third-party adapter can declare its own, e.g. for NATS (``.``, ``*``, ``>`` where ``>``
needs at least one level)::

    NATS = WildcardSyntax(
        name="nats", separator=".", single_level="*", multi_level=">",
        multi_level_mid_path=False, multi_level_matches_parent=False,
        allowed_char=lambda ch: ch not in " \\t\\r\\n\\x00", max_length=None,
    )

Vocabulary used throughout topic_mapping:

* a **level** (or *word*) is the text between two separators of a native name;
* a **root** is the sequence of leading levels that stands for a topic namespace (for
  RabbitMQ the exchange name, which is not part of the routing key);
* a **pattern** is a native subscription: a binding key, an MQTT topic filter or, for
  regex syntaxes such as Kafka, a regular expression over whole names.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from .errors import NameNotRepresentable

#: characters an escape sequence ``_xHHHH_`` is made of; every syntax must carry them
ESCAPE_ALPHABET: Final = frozenset("_x" + string.digits + "ABCDEF")


@dataclass(frozen=True, slots=True)
class WildcardSyntax:
    """A middleware's native topic-name and subscription-pattern syntax.

    Lengths are checked on whole native names and patterns (for syntaxes where the root is
    not part of the name, e.g. RabbitMQ, only the routing/binding key is counted).
    """

    #: short identifier (also used by the CLI's ``--to``)
    name: str
    #: text between two levels of a native name (one character for regex syntaxes)
    separator: str
    #: the token that matches exactly one level in a pattern, or None if there is none
    single_level: str | None
    #: the token that matches several levels in a pattern, or None if there is none
    multi_level: str | None
    #: the multi-level token may appear before the last level (RabbitMQ ``a.#.b``)
    multi_level_mid_path: bool
    #: ``a<sep><multi>`` also matches ``a`` itself, i.e. the token means *zero* or more
    #: levels (RabbitMQ ``#``, MQTT ``#``); False means *one* or more (NATS ``>``)
    multi_level_matches_parent: bool
    #: whether a character may appear literally inside a level (the separator and the
    #: wildcard tokens are handled separately and need not be excluded here)
    allowed_char: Callable[[str], bool]
    #: longest native name or pattern, None for no limit
    max_length: int | None
    #: ``max_length`` counts UTF-8 bytes ("bytes") or code points ("chars")
    length_unit: Literal["bytes", "chars"] = "bytes"
    #: patterns are regular expressions over whole names (Kafka pattern subscriptions)
    regex: bool = False
    #: the root levels are part of the native name (MQTT, Kafka); False when the root is
    #: carried separately (RabbitMQ: root = exchange, name = routing key)
    root_in_name: bool = True
    #: a native name must not start with this text (MQTT: ``$`` names are system topics)
    reserved_prefix: str | None = None
    #: whole native names that are illegal (Kafka: ``.`` and ``..``)
    reserved_names: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.separator:
            raise ValueError("a syntax needs a non-empty separator")
        if self.regex and len(self.separator) != 1:
            raise ValueError("a regex syntax needs a one-character separator")
        tokens = [t for t in (self.single_level, self.multi_level) if t is not None]
        if any(not t for t in tokens):
            raise ValueError("wildcard tokens must not be empty")
        if self.single_level is not None and self.single_level == self.multi_level:
            raise ValueError("single- and multi-level wildcards must differ")
        reserved = set(self.separator).union(*tokens)
        clash = reserved & ESCAPE_ALPHABET
        if clash:
            raise ValueError(
                f"separator and wildcard tokens must not use escape characters {sorted(clash)}"
            )
        missing = sorted(ch for ch in ESCAPE_ALPHABET if not self.allowed_char(ch))
        if missing:
            raise ValueError(f"syntax {self.name!r} cannot carry escape characters {missing}")

    @property
    def wildcard_tokens(self) -> tuple[str, ...]:
        """The pattern wildcard tokens this syntax has."""
        return tuple(t for t in (self.single_level, self.multi_level) if t is not None)

    def must_escape(self, ch: str) -> bool:
        """Whether ``ch`` cannot appear literally inside a level."""
        return ch in self.separator or not self.allowed_char(ch)

    def length(self, text: str) -> int:
        """Length of ``text`` in this syntax's unit."""
        if self.length_unit == "bytes":
            return len(text.encode("utf-8", "surrogatepass"))
        return len(text)

    def check_length(self, text: str, what: str = "name") -> None:
        """Raise NameNotRepresentable when ``text`` exceeds ``max_length``."""
        if self.max_length is not None:
            size = self.length(text)
            if size > self.max_length:
                raise NameNotRepresentable(
                    f"{self.name} {what} is {size} {self.length_unit} long, "
                    f"the limit is {self.max_length}: {text[:80]!r}..."
                )

    def is_plain_level(self, level: str) -> bool:
        """True when ``level`` can be written as a non-empty level without any escaping and is
        not a wildcard token (what configured roots must look like)."""
        return (
            bool(level)
            and level not in self.wildcard_tokens
            and not any(self.must_escape(ch) for ch in level)
        )


def _is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def _rabbitmq_char(ch: str) -> bool:
    # A routing key is an AMQP short string: any UTF-8 text.  Lone surrogates have no
    # UTF-8 form; NUL is allowed by AMQP but escaped to keep keys printable and C-safe.
    return ch != "\x00" and not _is_surrogate(ch)


def _mqtt_char(ch: str) -> bool:
    # MQTT 3.1.1 / 5.0: a topic name is UTF-8 without U+0000 and without surrogates; '+'
    # and '#' are only legal in filters, so they are never allowed inside a name level.
    return ch not in "+#\x00" and not _is_surrogate(ch)


_KAFKA_CHARS: Final = frozenset(string.ascii_letters + string.digits + "._-")


def _kafka_char(ch: str) -> bool:
    return ch in _KAFKA_CHARS


#: RabbitMQ topic exchanges: root = exchange name, name = routing key of '.'-separated
#: words; binding keys use ``*`` (one word) and ``#`` (zero or more words) anywhere.
RABBITMQ: Final = WildcardSyntax(
    name="rabbitmq",
    separator=".",
    single_level="*",
    multi_level="#",
    multi_level_mid_path=True,
    multi_level_matches_parent=True,
    allowed_char=_rabbitmq_char,
    max_length=255,
    length_unit="bytes",
    root_in_name=False,
)

#: MQTT 3.1.1 / 5.0 topic names and filters: ``+`` one level, ``#`` only as the last level
#: (and it also matches the parent); names never start with ``$``.
MQTT: Final = WildcardSyntax(
    name="mqtt",
    separator="/",
    single_level="+",
    multi_level="#",
    multi_level_mid_path=False,
    multi_level_matches_parent=True,
    allowed_char=_mqtt_char,
    max_length=65535,
    length_unit="bytes",
    reserved_prefix="$",
)

#: Kafka: one Kafka topic per WS topic, named from ``[a-zA-Z0-9._-]`` with '.' between
#: levels; subscriptions are anchored regular expressions over topic names.
KAFKA: Final = WildcardSyntax(
    name="kafka",
    separator=".",
    single_level=None,
    multi_level=None,
    multi_level_mid_path=False,
    multi_level_matches_parent=False,
    allowed_char=_kafka_char,
    max_length=249,
    length_unit="chars",
    regex=True,
    reserved_names=frozenset({".", ".."}),
)

#: the built-in syntaxes by name
BUILTIN_SYNTAXES: Final[dict[str, WildcardSyntax]] = {s.name: s for s in (RABBITMQ, MQTT, KAFKA)}
