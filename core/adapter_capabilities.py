"""What an adapter can do (``Capabilities``) and what core does with each answer.

Part of the contract in :mod:`wsnmom.core.adapter`, which re-exports it; plugin authors
import it from there.  Every field's doc comment says whether core acts on it or whether it
is informational (docs/plugins.md, "Capabilities", sorts them the same way; a test checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from wsnmom.topic_mapping.syntax import WildcardSyntax


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter can do.  New fields are only ever added, with safe defaults.

    The class attribute ``Adapter.capabilities`` says what the adapter class can do in
    general (``wsnmom adapters`` lists it); an adapter whose abilities depend on the
    connection (MQTT 3.1.1 or 5) sets its own instance attribute in ``open()``.  Core reads
    ``adapter.capabilities`` after ``open()`` and acts on the fields that say so; the
    fields marked *informational* change nothing in core: they tell the conformance kit
    which checks apply, and operators (``wsnmom adapters``, the admin page) what the
    middleware does (docs/plugins.md, "Capabilities").
    """

    #: native topic syntax; the adapter translates core's patterns with it
    #: (``topic_mapping.translate``).  Informational for core (the kit checks it)
    syntax: WildcardSyntax
    #: "per_message" (RabbitMQ, MQTT, embedded) or "offset" (Kafka).  With "offset" core
    #: settles the messages of a subscription in the order it received them, filtered-out
    #: ones included, so the adapter can commit a contiguous prefix
    ack_mode: Literal["per_message", "offset"] = "per_message"
    #: subscriptions survive gateway and middleware restarts.  Informational
    durable_subscriptions: bool = True
    #: SubscriptionHandle.pull / take are served by the middleware: GetMessages takes from
    #: the pull point's handle and from the handles of the subscriptions feeding it
    #: (``core.pull_reader``).  False: core never calls them; it starts those handles in
    #: push mode into a pull buffer of unsettled messages, settled as GetMessages hands
    #: them out (``core.pull_buffer``).  Either way the pull point reads its feeds
    #: directly (``core.pull_feeds``)
    native_pull: bool = True
    #: the middleware keeps the last message per topic (MQTT retain, embedded table).
    #: False: core keeps the current message per topic in its own store
    retained_current_message: bool = False
    #: metadata travels as native headers (False: MQTT 3.1.1, wrapped in the body).
    #: Informational: the adapter wraps them itself
    native_headers: bool = True
    #: QueueLimits are enforced by the middleware itself as messages arrive (RabbitMQ
    #: x-max-length ...).  False: core enforces them (``max_age`` when a message is handed
    #: out; counts and bytes every sweep, with ``Adapter.depths`` and
    #: ``SubscriptionHandle.discard``), and the policy document says so
    native_queue_limits: bool = False
    #: order is kept per subscription ("subscription") or only per partition
    #: ("partition"); core states it in the policy document (``GET /wsn/policy``)
    ordering: Literal["subscription", "partition", "none"] = "subscription"
    #: several gateway processes can consume one subscription without duplicates.
    #: Informational
    competing_consumers: bool = True
    #: largest message body the middleware accepts, None = no practical limit.
    #: Informational (the kit checks it)
    max_message_bytes: int | None = None
    #: every message reaches the middleware through this one gateway process (no native
    #: publishers, no other gateway instances).  Core's one optimisation flag: it then
    #: routes a notification to the subscriptions feeding its own pull points (those
    #: without a MessageContent filter, never paused) when it publishes, instead of giving
    #: each a durable subscription its pull point reads (``core.direct_routing``;
    #: embedded: the directory is locked to one process).
    sole_publisher: bool = False
    #: subscriptions' queued messages live in this process's data directory (embedded;
    #: MQTT, whose queues are the gateway's own): one instance per store, so a second
    #: live instance on a shared store is refused at start (docs/scale-out.md)
    local_queues: bool = False
    #: every name ``Adapter.subscription_names`` answers is this gateway's (its data
    #: directory's queues, or sessions under its own topic prefix), never another
    #: gateway's on the same middleware: core's orphan sweep (``core.orphans``) may then
    #: delete a listed name the store has no subscription or pull point of.  False (the
    #: default, and Kafka, whose consumer group names do not say which gateway made
    #: them): nothing listed is ever deleted for having no record
    own_names: bool = False
    #: ``nack(requeue=True)`` puts back exactly that message (queues).  False (logs): a
    #: requeue rewinds the subscription to that message, so later ones may come again.
    #: Informational (core settles every message; the kit checks redelivery with it)
    per_message_nack: bool = True
    #: acknowledgements must reach the middleware in the order messages arrived (MQTT
    #: QoS 1 PUBACK order); core then settles in order as for ``ack_mode="offset"``
    ordered_acks: bool = False
    #: how subscriptions are built on the middleware: "queue", "log" (cursors over
    #: shared logs) or "session".  Informational (shown on the admin overview)
    shape: Literal["queue", "log", "session"] = "queue"
    #: ``SubscriptionHandle.peek`` reads waiting messages without consuming them (no
    #: redelivery flag, no delivery count, nothing hidden from consumers meanwhile).
    #: False: ``peek`` raises ``NotImplementedError`` saying why, and operators see only
    #: what core holds in memory (the admin page says so).  Informational: core calls
    #: ``peek`` either way and takes the ``NotImplementedError`` as the answer
    #: (``core.peek``); the kit runs its ``Peek`` checks with it
    peek: bool = False
    #: what the adapter drops for ``QueueLimits`` goes to the subscription's
    #: ``SubscriptionSpec.dead_letters`` topic, and reaches its subscribers with
    #: ``HEADER_DROPPED_REASON``, ``HEADER_DROPPED_FROM`` and ``HEADER_DROPPED_AT``
    #: (``HEADER_DROPPED_ATTEMPTS`` where it counts hand-outs), before the middleware
    #: forgets it for the subscription: what the middleware drops itself
    #: (``native_queue_limits``: its own ``max_age`` and count/byte limits; RabbitMQ's
    #: dead-letter exchange, the embedded and MQTT queues in the same transaction) and
    #: what ``SubscriptionHandle.discard`` drops (logs: read and published
    #: before the cursor commits past it).  This is the one way an adapter reports a
    #: message it gives up on; core reads the topic like any other (``core.dead_letters``)
    #: and keeps no per-adapter case.  False: such messages are gone
    native_dead_letters: bool = False

    @property
    def settles_in_order(self) -> bool:
        """Whether core must settle each subscription's messages in arrival order."""
        return self.ack_mode == "offset" or self.ordered_acks
