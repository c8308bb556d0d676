"""Declarations: the exchanges, queues and bindings the RabbitMQ adapter puts on the broker.

Each topic namespace is a durable topic exchange (used as it is when it exists, declared
otherwise) bound with ``#`` to the catch-all exchange, except the exchanges of internal
namespaces (pull point inboxes), which are kept out of it.  Each subscription is a durable
queue with its ``QueueLimits`` as queue arguments and one binding per topic pattern; a new
classic queue gets a primer (:meth:`Declarations.prime`).  What was declared is
remembered per connection, so each exchange is declared once per connection.

In cluster mode (several gateway instances, ``shared``) a push subscription's queue also
gets ``x-single-active-consumer``: the broker hands its messages to one consumer at a
time, whichever instances consume it (docs/scale-out.md, "What fences what").  Pull point
queues do not (RabbitMQ refuses ``basic.get`` on such a queue, and any instance may answer
a GetMessages).  Quorum queues enforce every limit of ``QueueLimits`` except one: RabbitMQ
3.10 accepts ``x-overflow: reject-publish-dlx`` on a quorum queue but drops the oldest
message instead (measured), so a subscription that drops the newest message into a
dead-letter destination gets a classic queue (:meth:`Declarations.queue_type`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pika
from pika import spec
from wsnmom.core.adapter import (
    AdapterError,
    Overflow,
    QueueLimits,
    SubscriptionSpec,
    is_internal_namespace,
)

from ._link import NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED, ChannelError, Declarer, Link
from .names import Binding, RabbitMQNames
from .options import RabbitMQOptions

if TYPE_CHECKING:
    from .subscription import RabbitMQSubscription

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: the queue arguments a quorum queue accepts (RabbitMQ 3.10); it refuses every other one
#: with PRECONDITION_FAILED, ``x-max-priority`` and ``x-queue-mode`` among them
QUORUM_ARGUMENTS = frozenset(
    {
        "x-queue-type",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    }
)


def quorum_refusal(opts: RabbitMQOptions) -> str | None:
    """Why ``opts.queue_arguments`` cannot go with quorum queues (None: they can, or the
    queues are classic)."""
    if opts.queue_type != "quorum":
        return None
    extras = dict(opts.queue_arguments or {})
    refused = sorted(k for k in extras if k not in QUORUM_ARGUMENTS)
    if refused:
        return (
            f"queue_arguments {', '.join(refused)} cannot be used with quorum queues "
            f'(queue_type = "quorum", the default in cluster mode): remove them or set '
            f'queue_type = "classic"'
        )
    if extras.get("x-overflow") == "reject-publish-dlx":
        return (
            "queue_arguments x-overflow = reject-publish-dlx: quorum queues (queue_type = "
            '"quorum", the default in cluster mode) drop the oldest message instead; use '
            'reject-publish or drop-head, or queue_type = "classic"'
        )
    return None


def _mismatch(queue: str, exc: ChannelError) -> str:
    """The text of a refused declaration of ``queue`` that says the queue exists with
    other arguments (PRECONDITION_FAILED, "inequivalent arg").  Any other refusal is
    raised: another channel error as it is, a PRECONDITION_FAILED of another kind (a
    vhost's ``max-queues`` limit reached, say) as the adapter error it is, which no
    other declaration of the queue gets past (taken for a mismatch, it ended in a
    passive declaration's 404 "no queue", answered as "middleware not reachable")."""
    if exc.code != PRECONDITION_FAILED:
        raise exc
    if "inequivalent arg" not in exc.text:
        raise AdapterError(f"RabbitMQ refused to declare queue {queue!r}: {exc}") from exc
    return exc.text


def _existing_type(mismatch: str) -> str | None:
    """What a PRECONDITION_FAILED text says of the existing queue's type: ``"classic"``,
    ``"other"`` (quorum, stream), or None when it names another argument (RabbitMQ names
    the first that differs, the type among the last)."""
    if "'x-queue-type'" not in mismatch:
        return None
    classic = mismatch.endswith("current is none") or "current is the value 'classic'" in mismatch
    return "classic" if classic else "other"


#: what a subscription's declaration put on the broker: the generation of the connection
#: it was made on, the queue's arguments, the bindings (``Declarations.in_place``)
Declared = tuple[int, dict[str, Any], tuple[Binding, ...]]

#: header of the primer a new subscription queue gets (:meth:`Declarations.prime`)
PRIMER_HEADER = "wsnmom-primer"
_PRIMER_PROPERTIES = pika.BasicProperties(
    delivery_mode=pika.DeliveryMode.Persistent, expiration="0", headers={PRIMER_HEADER: 1}
)


class Declarations:
    """Declares exchanges, subscription queues and their bindings (on any connection's
    loop thread) and remembers per connection which exchanges are in place."""

    def __init__(self, opts: RabbitMQOptions, names: RabbitMQNames) -> None:
        self.opts = opts
        self.names = names
        #: exchanges declared (and bound) on each connection, by link name
        self.declared: dict[str, set[str]] = {"consumer": set(), "publisher": set()}
        #: several gateway instances deliver these subscriptions, one at a time each
        #: (``RabbitMQAdapter.shared_by_instances``)
        self.shared = False
        #: queues already reported as kept classic (logged once each)
        self._told: set[str] = set()

    def reset(self, link: Link) -> None:
        """``link`` (re)connected: nothing is declared on it yet."""
        self.declared[link.name] = set()

    def queue_name(self, subscription: str) -> str:
        """The queue that backs the durable subscription ``subscription``."""
        return self.opts.queue_prefix + subscription

    def single_active(self, spec: SubscriptionSpec) -> bool:
        """Whether ``spec``'s queue lets one consumer at a time receive: in cluster mode
        (option ``single_active_consumer``, default: when ``shared``), for every queue but
        those ``basic.get`` reads, which RabbitMQ refuses on such a queue: a pull point's
        (its patterns all in internal namespaces) and a subscription feeding one
        (``SubscriptionSpec.pulled``)."""
        wanted = self.opts.single_active_consumer
        if wanted is None:
            wanted = self.shared
        patterns = spec.patterns
        inbox = bool(patterns) and all(is_internal_namespace(p.namespace) for p in patterns or ())
        return wanted and not inbox and not spec.pulled

    def queue_type(self, limits: QueueLimits, dead_letters: Binding | None) -> str:
        """The configured type, except classic for a queue that refuses the newest message
        into a dead-letter destination (``reject-publish-dlx``), which a quorum queue of
        RabbitMQ 3.10 turns into dropping the oldest."""
        limited = limits.max_messages is not None or limits.max_bytes is not None
        if (
            self.opts.queue_type == "quorum"
            and limited
            and limits.overflow is Overflow.DROP_NEWEST
            and dead_letters is not None
        ):
            return "classic"
        return self.opts.queue_type

    def queue_arguments(
        self,
        limits: QueueLimits,
        dead_letters: Binding | None = None,
        single_active: bool = False,
    ) -> dict[str, Any]:
        """Queue arguments for ``limits`` (plus the type and extras), with
        ``dead_letters`` (exchange, routing key) as the queue's dead-letter exchange: what
        the queue drops for its TTL or length goes there (``reject-publish-dlx`` rather than
        ``reject-publish`` for DROP_NEWEST, so a refused message goes there too), and
        ``x-single-active-consumer`` when ``single_active``."""
        args: dict[str, Any] = {"x-queue-type": self.queue_type(limits, dead_letters)}
        args.update(self.opts.queue_arguments or {})
        if single_active:
            args["x-single-active-consumer"] = True
        if dead_letters is not None:
            args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = dead_letters
        if limits.max_messages is not None:
            args["x-max-length"] = int(limits.max_messages)
        if limits.max_bytes is not None:
            args["x-max-length-bytes"] = int(limits.max_bytes)
        if limits.max_messages is not None or limits.max_bytes is not None:
            newest = "reject-publish-dlx" if dead_letters is not None else "reject-publish"
            args["x-overflow"] = newest if limits.overflow is Overflow.DROP_NEWEST else "drop-head"
        if limits.max_age is not None:
            args["x-message-ttl"] = max(0, int(limits.max_age.total_seconds() * 1000))
        return args

    async def ensure_exchange(self, link: Link, exchange: str, internal: bool = False) -> None:
        """Declare ``exchange`` if absent (used as it is if present) and bind it to the
        catch-all exchange -- unless it is the exchange of an ``internal`` namespace, which
        is kept (and, if an older version bound it, taken) out of the catch-all; once per
        connection."""
        declared = self.declared.setdefault(link.name, set())
        if exchange in declared:
            return
        if exchange == "":
            declared.add(exchange)  # the default exchange: nothing to declare or bind
            return
        all_exchange = self.opts.all_exchange
        if exchange != all_exchange and all_exchange not in declared:
            await self.ensure_exchange(link, all_exchange)
        async with link.declaring() as admin:
            try:
                await admin.call("exchange_declare", exchange, passive=True)
            except ChannelError as exc:
                if exc.code != NOT_FOUND:
                    raise
                await admin.call("exchange_declare", exchange, exchange_type="topic", durable=True)
                log.info("declared topic exchange %r", exchange)
            if exchange != all_exchange:
                # exchange.unbind of a missing binding is a no-op in RabbitMQ
                await admin.call(
                    "exchange_unbind" if internal else "exchange_bind",
                    destination=all_exchange,
                    source=exchange,
                    routing_key="#",
                )
        declared.add(exchange)

    async def ensure_configured(self, link: Link) -> None:
        """The catch-all exchange and the exchanges of the configured namespaces."""
        await self.ensure_exchange(link, self.opts.all_exchange)
        for namespace in self.opts.exchanges:
            await self.ensure_exchange(
                link, self.names.exchange_for(namespace), is_internal_namespace(namespace)
            )

    async def declare_queue(self, admin: Declarer, queue: str, args: dict[str, Any]) -> int | None:
        """Declare a durable queue; on an argument mismatch re-create it if it is empty
        and unused, else keep the existing queue (and its arguments) with a warning.

        Only a classic queue is re-created: RabbitMQ has no "delete if empty and unused"
        for quorum queues (it closes the whole connection with NOT_IMPLEMENTED), so when
        the existing queue may be a quorum queue it is kept as it is.  A queue's type
        cannot change in place: a classic queue that holds messages or has a consumer
        stays classic (and without single-active-consumer), with a warning once.

        Returns the number of messages the queue holds (None when it was kept with other
        arguments)."""
        try:
            frame = await admin.call("queue_declare", queue, durable=True, arguments=args)
            return int(frame.method.message_count)
        except ChannelError as exc:
            mismatch = _mismatch(queue, exc)
        existing = _existing_type(mismatch)
        wanted = args.get("x-queue-type", "classic")
        if existing is None and wanted != "classic":
            # the same queue as an earlier classic declaration of these limits?
            probe = {**args, "x-queue-type": "classic"}
            probe.pop("x-single-active-consumer", None)
            try:
                await admin.call("queue_declare", queue, durable=True, arguments=probe)
                existing = "classic"
            except ChannelError as exc:
                existing = _existing_type(_mismatch(queue, exc))
        if existing == "other" or (existing is None and wanted != "classic"):
            await admin.call("queue_declare", queue, passive=True)
            log.warning(
                "queue %r exists with other arguments; it keeps them (%s): it is or may be "
                "a quorum queue, which RabbitMQ cannot delete only when empty and unused",
                queue,
                mismatch,
            )
            return None
        classic = existing == "classic"
        try:
            await admin.call("queue_delete", queue, if_unused=True, if_empty=True)
        except ChannelError as exc:
            if exc.code not in (PRECONDITION_FAILED, RESOURCE_LOCKED):
                raise
            await admin.call("queue_declare", queue, passive=True)
            if classic and wanted != "classic":
                if queue not in self._told:
                    self._told.add(queue)
                    fence = args.get("x-single-active-consumer") is True
                    log.warning(
                        "queue %r is a classic queue that holds messages or has a consumer: "
                        "it stays classic (RabbitMQ cannot change a queue's type in place)"
                        "%s; it becomes a %s queue when declared again empty and unused "
                        "(a restart of every instance once it drained), or unsubscribe "
                        "and subscribe again",
                        queue,
                        ", without single-active-consumer: only the lease fences its consumers"
                        if fence
                        else "",
                        wanted,
                    )
                return None
            log.warning(
                "queue %r exists with other arguments and holds messages or consumers; "
                "it keeps its arguments (%s)",
                queue,
                mismatch,
            )
            return None
        frame = await admin.call("queue_declare", queue, durable=True, arguments=args)
        log.info("queue %r re-created with new arguments %s", queue, args)
        return int(frame.method.message_count)

    def primes(self, args: Mapping[str, Any]) -> bool:
        """Whether queues declared with ``args`` get a primer (see :meth:`prime`)."""
        # a primer dead-lettered to the gateway's own dead-letter destination reaches only
        # the gateway, which acks it silently; an operator's dead-letter exchange would
        # hand it to others
        return (
            self.opts.prime_queues
            and args.get("x-queue-type", "classic") == "classic"
            and "x-dead-letter-exchange" not in (self.opts.queue_arguments or {})
        )

    async def prime(self, admin: Declarer, queue: str) -> None:
        """Make the broker create a new classic queue's files now rather than on its first
        real message.

        RabbitMQ creates a classic queue's directory and index journal (and fsyncs them)
        lazily, with the first persistent message.  That costs ~1.3 ms of broker I/O per
        queue; a Notify to thousands of new subscriptions pays it for all of them before
        the publish is confirmed (13 s for 10,000 here, beyond core's publish timeout).
        The primer is a persistent, empty message that expires at once (``expiration``
        0): the broker writes it, which creates the files, and drops it.  Nobody waits
        for it.  A consumer that happens to get it before it expires never sees it: the
        adapter acks primers silently (``Deliveries.delivery``).
        """
        (await admin.channel()).pika.basic_publish("", queue, b"", _PRIMER_PROPERTIES)

    def internal_exchanges(self, namespaces: Iterable[str]) -> set[str]:
        """Exchanges of the internal namespaces among ``namespaces``."""
        return {self.names.exchange_for(ns) for ns in namespaces if is_internal_namespace(ns)}

    async def _exchanges(self, sub: RabbitMQSubscription) -> None:
        """The exchanges ``sub``'s bindings and dead-letter destination need."""
        link = sub.link
        internal = self.internal_exchanges(p.namespace for p in sub.spec.patterns or ())
        for exchange in dict.fromkeys(ex for ex, _ in self.names.bindings_for(sub.spec.patterns)):
            await self.ensure_exchange(link, exchange, exchange in internal)
        if sub.spec.dead_letters is not None:
            dead_letters = self.names.native_name(sub.spec.dead_letters)
            await self.ensure_exchange(link, dead_letters[0], True)

    async def declare_subscription(self, sub: RabbitMQSubscription) -> None:
        """The subscription's queue (primed when new), its bindings (stale ones removed)
        and the exchanges they need, on its consuming connection."""
        await self._exchanges(sub)
        generation, args, declared_bindings = self.declaration(sub)
        bindings = list(declared_bindings)
        wanted = set(bindings)
        # one declaration channel for the queue, its primer and its bindings, in order;
        # other subscriptions of this connection declare on the other channels meanwhile
        async with sub.link.declaring() as admin:
            depth = await self.declare_queue(admin, sub.queue, args)
            if depth == 0 and not sub.primed and self.primes(args):
                await self.prime(admin, sub.queue)
                sub.primed = True
            for exchange, key in sorted(sub.bound - wanted):
                await admin.call("queue_unbind", sub.queue, exchange, key)
            for exchange, key in bindings:
                await admin.call("queue_bind", sub.queue, exchange, key)
        sub.bound = wanted
        sub.declared = True
        # a queue kept with other arguments is declared again at its next opening: it
        # changes type once it is empty and unused
        sub.declared_as = None if depth is None else (generation, args, tuple(bindings))

    def declaration(self, sub: RabbitMQSubscription) -> Declared:
        """What :meth:`declare_subscription` would put on the broker for ``sub`` now: its
        connection's generation (a reconnect declares everything again), the queue's
        arguments and its bindings."""
        dead_letters: Binding | None = None
        if sub.spec.dead_letters is not None:
            dead_letters = self.names.native_name(sub.spec.dead_letters)
        args = self.queue_arguments(
            sub.spec.limits, dead_letters, single_active=self.single_active(sub.spec)
        )
        bindings = tuple(self.names.bindings_for(sub.spec.patterns))
        return sub.link.generation, args, bindings

    async def with_consume(self, sub: RabbitMQSubscription) -> tuple[Declared, list[Any]] | None:
        """The declaration of ``sub`` as methods its first consume writes ahead of
        ``basic.qos`` and ``basic.consume``, on the consumer's own channel, in one write
        (``queue.declare``, then a ``queue.bind`` per binding): a followed subscription's
        opening (:meth:`deferred`, a failover's take) then waits for one round trip and
        no declaration channel, where :meth:`declare_subscription` waits for one per
        method, one of ``declare_channels`` held.  The exchanges are ensured first (once
        per connection, as there).  Returns what it declares (:meth:`declaration`) and
        the methods, or None when the declaration needs replies before its next step: a
        primer for a new classic queue (:meth:`primes`), stale bindings to remove.  A
        queue that exists with other arguments refuses the ``queue.declare``
        (PRECONDITION_FAILED, the channel closes, the broker ignores the rest): the caller
        then declares it by :meth:`declare_subscription`, which keeps or re-creates it."""
        await self._exchanges(sub)
        declared = self.declaration(sub)
        _generation, args, bindings = declared
        if self.primes(args) or not sub.bound <= set(bindings):
            return None
        methods: list[Any] = [
            (
                spec.Queue.Declare(queue=sub.queue, durable=True, arguments=args),
                spec.Queue.DeclareOk,
            )
        ]
        for exchange, key in bindings:
            bind = spec.Queue.Bind(queue=sub.queue, exchange=exchange, routing_key=key)
            methods.append((bind, spec.Queue.BindOk))
        return declared, methods

    def consumed(self, sub: RabbitMQSubscription, declared: Declared) -> None:
        """The declaration :meth:`with_consume` gave was answered: ``sub`` is declared as
        :meth:`declare_subscription` would have left it."""
        sub.bound = set(declared[2])
        sub.declared = True
        sub.declared_as = declared

    def in_place(self, sub: RabbitMQSubscription) -> bool:
        """Whether this process declared ``sub``'s queue and bindings on its connection,
        since the connection was last made, as they are wanted now: a declaration again
        (as every opening of its delivery made, a shard gained after a hand-over) would
        change nothing, unless the queue was deleted behind the adapter's back, which
        the consume then finds (``Consumers.start`` declares it again and retries).
        Never while the connection is down: the declaration waits for it (up to the
        operation timeout) before core opens the subscription's delivery channel, whose
        start would otherwise wait for it, holding the channel a stopping instance
        closes (a SIGTERM right after a rejoin waited for that)."""
        return (
            sub.link.is_up
            and sub.declared_as is not None
            and sub.declared_as == self.declaration(sub)
        )

    def deferred(self, sub: RabbitMQSubscription) -> bool:
        """Whether ``sub``'s declaration waits for its first consume here
        (``Consumers.start``): in cluster mode, a push subscription made through another
        gateway instance (``SubscriptionSpec.origin``), which declared it before it
        answered the Subscribe.  Every instance follows every new subscription; this one
        delivers it only if it holds its shard, now or after a hand-over, and declaring
        it on each of them cost the broker one queue declaration (a quorum queue's is
        the slow part of a Subscribe) and its bindings per instance.  A subscription read
        by pull is declared at once: any instance may answer a GetMessages."""
        return (
            self.shared and sub.spec.origin == "elsewhere" and not sub.spec.pulled
        ) and not sub.declared

    async def declare_for(self, sub: RabbitMQSubscription) -> None:
        """:meth:`declare_subscription` once the subscription's connection is up."""
        await sub.link.ready(self.opts.operation_timeout)
        await self.declare_subscription(sub)
