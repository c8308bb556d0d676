"""What a dead letter is (``core.dead_letters``): the names of its destinations (the
internal topic :func:`destination_topic`, the box's durable subscription :func:`box_name`,
the one rule :func:`check_destination`), why it was given up on (:data:`REASONS`), the
context headers it travels with (:data:`CONTEXT_HEADERS`), and the records:
:class:`DeadLetterContext` (what a sender says) and :class:`DeadLetter` (what operators see).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from wsnmom.core.adapter import INTERNAL_NAMESPACE_PREFIX
from wsnmom.topic_mapping.model import Topic

__all__ = [
    "CONTEXT_HEADERS",
    "DEAD_LETTER_NAMESPACE",
    "REASONS",
    "DeadLetter",
    "DeadLetterContext",
    "box_name",
    "check_destination",
    "destination_topic",
    "is_box_name",
]

DEAD_LETTER_NAMESPACE = INTERNAL_NAMESPACE_PREFIX + "dead-letters"
#: why a message became a dead letter
REASONS = (
    "retries-exhausted",
    "final-status",
    "filter-budget",
    "max-age",
    "overflow",
    "overflow-end",
)

H_ID = "wsnmom-dl-id"
H_SUBSCRIPTION = "wsnmom-dl-subscription"
H_CONSUMER = "wsnmom-dl-consumer"
H_REASON = "wsnmom-dl-reason"
H_ATTEMPTS = "wsnmom-dl-attempts"
H_ERROR = "wsnmom-dl-error"
H_TIME = "wsnmom-dl-time"
CONTEXT_HEADERS = (H_ID, H_SUBSCRIPTION, H_CONSUMER, H_REASON, H_ATTEMPTS, H_ERROR, H_TIME)
#: on an adapter's drop published through :meth:`DeadLetters.sink`: counted when
#: published, so no box counts it when it reads it
H_COUNTED = "wsnmom-dl-counted"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_destination(name: str) -> str:
    """``name`` when it can name a dead-letter destination; ValueError saying why not."""
    if not _NAME.match(name):
        raise ValueError(
            f"dead-letter destination {name!r} must be 1 to 64 letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def destination_topic(name: str) -> Topic:
    """The internal topic dead letters for destination ``name`` are published on."""
    return Topic(DEAD_LETTER_NAMESPACE, (name,))


def box_name(name: str) -> str:
    """The durable subscription that holds destination ``name``'s dead letters."""
    return f"wsnmom-dead-letters-{name}"


def is_box_name(name: str) -> bool:
    """Whether the durable subscription ``name`` is a dead-letter box (core's own, also
    one of a destination this instance does not know)."""
    return name.startswith(box_name(""))


@dataclass(frozen=True, slots=True)
class DeadLetterContext:
    """Why the messages handed to ``DeadLetters.send`` were given up on."""

    subscription_id: str
    consumer: str
    reason: str
    #: delivery attempts made (0: none, e.g. refused by a filter budget or max age)
    attempts: int
    last_error: str | None
    destination: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter as operators see it."""

    id: str
    destination: str
    subscription_id: str
    consumer: str
    reason: str
    attempts: int
    last_error: str | None
    #: when it was given up on (ISO 8601, UTC)
    time: str
    #: the original topic ("{namespace}path"), None without one
    topic: str | None
    message_id: str | None
    content_type: str
    body: bytes

    def summary(self) -> dict[str, Any]:
        """Everything but the body (a listing)."""
        return {
            "id": self.id,
            "destination": self.destination,
            "subscription": self.subscription_id,
            "consumer": self.consumer,
            "reason": self.reason,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "time": self.time,
            "topic": self.topic,
            "message_id": self.message_id,
            "content_type": self.content_type,
            "size": len(self.body),
        }
