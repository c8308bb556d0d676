"""One topic set for a cluster (docs/scale-out.md, "One topic set").

Instances sharing a store are one broker, so a topic admitted to one instance's topic set
(a Notify's ad-hoc topic, a Subscribe's or a RegisterPublisher's concrete topic) belongs
to every instance's: the TopicSet resource property, ONVIF's GetEventProperties and
SetSynchronizationPoint answer the same through any of them.

:class:`SharedTopics` watches this instance's topic set (``TopicSet.watch``): a topic
admitted here for the first time is queued, and a thread of its own records the queue in
the store (``Store.record_topics``, one write for what queued meanwhile), so the request
that admitted it makes no store round trip and cannot fail because the store does not
answer.  A write that fails is logged and tried again, first after
:data:`RETRY_EVERY` seconds, the wait doubling up to :data:`RETRY_LONGEST`.  The
recording leaves a change (kind ``"topic"``, id ``store_documents.topic_key``) that the
other instances' follow threads take in (``core.follow``), and every instance takes in
every recorded topic at start (:meth:`SharedTopics.load`).  The delay is the writer's
round trip plus the follow thread's wake-up: well under a second on a healthy store.

With ``quotas.ad_hoc_topics`` (``limit``), the recording counts and inserts under one
lock in the store (``Store.record_topics(within=...)``), so the recorded topics never
exceed the bound, however many instances record at once.  Each instance's own admission
checks the bound against its topic set (``Guard.admit_topics``): the topics it recorded
and took in, plus those it admitted and has not recorded yet.  Instances admitting at once
can therefore each admit a topic the others' recordings leave no room for: it was
accepted (its message published), so it stays in that instance's topic set, is not
recorded (a warning, ``wsnmom_topics_not_recorded_total``), and the instance's topic set
is bounded by twice the limit at worst (its own admissions up to the limit, plus what it
takes in).

Only on a store other instances share (PostgreSQL), and only with a topic set that grows:
a fixed topic set (``fixed_topic_set``) never changes, and a single instance has nothing
to share.
"""

from __future__ import annotations

import logging
import threading

from wsnmom.core import metrics
from wsnmom.core.guard import refusals
from wsnmom.core.store import Store
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.topic_set import TopicSet

__all__ = ["RETRY_EVERY", "RETRY_LONGEST", "SharedTopics"]

log = logging.getLogger(__name__)

#: seconds until a failed recording is tried again; doubles up to RETRY_LONGEST
RETRY_EVERY = 2.0
RETRY_LONGEST = 60.0
#: seconds ``stop`` waits for the writer's last recording
STOP_WAIT = 1.0


class SharedTopics:
    """Records the topics admitted here and takes in those admitted elsewhere (see the
    module docstring)."""

    def __init__(self, store: Store, topic_set: TopicSet, *, limit: int | None = None) -> None:
        self._store = store
        self._topic_set = topic_set
        #: the most topics recorded (``quotas.ad_hoc_topics``; None: no bound)
        self._limit = limit
        #: admitted here, not recorded yet (in admission order)
        self._pending: dict[Topic, None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Topics admitted here and not recorded yet."""
        with self._lock:
            return len(self._pending)

    def start(self) -> None:
        """Take in every recorded topic and record from now on (idempotent).  A store
        that does not answer at start leaves the topics recorded before to the change
        log's following; the instance still starts."""
        if self._thread is not None or self._topic_set.fixed:
            return
        self._topic_set.watch(self.admitted)
        try:
            self.load()
        except Exception as exc:
            log.warning("the cluster's recorded topics could not be read: %s", exc)
        self._thread = threading.Thread(target=self._run, name="wsnmom-topics", daemon=True)
        self._thread.start()

    def load(self) -> int:
        """Take every recorded topic into the topic set; how many were new here."""
        return len(self._topic_set.take_in(self._store.list_topics()))

    def admitted(self, topic: Topic) -> None:
        """``TopicSet.watch``'s listener: queue ``topic`` for recording (no I/O)."""
        with self._lock:
            self._pending[topic] = None
        self._wake.set()

    def flush(self) -> bool:
        """Record what is queued; False (kept queued) when the store refused."""
        with self._lock:
            batch = list(self._pending)
        if not batch:
            return True
        try:
            refused = self._store.record_topics(batch, within=self._limit)
        except Exception as exc:
            log.warning(
                "recording %d topic(s) for the other instances failed (retried): %s",
                len(batch),
                exc,
            )
            return False
        with self._lock:
            for topic in batch:
                self._pending.pop(topic, None)
        if refused:
            metrics.TOPICS_NOT_RECORDED.inc(len(refused))
            refusals.warning(
                "topics:not-recorded",
                "%d topic(s) admitted here (%s first) are not recorded for the other "
                "instances: the cluster's topic set holds its maximum of %d "
                "(quotas.ad_hoc_topics)",
                len(refused),
                refused[0],
                self._limit,
            )
        return True

    def _run(self) -> None:
        wait = RETRY_EVERY
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self.flush():
                wait = RETRY_EVERY
                continue
            self._stop.wait(wait)
            wait = min(wait * 2, RETRY_LONGEST)
            self._wake.set()  # try again
        self.flush()  # what came before the stop

    def stop(self) -> None:
        """Stop recording (one last try for what is queued, within :data:`STOP_WAIT`)."""
        self._topic_set.watch(None)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
