"""The position store of the ``adapters.logbase`` backend over confluent-kafka.

One consumer group per cursor, ``group_prefix + name``, with offsets and never a member,
written with ``AdminClient.alter_consumer_group_offsets`` (one request per cursor, all in
flight at once), so ``kafka-consumer-groups --describe`` shows each subscription's lag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from wsnmom.adapters.logbase.backend import SaveCut, StreamId
from wsnmom.core.adapter import AdapterError

from .clients import Health
from .closing import Closing
from .config import KafkaSettings

__all__ = ["KafkaPositionStore"]

log = logging.getLogger("wsnmom.adapters.kafka")

#: how often a save's wait serves its admin client's callbacks (``_wait``)
_TICK = 0.2
#: a request's connection was lost (``_DESTROY_BROKER``: a new client retired the
#: bootstrap broker handle the request waited on)
_DROPPED = (KafkaError._TRANSPORT, KafkaError._DESTROY_BROKER)


def _dropped(future: Future[Any]) -> bool:
    exc = future.exception()
    return isinstance(exc, KafkaException) and exc.args[0].code() in _DROPPED


def _timed_out(future: Future[Any]) -> bool:
    exc = future.exception()
    return isinstance(exc, KafkaException) and exc.args[0].code() == KafkaError._TIMED_OUT


class KafkaPositionStore:
    """``PositionStore``: one consumer group per cursor (see the module docstring).

    It has an admin client of its own.  librdkafka keeps a coordinator handle per group;
    after the broker was restarted, requests for a group the client used before may time
    out for good while new groups and new clients work (seen with librdkafka 2.x and a
    restarted broker).  So the store takes a new admin client after every lost connection
    (``Health.epoch``) before its next request.  A save's wait ends as soon as its
    connection is lost (``_wait``), and what was not answered is sent again on a new client
    once a probe asked for then was answered (``_answered_after_loss``: no spinning while
    the broker is down), within the save's 35 s; also while the adapter closes (within its
    deadline).  Reads (``load``, ``load_one``: at take-over and resume) wait and retry
    the same way.  tansu drops the connection at the first save of a group after its delete:
    most other saves waiting on it fail with it (the position of a subscription buried
    into its dead letters was lost that way at a restart, and the next process
    dead-lettered those messages again), but now and then one stays unanswered for its
    whole timeout, which held every position save for 30 s.  With several such groups in
    one save it drops once per group: at most one attempt per group and one more.  A
    request that timed out is not retried (the save's time is spent), but the next one
    goes out on a new client."""

    def __init__(
        self,
        admin_factory: Callable[[], AdminClient],
        settings: KafkaSettings,
        health: Health,
        closing: Closing | None = None,
    ) -> None:
        self._new_admin = admin_factory
        #: the adapter's close: its deadline ends every wait (adapters/kafka/closing.py)
        self._closing = closing or Closing()
        self._health = health
        self._epoch = health.epoch
        self._admin = admin_factory()
        self._prefix = settings.group_prefix
        self._timeout = 30.0

    def _renew(self, why: str) -> None:
        log.info("a new Kafka admin client for subscription positions: %s", why)
        self._epoch = self._health.epoch
        self._admin = self._new_admin()

    def _fresh(self) -> None:
        """A new admin client when connections were lost since the last one was made."""
        if self._health.epoch != self._epoch:
            self._renew("connections to the cluster were lost")

    def _group(self, name: str) -> str:
        return self._prefix + name

    def load(self) -> dict[str, dict[StreamId, int]]:
        """Every cursor group's offsets, by cursor name."""
        listed = self._ask(
            lambda admin, _: {"": admin.list_consumer_groups(request_timeout=self._timeout)},
            [""],
            "listing the cursor groups",
        )
        try:
            result = listed[""].result()
        except KafkaException as exc:
            raise AdapterError(f"listing the cursor groups failed: {exc}") from exc
        names = [
            g.group_id[len(self._prefix) :]
            for g in result.valid
            if g.group_id.startswith(self._prefix)
        ]
        answers = self._ask(self._list_offsets, names, "reading positions")
        out: dict[str, dict[StreamId, int]] = {}
        for name in names:
            try:
                partitions = answers[name].result().topic_partitions or []
            except KafkaException as exc:
                raise AdapterError(f"reading the positions of {name} failed: {exc}") from exc
            out[name] = {(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0}
        return out

    def load_one(self, name: str) -> dict[StreamId, int] | None:
        """One cursor group's offsets (None: the group has none)."""
        future = self._ask(self._list_offsets, [name], f"reading the positions of {name}")[name]
        try:
            partitions = future.result().topic_partitions or []
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return None
            raise AdapterError(f"reading the positions of {name} failed: {exc}") from exc
        found = {(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0}
        return found or None

    def _list_offsets(self, admin: AdminClient, names: list[str]) -> dict[str, Future[Any]]:
        """One offsets request per cursor group, all in flight at once."""
        return {
            name: admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self._group(name))], request_timeout=self._timeout
            )[self._group(name)]
            for name in names
        }

    def _ask(
        self,
        send: Callable[[AdminClient, list[str]], Mapping[str, Future[Any]]],
        keys: list[str],
        what: str,
    ) -> dict[str, Future[Any]]:
        """Send the read requests ``send(admin, keys)`` makes and wait for them as a save
        waits (``_wait``): those whose connection was lost are sent once more on a new
        client once the cluster answered a probe.  The answered futures by key (a
        broker's error answer included); AdapterError when some were not answered within
        the request timeout and 5 s, or the close cut the wait short.  Before, a read at
        take-over or resume waited on the first client for up to librdkafka's 30 s."""
        before_close = not self._closing.begun
        self._fresh()
        deadline = time.monotonic() + self._timeout + 5.0
        answered: dict[str, Future[Any]] = {}
        left = list(keys)
        for again in (False, True):
            epoch = self._health.epoch
            futures = send(self._admin, left)
            done, lost = self._wait(list(futures.values()), epoch, deadline, before_close)
            lost = lost or any(_dropped(f) for f in done)
            answered.update((k, f) for k, f in futures.items() if f in done and not _dropped(f))
            left = [k for k in left if k not in answered]
            if not left or again or not lost:
                break
            if not self._answered_after_loss(deadline, before_close):
                break
            self._renew("a connection dropped")
        self._admin.poll(0)  # its queued log lines and errors
        if left or any(_timed_out(f) for f in answered.values()):
            self._renew("a request did not end in time")  # for the next request
        if left:
            raise AdapterError(f"{what}: {len(left)} request(s) got no answer in time")
        return answered

    def save(self, changes: Mapping[str, Mapping[StreamId, int]]) -> None:
        """Write these cursors' offsets (other streams of each group are kept); raises
        ``SaveCut`` when the close began during a save begun before it."""
        before_close = not self._closing.begun
        self._fresh()
        deadline = time.monotonic() + self._timeout + 5.0
        retry = self._save(changes, deadline, before_close)
        # Each group deleted before drops the connection at its first commit, and the saves
        # in flight with it, landed or not depending on the order the broker took them:
        # every attempt either lands some or spends one group's first commit (which lands
        # the next time), so at most one attempt per group and one more
        attempts = len(changes)
        while retry and attempts > 0 and not self._final(retry, before_close):
            attempts -= 1
            if not self._answered_after_loss(deadline, before_close):
                break
            self._renew("a connection dropped")
            retry = self._save({n: changes[n] for n in retry}, deadline, before_close)
        if "timed out" in retry.values():
            # not retried (the deadline is spent, or the close cut the wait short and
            # saves again itself), but the next request goes out on a new client
            self._renew("a request did not end in time")
        self._admin.poll(0)  # its queued log lines and errors
        if retry and before_close and self._closing.begun:
            raise SaveCut(f"the close cut the save of {len(retry)} cursor(s) short")
        if retry:
            problems = sorted(f"{name}: {why}" for name, why in retry.items())
            raise AdapterError(
                f"saving positions failed for {len(retry)} cursor(s): " + "; ".join(problems[:5])
            )

    def _final(self, retry: Mapping[str, str], before_close: bool) -> bool:
        """Whether a save with these failures is not tried again: a request timed out (the
        save's time is spent), the close began after the save did (it saves again
        itself), or the close's deadline has passed."""
        return (
            "timed out" in retry.values()
            or (before_close and self._closing.begun)
            or self._closing.remaining(1.0) <= 0
        )

    def _answered_after_loss(self, deadline: float, before_close: bool) -> bool:
        """After a lost connection: wait until the cluster answered a probe asked for now,
        so that a retry while the broker is still down neither spins nor spends its
        attempts; False when the save's time ran out (or the close cut it) first."""
        lost = time.monotonic()
        self._health.poke()
        while True:
            left = self._closing.remaining(deadline - time.monotonic())
            if self._health.wait_answered(lost, min(_TICK, left)):
                return True
            if left <= 0 or (before_close and self._closing.begun):
                return False

    def _save(
        self, changes: Mapping[str, Mapping[StreamId, int]], deadline: float, before_close: bool
    ) -> dict[str, str]:
        """Write; the names whose request timed out or lost its connection, with which
        (worth a retry with a new client; other failures raise)."""
        epoch = self._health.epoch
        futures = []
        for name, positions in changes.items():
            tps = [TopicPartition(s[0], s[1], o) for s, o in positions.items() if o >= 0]
            if not tps:
                continue
            group = self._group(name)
            request = [ConsumerGroupTopicPartitions(group, tps)]
            futures.append(
                (
                    name,
                    self._admin.alter_consumer_group_offsets(
                        request, request_timeout=self._timeout
                    )[group],
                )
            )
        done, lost = self._wait([f for _, f in futures], epoch, deadline, before_close)
        failed: list[str] = []
        retry: dict[str, str] = {}
        for name, future in futures:
            if future not in done:
                retry[name] = "connection dropped" if lost else "timed out"
                continue
            try:
                result = future.result()
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError._TIMED_OUT:
                    retry[name] = "timed out"
                elif code in _DROPPED:
                    retry[name] = "connection dropped"
                else:
                    failed.append(f"{name}: {exc}")
                continue
            for tp in result.topic_partitions or []:
                if tp.error is None:
                    continue
                if tp.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    # the topic is gone (deleted, or the broker restarted empty): a
                    # position in it means nothing any more
                    log.debug("not saving %s's position in vanished %s", name, tp.topic)
                    continue
                failed.append(f"{name} {tp.topic}[{tp.partition}]: {tp.error}")
        if failed:
            raise AdapterError("saving positions failed: " + "; ".join(failed[:5]))
        return retry

    def _wait(
        self,
        futures: list[Future[Any]],
        epoch: int,
        deadline: float,
        before_close: bool,
    ) -> tuple[set[Future[Any]], bool]:
        """Wait until every request is answered, the connection they went out on is lost,
        ``deadline`` passes, or the close ends the wait; the futures done by then, and
        whether the connection was lost.  A lost connection is one request failing with
        it, or ``Health.epoch`` moving: tansu leaves the other requests of a connection it
        dropped unanswered for their whole timeout (30 s of stalled saves), and after a
        broker restart an old client's requests may stay unanswered too.  The client's
        error callbacks, which move the epoch, come only through its ``poll``."""
        while True:
            left = max(0.0, min(_TICK, deadline - time.monotonic()))
            done = self._closing.wait(futures, left)
            self._admin.poll(0)
            if len(done) == len(futures):
                return done, False
            if self._health.epoch != epoch or any(_dropped(f) for f in done):
                return done, True
            if (
                time.monotonic() >= deadline
                or self._closing.remaining(1.0) <= 0
                or (before_close and self._closing.begun)
            ):
                return done, False

    def delete(self, names: Iterable[str]) -> None:
        """Delete these cursors' groups; unknown ones are ignored.  A delete whose request
        timed out or lost its connection is tried once more on a new client (not once the
        close began)."""
        before_close = not self._closing.begun
        groups = [self._group(n) for n in names]
        self._fresh()
        deadline = time.monotonic() + self._timeout + 5.0
        left = self._delete(groups, deadline, before_close)
        if left and not self._closing.begun and self._answered_after_loss(deadline, before_close):
            self._renew("a request did not end")
            left = self._delete(left, deadline, before_close)
        if left:
            self._renew("a request did not end")  # for the next request
            raise AdapterError(f"deleting {len(left)} cursor group(s) did not end in time")

    def _delete(self, groups: list[str], deadline: float, before_close: bool) -> list[str]:
        """Delete; the groups whose request timed out or lost its connection (other
        failures raise)."""
        left: list[str] = []
        for start in range(0, len(groups), 500):
            chunk = groups[start : start + 500]
            epoch = self._health.epoch
            futures = self._admin.delete_consumer_groups(chunk, request_timeout=self._timeout)
            done, _ = self._wait(list(futures.values()), epoch, deadline, before_close)
            for group, future in futures.items():
                if future not in done:
                    left.append(group)
                    continue
                try:
                    future.result()
                except KafkaException as exc:
                    code = exc.args[0].code()
                    if code == KafkaError._TIMED_OUT or code in _DROPPED:
                        left.append(group)
                    elif code not in (KafkaError.GROUP_ID_NOT_FOUND, KafkaError.NON_EMPTY_GROUP):
                        raise AdapterError(f"deleting group {group} failed: {exc}") from exc
        return left
