"""Looking for new, vanished and re-created topics, off the head reader's thread.

The head reader follows every mapped stream and must notice topics created after it
started (every ``discovery_interval`` seconds, at once when the adapter created one) and
topics that were deleted and created again (their topic id changes; compared every
``topic_id_check_interval`` seconds and after every lost connection).  Both need a broker
round trip: a metadata request, and a DescribeTopics request when a topic is new or the ids
are due.  Made by the head thread itself, they stalled every record behind them -- 6 to 40
ms every two seconds on a loaded tansu, which showed in the delivery latency.  A
``Discovery`` thread makes them instead and leaves the newest result (``Look``) for the
head thread, which only compares it with what it follows and re-assigns its consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException
from wsnmom.core.adapter import AdapterError

from .clients import Health
from .config import KafkaSettings
from .topics import Topics

__all__ = ["Discovery", "Look"]

log = logging.getLogger("wsnmom.adapters.kafka")

#: how often the thread checks whether a connection was lost (an epoch change)
_EPOCH_CHECK = 0.2


@dataclass(frozen=True, slots=True)
class Look:
    """One look at the cluster: the topics (name -> partitions) and, when they were asked
    for, the topic ids of the followed ones (None: not asked this time, or the request
    failed), and when the listing was asked for (monotonic)."""

    listing: Mapping[str, int]
    ids: Mapping[str, str] | None
    taken: float = 0.0


class Discovery:
    """The thread that looks (see the module docstring).  ``take`` hands the newest look
    to the head thread once."""

    def __init__(
        self,
        topics: Topics,
        health: Health,
        settings: KafkaSettings,
        follows: Callable[[str], bool],
        known: set[str],
    ) -> None:
        self._topics = topics
        self._health = health
        self._settings = settings
        self._follows = follows
        #: followed topic names whose ids were last asked for
        self._known = set(known)
        self._epoch = health.epoch
        self._lock = threading.Lock()
        self._found: Look | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start looking (the first look is due after ``discovery_interval``)."""
        self._thread = threading.Thread(
            target=self._run, name="wsnmom-kafka-discovery", daemon=True
        )
        self._thread.start()

    def soon(self) -> None:
        """Look now (the adapter created a topic)."""
        self._wake.set()

    def take(self) -> Look | None:
        """The newest look not taken yet, if any."""
        with self._lock:
            found, self._found = self._found, None
        return found

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the thread (waits up to ``timeout`` for a look under way)."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=timeout)

    def _run(self) -> None:
        settings = self._settings
        now = time.monotonic()
        next_listing = now + settings.discovery_interval
        next_ids = now + settings.topic_id_check_interval
        while not self._stop.is_set():
            wait = min(_EPOCH_CHECK, max(0.0, next_listing - time.monotonic()))
            woken = self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            epoch = self._health.epoch
            check_ids = epoch != self._epoch or now >= next_ids
            if not (woken or check_ids or now >= next_listing):
                continue
            next_listing = now + settings.discovery_interval
            try:
                listing = self._topics.refresh()
            except AdapterError:
                continue
            names = {name for name in listing if self._follows(name)}
            ids: Mapping[str, str] | None = None
            if check_ids or names - self._known:
                try:
                    ids = self._topics.topic_ids(names)
                except KafkaException as exc:
                    log.debug("describing the followed topics failed: %s", exc)
                else:
                    self._epoch, self._known = epoch, names
                    next_ids = now + settings.topic_id_check_interval
            with self._lock:
                if ids is None and self._found is not None:
                    ids = self._found.ids  # an earlier look's ids the head has not seen
                self._found = Look(listing, ids, now)
