"""Whether core's store still holds subscriptions whose sessions the broker lost, asked in
batches on a thread of their own (docs/scale-out.md, "MQTT in cluster mode").

A broker restarted without its state lost every session and record at once: each
subscription of a shard this instance gains then finds its session gone when its delivery
opens, and each deliverer's reconnect finds it gone too.  One store query per
subscription, one after another on the thread that opens the deliveries, held that thread
for seconds at a few thousand subscriptions.  :class:`StoreQuestions` gathers the
questions asked within :data:`GATHER` seconds and asks the store once for them all
(``Adapter.kept_in_store_many``; with only ``kept_in_store`` told, once per name, still
off the asker's thread).  The replies run on :data:`REPLY_AT_ONCE` threads of their own:
each is a few round trips to the broker (subscribe, or end the session).  A thread that
waits for its answer (:meth:`StoreQuestions.answer`, a restart's check) is told on the
questions' thread itself: queued behind a burst's replies, each waiting for the broker,
it could wait past its timeout and take "not known" for an answer the store gave.

An answer is True (the store holds the name), False (it does not: deleted), or None: not
known now (the store failed; logged).  None never means "gone": the asker keeps what it
made and asks again later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

__all__ = ["GATHER", "REPLY_AT_ONCE", "Answer", "StoreQuestions"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: seconds the questions of a burst are gathered before the store is asked
GATHER = 0.05
#: replies handled at once (each a few broker round trips)
REPLY_AT_ONCE = 8

#: True: the store holds it; False: it does not; None: not known now
Answer = bool | None
Reply = Callable[[Answer], None]


class StoreQuestions:
    """Core's store as the adapter asks it (see the module docstring).  ``stored`` and
    ``held``: core's singular and plural questions (``Adapter.kept_in_store``,
    ``kept_in_store_many``), None while not told."""

    def __init__(self) -> None:
        self.stored: Callable[[str], bool] | None = None
        self.held: Callable[[Collection[str]], set[str]] | None = None
        self._cond = threading.Condition()
        #: name -> the replies waiting for its answer (and whether each is told on the
        #: questions' thread: a waiting thread's, which only wakes it)
        self._asked: dict[str, list[tuple[Reply, bool]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._replies = ThreadPoolExecutor(REPLY_AT_ONCE, thread_name_prefix="wsnmom-mqtt-store")
        #: store queries made (tests, bench): one per batch with ``held``
        self.queries = 0

    @property
    def told(self) -> bool:
        """Whether core told how to ask its store."""
        return self.stored is not None or self.held is not None

    def ask(self, name: str, reply: Reply, *, at_once: bool = False) -> None:
        """Ask whether the store holds ``name``; ``reply(answer)`` is called on a reply
        thread once the batch is answered (None at once when closed); ``at_once``: on
        the questions' thread (a ``reply`` that only wakes a waiting thread)."""
        with self._cond:
            if not self._closed:
                self._asked.setdefault(name, []).append((reply, at_once))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="wsnmom-mqtt-questions", daemon=True
                    )
                    self._thread.start()
                self._cond.notify_all()
                return
        reply(None)

    def answer(self, name: str, timeout: float) -> Answer:
        """``ask``, waiting up to ``timeout`` seconds for the answer (None without one),
        for a thread that may wait (a handle's timer thread)."""
        got: list[Answer] = []
        done = threading.Event()

        def reply(answer: Answer) -> None:
            got.append(answer)
            done.set()

        self.ask(name, reply, at_once=True)
        return got[0] if done.wait(timeout) else None

    def close(self) -> None:
        """Stop asking: questions asked later, or not asked yet, are answered None."""
        with self._cond:
            self._closed = True
            left, self._asked = self._asked, {}
            self._cond.notify_all()
        for replies in left.values():
            for reply, _ in replies:
                reply(None)
        self._replies.shutdown(wait=False)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._asked) or self._closed)
                if self._closed:
                    return
                # the rest of a burst (a shard's deliveries opening on several threads)
                gathered = time.monotonic() + GATHER
                while not self._closed and (left := gathered - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch, self._asked = self._asked, {}
            answers = self._query(list(batch))
            for name, replies in batch.items():
                for reply, at_once in replies:
                    if at_once:
                        try:  # this thread must outlive any reply: later questions wait on it
                            reply(answers.get(name))
                        except Exception:
                            log.exception("a store question's reply failed")
                        continue
                    try:
                        self._replies.submit(reply, answers.get(name))
                    except RuntimeError:  # closed meanwhile
                        reply(None)

    def _query(self, names: list[str]) -> dict[str, Answer]:
        """The store's answers for ``names``: one query with ``held``, else one per name;
        None for the names it could not answer (logged)."""
        held, stored = self.held, self.stored
        if held is not None:
            self.queries += 1
            try:
                found = held(names)
            except Exception as exc:  # core's store: any failure means "not known now"
                log.warning(
                    "cannot ask the store whether %d subscriptions exist: %s", len(names), exc
                )
                return {}
            return {name: name in found for name in names}
        answers: dict[str, Answer] = {}
        for name in names:
            if stored is None:
                break
            self.queries += 1
            try:
                answers[name] = stored(name)
            except Exception as exc:  # as above
                log.warning("cannot ask the store whether %s still exists: %s", name, exc)
        return answers
