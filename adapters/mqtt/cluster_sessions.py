"""The subscription sessions of the MQTT adapter in cluster mode (docs/scale-out.md, "MQTT
in cluster mode"): :class:`SubscriptionSessions` names each durable subscription's
persistent session, makes sure it exists with the subscription's filters and ends it;
core's handle on one session is :class:`~.cluster_handle.ClusterHandle`.

**Declaring without cutting the deliverer off.**  Connecting with a session's client id
cuts off whoever delivers it, so a declare first reads the session's *record*, a
retained message on ``<topic prefix>/wsnmom/sessions/<client id>`` naming the subscription
and the filters the session was given (``SubscriptionSessions.names`` lists them): when
they are the ones wanted (a re-attach), the declare connects nothing.  The record also
tells an instance that re-binds a subscription which filters to unsubscribe; a delete
clears it after ending the session.

**Dead-letter boxes** are this instance's own sessions (``own``); their records also name
the gateway instance that reads them (``#owner=``, the id core gave ``joined_as``), so that
the instance running periodic work can retire the boxes of instances that departed
(:mod:`.box_retire`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from wsnmom.core.adapter import AdapterError, AdapterUnavailable, OutboundMessage
from wsnmom.core.dead_letter_records import box_name
from wsnmom.topic_mapping.model import Topic

from .config import MqttSettings
from .hub import Hub
from .mapping import MqttMapping
from .publisher import Publisher
from .record_scan import retained_under
from .store_questions import StoreQuestions
from .sub_session import SessionConnection

__all__ = ["CLIENT_ID_HEAD", "MayDeliver", "Record", "SubscriptionSessions", "session_client_id"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: the client id of every subscription session starts with this
CLIENT_ID_HEAD = "wsnmom-s-"
#: the first line of a record, before the subscription's name
_NAME_LINE = "#name="
#: the line of a dead-letter box's record naming the gateway instance that reads it
_OWNER_LINE = "#owner="
#: the routing topic of a record (never routed: records are read as retained messages)
_RECORD = Topic("urn:wsnmom:internal:session-record", ("r",))

MayDeliver = Callable[[str], bool]

#: the names of dead-letter boxes (core reads one in every instance)
_BOX_HEAD = box_name("")


class Record(NamedTuple):
    """What a session's record says: the subscription's name (None in a record written
    before records named it), its filters, and for a dead-letter box the id of the gateway
    instance that reads it ("" when not known)."""

    name: str | None
    filters: frozenset[str]
    owner: str = ""


def session_client_id(topic_prefix: str, name: str) -> str:
    """The fixed client id of subscription ``name``'s session in the cluster of
    ``topic_prefix`` (28 characters, the same on every instance)."""
    digest = hashlib.blake2b(f"{topic_prefix}\x00{name}".encode(), digest_size=10).hexdigest()
    return CLIENT_ID_HEAD + digest


class SubscriptionSessions:
    """Names, declares and deletes the subscription sessions of one adapter (module
    docstring).  ``instance_id``: this instance's own client id, for the sessions that
    belong to it rather than to the cluster (dead-letter boxes: each instance reads its
    own, as single instances on one broker do).  ``publisher``: reads and writes the
    sessions' records (:meth:`record_topic`)."""

    def __init__(
        self,
        settings: MqttSettings,
        mapping: MqttMapping,
        instance_id: str,
        may_deliver: MayDeliver | None,
        publisher: Publisher | None = None,
        hub: Hub | None = None,
    ) -> None:
        self.settings = settings
        self.mapping = mapping
        self.publisher = publisher
        #: the one network thread of every session connection (without one given, a hub
        #: of its own)
        self.hub = hub if hub is not None else Hub("mqtt-sessions", tls=settings.tls)
        self.instance_id = instance_id
        self.may_deliver: MayDeliver = may_deliver or (lambda name: True)
        #: the gateway instance's id in the cluster (``Adapter.joined_as``), written in
        #: the records of its dead-letter boxes; "" while not known
        self.owner = ""
        #: core's answers whether the store still holds subscriptions
        #: (``Adapter.kept_in_store``, ``kept_in_store_many``); not told: a session gone
        #: with its record is taken as deleted
        self.questions = StoreQuestions()
        self._lock = threading.Lock()
        #: client id -> the filters this process subscribed in its session
        self._declared: dict[str, frozenset[str]] = {}

    def client_id(self, name: str) -> str:
        """The client id of subscription ``name``'s session."""
        if self.own(name):
            return session_client_id(self.instance_id, name)
        return session_client_id(self.settings.topic_prefix, name)

    def own(self, name: str) -> bool:
        """Whether ``name``'s session belongs to this instance alone (no fence)."""
        return name.startswith(_BOX_HEAD)

    def record_topic(self, client_id: str) -> str:
        """The MQTT topic whose retained message records the filters ``client_id``'s
        session was given (every instance reads it before it declares)."""
        return f"{self.mapping.record_head}{client_id}"

    def recorded(self, client_id: str) -> frozenset[str] | None:
        """The filters the session's record names, None without a record."""
        found = self.read_record(client_id)
        return None if found is None else found.filters

    def read_record(self, client_id: str) -> Record | None:
        """What the session's record says, None without a record."""
        if self.publisher is None:
            return None
        found = self.publisher.retained(
            self.record_topic(client_id), self.settings.subscribe_timeout
        )
        if found is None or not found.payload:
            return None
        return self.parse_record(client_id, found.payload)

    def parse_record(self, client_id: str, payload: bytes) -> Record | None:
        """The record ``payload`` of ``client_id``'s session, None when it is unreadable."""
        try:
            lines = payload.decode().split("\n")
        except UnicodeDecodeError:
            # not written by a gateway (any client allowed to publish under the topic
            # prefix can): no record, so the declare connects and writes one
            log.warning("the MQTT session record of %s is not readable: ignored", client_id)
            return None
        name: str | None = None
        owner = ""
        if lines and lines[0].startswith(_NAME_LINE):
            name = lines.pop(0)[len(_NAME_LINE) :]
            if lines and lines[0].startswith(_OWNER_LINE):
                owner = lines.pop(0)[len(_OWNER_LINE) :]
        return Record(name, frozenset(line for line in lines if line or name is None), owner)

    def names(self, timeout: float) -> list[str]:
        """The names of the subscriptions whose sessions have a record (read from the
        retained records under ``<prefix>/wsnmom/sessions/+`` by a short-lived clean
        session): every cluster subscription whose session a delete has not ended, and
        this instance's own dead-letter boxes.  A record whose name does not hash to its
        client id (another instance's box, or not written by a gateway) is not counted.
        AdapterUnavailable when the broker does not answer; AdapterError when a record
        names no subscription (written before records named one: the list would be
        incomplete until every instance re-attached its subscriptions)."""
        head = self.mapping.record_head
        found = retained_under(self.settings, self.instance_id, head + "+", timeout)
        names: list[str] = []
        for topic, payload in found.items():
            client_id = topic[len(head) :]
            if not client_id.startswith(CLIENT_ID_HEAD):
                continue
            record = self.parse_record(client_id, payload)
            if record is None:
                continue
            name = record.name
            if name is None:
                raise AdapterError(
                    f"the MQTT session record of {client_id} names no subscription "
                    "(written by an older version): the subscriptions cannot be listed"
                )
            if self.client_id(name) == client_id:
                names.append(name)
        return sorted(names)

    def _wanted(self, name: str) -> tuple[str, str]:
        """The name and owner a record of subscription ``name`` should say."""
        return name, self.owner if self.own(name) and self.owner else ""

    def record_again(
        self, conn: SessionConnection, client_id: str, filters: frozenset[str], name: str
    ) -> bool:
        """The first step of making subscription ``name``'s session again, found absent
        with its record (``conn``, connected, made it empty): write its record again and
        True; the caller then asks the store (``questions``) and, the answer "there",
        subscribes ``filters``; "gone", ends the session and clears the record; not known,
        keeps both and asks again later.  False, ``conn`` ended, when core did not tell
        how to ask its store (a session gone with its record is taken as deleted).

        Race-free against a delete through another instance because the record is
        written *before* the store is asked, and core deletes the store's record before
        it ends the session and clears its record (``Subscriptions.destroy``): when the
        store still holds the subscription after ``conn``'s CONNECT and this record, a
        delete after that answer ends the session and clears the record after them;
        when it does not, the delete came first and this session and record are undone
        by the caller.  Messages published while the broker had no session are lost
        (logged), as when a single instance subscribes its filters again."""
        if not self.questions.told:
            conn.end()
            return False
        try:
            self._record(client_id, filters, name)
        except AdapterError:
            conn.end()
            raise
        return True

    def write_record(self, client_id: str, filters: frozenset[str], name: str) -> None:
        """Write the record of ``name``'s session again: this instance's own box made
        again on the broker after another instance retired it (:mod:`.box_retire`), or a
        session made again after the broker lost it."""
        self._record(client_id, filters, name)

    def clear_record(self, client_id: str) -> None:
        """Clear ``client_id``'s record (its session was ended)."""
        self._record(client_id, frozenset())

    def _record(self, client_id: str, filters: frozenset[str], name: str | None = None) -> None:
        """Write (or with neither ``filters`` nor ``name``, clear) the session's record:
        the subscription's ``name`` on a first line of its own (no MQTT filter starts
        with ``#`` followed by more), for this instance's own box its ``owner`` on the
        next, then the filters, one a line."""
        if self.publisher is None:
            return
        lines = sorted(filters)
        if name is not None and "\n" not in name:
            if self.own(name) and self.owner:
                lines.insert(0, _OWNER_LINE + self.owner)
            lines.insert(0, _NAME_LINE + name)
        body = "\n".join(lines).encode()
        message = OutboundMessage(topic=_RECORD, body=body, message_id=client_id)
        self.publisher.publish_many(
            [(self.record_topic(client_id), message)],
            self.settings.subscribe_timeout,
            retain=True,
        )

    def declare(
        self,
        client_id: str,
        filters: frozenset[str],
        timeout: float,
        name: str | None = None,
        *,
        new: bool = False,
    ) -> None:
        """Make sure ``client_id``'s session (of subscription ``name``) exists with
        ``filters``.  When its record says so already (a re-attach: every instance
        re-attaches every subscription at start and when it follows a new one), nothing
        more: connecting would cut the deliverer off (a record that does not name the
        subscription yet is written again, naming it).  Otherwise write the record,
        connect, subscribe them, unsubscribe the filters the record (or this process) had
        and no longer wants, disconnect.  A take-over that cuts the declaring connection
        off (the deliverer reconnecting at the same moment) is retried until
        ``timeout``.  A ``new`` subscription (a Subscribe made its name a moment ago) has
        no record: none is read (a round trip on the publisher's connection, one read at
        a time for all request threads)."""
        found = None if new else self.read_record(client_id)
        recorded = None if found is None else found.filters
        if recorded == filters:
            if (
                name is not None
                and found is not None
                and (found.name, found.owner) != self._wanted(name)
            ):
                self._record(client_id, filters, name)
            with self._lock:
                self._declared[client_id] = filters
            return
        with self._lock:
            before = self._declared.get(client_id, frozenset()) | (recorded or frozenset())
        # the record first: another instance re-attaching the subscription meanwhile (it
        # follows the store) then connects nothing, so it cannot cut off the instance
        # that already delivers it; a deliverer subscribes the filters itself anyway
        self._record(client_id, filters, name)
        deadline = time.monotonic() + timeout
        while True:
            conn = SessionConnection(
                self.settings,
                client_id,
                self.mapping,
                lambda t: True,
                receive_maximum=1,
                hub=self.hub,
            )
            try:
                conn.connect()
                conn.subscribe(filters, max(0.5, deadline - time.monotonic()))
                conn.unsubscribe(before - filters, max(0.5, deadline - time.monotonic()))
                break
            except AdapterUnavailable:
                if time.monotonic() >= deadline:
                    raise
                log.debug("declaring %s: cut off, trying again", client_id)
            finally:
                conn.close()
            time.sleep(0.05)
        # returns once the broker closed the declaring connection: a message published
        # after the declare is then queued for the session, never sent to this
        # connection (which drops it unacknowledged, so that the deliverer's first
        # delivery of it would come marked as a redelivery)
        self.hub.await_drained(client_id)
        with self._lock:
            self._declared[client_id] = filters

    def delete(self, client_id: str) -> None:
        """End ``client_id``'s session: connect with clean start and session expiry 0 and
        disconnect; its messages are gone, and a connection still open is cut off."""
        conn = SessionConnection(
            self.settings, client_id, self.mapping, lambda t: True, persistent=False, hub=self.hub
        )
        try:
            conn.connect()
        finally:
            conn.end()
        self._record(client_id, frozenset())
        with self._lock:
            self._declared.pop(client_id, None)
