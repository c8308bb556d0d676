"""What a notification from an upstream producer becomes before the relay
(:mod:`wsnmom.upstreams`) publishes it into the middleware.

A notification taken from a pull point (GetMessages, ONVIF PullMessages) becomes the
:class:`~wsnmom.core.model.InboundNotification` a Notify would have carried
(:func:`from_pull_point`); with the upstream's ``namespace`` set, its topic's prefix is
bound to that namespace instead of the producer's (:func:`renamespace`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lxml import etree

from wsnmom.core.model import ExpressionSource, InboundNotification

if TYPE_CHECKING:
    from wsnmom.client import Notification

__all__ = ["from_pull_point", "renamespace"]


def from_pull_point(notification: Notification) -> InboundNotification:
    """A notification taken from a pull point, as a Notify would have carried it."""
    topic = notification.topic
    source = (
        ExpressionSource(topic.dialect, topic.text, _prefixes(topic.namespaces))
        if topic is not None
        else None
    )
    return InboundNotification(payload=etree.tostring(notification.payload), topic=source)


def _prefixes(namespaces: Mapping[str, str]) -> dict[str | None, str]:
    return {prefix: uri for prefix, uri in namespaces.items()}


def renamespace(message: InboundNotification, namespace: str) -> InboundNotification:
    """The message with its topic's prefix bound to ``namespace`` (prefix and path kept);
    a topic in no namespace (no prefix) is left alone."""
    topic = message.topic
    if topic is None:
        return message
    prefix, sep, _ = topic.text.strip().partition(":")
    if not sep or "/" in prefix or prefix not in topic.namespaces:
        return message
    namespaces = {**topic.namespaces, prefix: namespace}
    return dataclasses.replace(
        message, topic=ExpressionSource(topic.dialect, topic.text, namespaces)
    )
