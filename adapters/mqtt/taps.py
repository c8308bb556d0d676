"""Taps: durable consumers of an MQTT session besides the subscriptions' queues.

A :class:`Tap` names topic patterns and a *sink*.  The session subscribes the filters of its
patterns next to those of the WS-N subscriptions (one disjoint filter set, so a tap costs no
second connection and no second copy of the traffic), and its worker hands the sink, batch
by batch and in arrival order, every message whose routing topic the patterns match, *before*
it acknowledges them to the broker (PUBACK): a message a tap has not stored is never
acknowledged.  A sink that fails is called again with the same batch (after
``_RETRY_DELAY``) until it succeeds; meanwhile the session stores and acknowledges nothing
more, and the broker keeps queueing for it.  A batch a sink stored but whose PUBACK was not
sent (a crash in between) comes again, with the MQTT DUP flag set: sinks deduplicate.

The session itself may have no queue store at all: then its taps are its only consumers
(the Spark bridge's standalone buffer ``wsnmom spark-buffer``, through
:class:`.standalone.TapSession`).  Inside a gateway an adapter option can add taps to the
gateway's session: ``spark_logs`` makes the Spark bridge's buffer logs taps.  Such options
are listed in :data:`TAP_PROVIDERS` with the object that turns their value into taps, named
rather than imported: the provider depends on this adapter's public surface
(:mod:`.public`), the adapter never on the provider.

Taps carry what the session made of a message: the MQTT topic name, the routing topic (the
adapter's mapping), the body, the MQTT 5 user properties as headers and the content type
(``wire.metadata``).  No WS-N here.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wsnmom.core.adapter import OutboundMessage, is_internal_namespace
from wsnmom.topic_mapping.model import PathPattern, Topic

__all__ = ["TAP_PROVIDERS", "Arrival", "Sink", "Tap", "TapProvider", "Taps", "tap_provider"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: seconds between two calls of a sink that failed
_RETRY_DELAY = 0.5


@dataclass(frozen=True, slots=True)
class Arrival:
    """One message the session received, as a tap sees it."""

    #: the MQTT topic name it was published on
    name: str
    #: routing topic, body, headers (MQTT 5 user properties) and content type; its
    #: ``message_id`` is the ``wsnmom-message-id`` header, or a new one when it has none
    message: OutboundMessage
    #: the broker sent it again (MQTT DUP flag): a sink may have stored it before
    redelivered: bool


Sink = Callable[[Sequence[Arrival]], None]


@dataclass(frozen=True)
class Tap:
    """A consumer of the session (see the module docstring).  ``patterns`` None: every
    topic but those of internal namespaces, as a subscription without a topic filter."""

    name: str
    patterns: tuple[PathPattern, ...] | None
    sink: Sink
    #: called on the session's worker thread when the session stops
    close: Callable[[], None] | None = None

    def wants(self, topic: Topic) -> bool:
        """Whether a message with routing topic ``topic`` goes to this tap."""
        if is_internal_namespace(topic.namespace):
            return False
        return self.patterns is None or any(p.matches(topic) for p in self.patterns)


class Taps:
    """The taps of one session, fed by its worker (one thread)."""

    #: filter-set names of taps start with this (WS-N subscriptions' names never do)
    PREFIX = "tap:"

    def __init__(self, taps: Sequence[Tap] = ()) -> None:
        names = [t.name for t in taps]
        if len(set(names)) != len(names):
            raise ValueError(f"two taps have the same name: {names}")
        self.taps = tuple(taps)
        #: messages handed to sinks (each tap counted) and failed sink calls
        self.delivered = 0
        self.failures = 0

    def __bool__(self) -> bool:
        return bool(self.taps)

    def key(self, tap: Tap) -> str:
        """The name the session's filter set knows ``tap`` by."""
        return self.PREFIX + tap.name

    def deliver(self, arrivals: Sequence[Arrival], stopping: Callable[[], bool]) -> None:
        """Hand every tap its share of ``arrivals``; returns once each sink took it.  A
        sink that raises is retried; when ``stopping()`` says the session is going away
        the error is raised instead (nothing is acknowledged then)."""
        for tap in self.taps:
            verdicts: dict[Topic, bool] = {}
            mine: list[Arrival] = []
            for a in arrivals:
                topic = a.message.topic
                verdict = verdicts.get(topic)
                if verdict is None:
                    verdict = verdicts[topic] = tap.wants(topic)
                if verdict:
                    mine.append(a)
            if not mine:
                continue
            attempt = 0
            while True:
                try:
                    tap.sink(mine)
                    self.delivered += len(mine)
                    break
                except Exception:
                    self.failures += 1
                    if stopping():
                        raise
                    if attempt == 0:
                        log.exception(
                            "MQTT session: tap %s failed to take %d messages; retrying "
                            "(nothing is acknowledged to the broker meanwhile)",
                            tap.name,
                            len(mine),
                        )
                    attempt += 1
                    time.sleep(_RETRY_DELAY)

    def close(self) -> None:
        """Close every tap (on the worker thread, when the session stops)."""
        for tap in self.taps:
            if tap.close is not None:
                try:
                    tap.close()
                except Exception:
                    log.exception("MQTT session: closing tap %s failed", tap.name)


class TapProvider(Protocol):
    """What an adapter option in :data:`TAP_PROVIDERS` names: it checks the option's value
    and makes the taps of it."""

    def check(self, value: Any) -> None:
        """Raise ValueError for a value the provider refuses; opens nothing."""

    def taps(self, value: Any) -> list[Tap]:
        """The taps ``value`` describes (ValueError for a value the provider refuses)."""


#: adapter options that add taps to a gateway's session -> the provider of those taps,
#: ``"module:object"`` (a :class:`TapProvider`), imported only when the option is given
TAP_PROVIDERS: Mapping[str, str] = {"spark_logs": "wsnmom.spark_bridge.buffer:LOG_TAPS"}


def tap_provider(option: str) -> TapProvider:
    """The provider of the taps of adapter option ``option`` (a key of
    :data:`TAP_PROVIDERS`)."""
    module, _, name = TAP_PROVIDERS[option].partition(":")
    provider: TapProvider = getattr(importlib.import_module(module), name)
    return provider
