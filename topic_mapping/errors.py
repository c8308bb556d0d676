"""Errors raised by the WS-Topics engine; the SOAP frontend maps each to its WS-N fault."""

from __future__ import annotations


class TopicError(ValueError):
    """Base class of every topic_mapping error."""


class TopicExpressionDialectUnknown(TopicError):
    """The Dialect URI is not one this engine knows (TopicExpressionDialectUnknownFault)."""


class InvalidTopicExpression(TopicError):
    """The expression does not parse in its dialect (InvalidTopicExpressionFault)."""


class MultipleTopicsSpecified(TopicError):
    """A single concrete topic was required but the expression selects several or has
    wildcards (MultipleTopicsSpecifiedFault, used by Notify and GetCurrentMessage)."""


class TopicNotSupported(TopicError):
    """The expression refers to topics the topic set does not permit (TopicNotSupportedFault)."""


class TopicSetFull(TopicNotSupported):
    """A new topic would grow the topic set beyond the bound its caller gave
    (``TopicSet.admit(limit=...)``); ``limit`` is that bound, ``topic`` the new topic
    refused (the first of several admitted together)."""

    def __init__(self, message: str, limit: int, topic: object = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.topic = topic


class NameNotRepresentable(TopicError):
    """A topic or pattern cannot be written in a middleware's native syntax (e.g. too long)."""


class InvalidTopicNamespace(TopicError):
    """A TopicNamespace / TopicSpace document is malformed (duplicate sibling names, missing
    targetNamespace, an alias with children, ...).  A configuration error, not a WS-N fault."""
