"""Publisher registrations: RegisterPublisher, DestroyRegistration, and what the demand
manager (``core.demand``) needs to know about them.

Decisions:

* Demand=true without PublisherReference -> PublisherRegistrationFailed; Demand=true
  without Topic -> InvalidTopicExpression; an unknown topic dialect ->
  InvalidTopicExpression (BR lists no dialect fault).
* A registration without PublisherReference (with or without Topic) is accepted; without
  Topic it covers every topic.
* A demand-based publisher's address must pass the outbound policy, since the broker will
  call it (PublisherRegistrationRejected otherwise).
* With ``requires_registration`` a PublisherReference belongs to the identity that
  registered it first: while that identity holds a live registration of the address,
  another identity's RegisterPublisher for it is PublisherRegistrationRejected (an admin
  may register any).  Otherwise bob could register alice's address and publish
  notifications that consumers receive with alice's ProducerReference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from wsnmom.core import errors
from wsnmom.core.access import current_principal, may_manage
from wsnmom.core.context import BrokerContext
from wsnmom.core.demand import DemandEntry, DemandManager
from wsnmom.core.filters import topic_errors
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    ExpressionSource,
    PublisherRegistration,
    RegisterPublisherRequest,
    RequestedTime,
    new_resource_id,
)
from wsnmom.core.outbound_policy import AddressRefused
from wsnmom.core.registry import LiveRegistration
from wsnmom.topic_mapping.dialects import parse_topic_expression
from wsnmom.topic_mapping.model import Topic, TopicExpression

__all__ = ["Registrations"]


class Registrations:
    """Creates and destroys publisher registrations."""

    def __init__(self, ctx: BrokerContext, demand: DemandManager) -> None:
        self._ctx = ctx
        self._demand = demand

    def compile_topics(
        self, topics: Sequence[ExpressionSource], *, accepted: bool = False
    ) -> tuple[TopicExpression, ...]:
        """Parse and validate a registration's topic expressions.  Concrete ones are
        admitted to the topic set at once when ``accepted`` (an existing registration's:
        a restart's, another instance's), whatever the bound and the caller; a new
        registration's are only checked here (the Notify ACL allows them all, each fits
        under ``quotas.ad_hoc_topics`` with those before it) and admitted by
        :meth:`register` once every check passed (a refused RegisterPublisher admits
        nothing)."""
        ctx = self._ctx
        topic_set = ctx.topic_set
        out: list[TopicExpression] = []
        for source in topics:
            with topic_errors(unknown_dialect=errors.InvalidTopicExpression):
                expr = parse_topic_expression(
                    source.text, source.dialect, source.namespaces, topic_set=topic_set
                )
                out.append(topic_set.validate(expr))
        concrete = [expr.patterns[0].as_topic() for expr in out if expr.is_concrete]
        with topic_errors(unknown_dialect=errors.InvalidTopicExpression):
            if accepted:
                ctx.guard.admit_topics(concrete, accepted=True)
                return tuple(out)
            ctx.guard.check_register(out)
            new: dict[Topic, None] = {}
            for topic in concrete:
                if topic not in new and ctx.guard.check_topic(topic, ahead=len(new)):
                    new[topic] = None
        return tuple(out)

    def register(self, req: RegisterPublisherRequest) -> PublisherRegistration:
        """RegisterPublisher (BR §6.1)."""
        ctx = self._ctx
        if req.demand and req.publisher_reference is None:
            raise errors.PublisherRegistrationFailed(
                "Demand=true requires a PublisherReference (REG-04)"
            )
        if req.demand and not req.topics:
            raise errors.InvalidTopicExpression(
                "Demand=true requires at least one Topic to subscribe to at the publisher"
            )
        topics = self.compile_topics(req.topics)  # the ACL checked before admission
        termination = ctx.termination(
            req.initial_termination_time,
            errors.UnacceptableInitialTerminationTime,
            default=ctx.settings.termination.registration_default,
        )
        if req.demand and req.publisher_reference is not None:
            address = req.publisher_reference.address
            try:
                ctx.policy.check(address)
            except AddressRefused as exc:
                error = (
                    errors.PublisherRegistrationFailed
                    if exc.temporary
                    else (errors.PublisherRegistrationRejected)
                )
                raise error(f"publisher address {address!r} refused: {exc.reason}") from None
        reg = PublisherRegistration(
            id=new_resource_id(),
            creation_time=ctx.now(),
            termination_time=termination,
            publisher_reference=req.publisher_reference,
            topics=tuple(req.topics),
            demand=req.demand,
            owner=ctx.guard.owner(),
        )
        with ctx.registry.lock:  # the check and the claim at once: no race between two
            self._check_reference_owner(reg)
            # every check passed: the topics now, all or none (a race lost at the bound)
            with topic_errors(unknown_dialect=errors.InvalidTopicExpression):
                ctx.guard.admit_topics(t.patterns[0].as_topic() for t in topics if t.is_concrete)
            ctx.registry.registrations[reg.id] = LiveRegistration(reg, topics)
        try:
            ctx.store.put_registration(reg)
        except BaseException:
            with ctx.registry.lock:
                ctx.registry.registrations.pop(reg.id, None)
            raise
        ctx.registry.update_gauges()
        if reg.demand:
            self._demand.wake()
        return replace(reg)

    def _check_reference_owner(self, reg: PublisherRegistration) -> None:
        """Refuse ``reg`` when another identity holds a live registration of its
        PublisherReference (``requires_registration`` only; called under the registry
        lock)."""
        ctx = self._ctx
        ref = reg.publisher_reference
        if ref is None or not ctx.settings.requires_registration:
            return
        principal = current_principal()
        now = ctx.now()
        for other in ctx.registry.registrations.values():
            record = other.record
            if (
                record.publisher_reference is not None
                and record.publisher_reference.address == ref.address
                and not may_manage(principal, record.owner)
                and not is_expired(record.termination_time, now)
            ):
                raise errors.PublisherRegistrationRejected(
                    f"the PublisherReference {ref.address!r} is registered by another "
                    "identity; only it may publish as this producer"
                )

    def get(self, registration_id: str) -> PublisherRegistration:
        """The registration (a copy); ResourceUnknown when unknown or expired."""
        return replace(self._ctx.registry.live_registration(registration_id).record)

    def renew(self, registration_id: str, termination: RequestedTime) -> PublisherRegistration:
        """A new termination time for the registration (WS-ResourceLifetime's
        SetTerminationTime, which a WS-N 1.0 PublisherRegistrationManager supports: N10
        §11; br-2 has no such operation)."""
        ctx = self._ctx
        state = ctx.registry.live_registration(registration_id)
        if termination is None:
            raise errors.UnacceptableTerminationTime("SetTerminationTime needs a time")
        new_time = ctx.termination(termination, errors.UnacceptableTerminationTime)
        # the termination time alone: this instance's copy of the publisher subscription
        # may be older than the leader's last save, and must not be written back
        with ctx.registry.lock:
            if not ctx.store.renew_registration(registration_id, new_time):
                # destroyed through another instance this one has not followed yet
                ctx.registry.registrations.pop(registration_id, None)
                gone = True
            else:
                state.record.termination_time = new_time
                gone = False
        if gone:
            ctx.registry.update_gauges()
            raise errors.ResourceUnknown(f"no publisher registration {registration_id!r}")
        return replace(state.record)

    def destroy(self, registration_id: str) -> None:
        """DestroyRegistration (BR §7.2); a demand subscription is unsubscribed."""
        self.remove(self._ctx.registry.live_registration(registration_id))

    def remove(self, state: LiveRegistration) -> None:
        """Remove the registration everywhere and release its demand subscription: the
        one the store held as it deleted the record, since the leader may have saved one
        that this instance has not followed yet.  Removed already (through another
        instance), nothing is released here: the instance that deleted it released it."""
        ctx = self._ctx
        with ctx.registry.lock:
            ctx.registry.registrations.pop(state.record.id, None)
        try:
            stored = ctx.store.delete_registration(state.record.id)
        except Exception as exc:
            raise errors.ResourceNotDestroyed(str(exc)) from exc
        self._removed(stored)

    def expire(self, state: LiveRegistration, now: datetime, epoch: int) -> bool:
        """The cluster leader's expiry of the registration at ``now``, under the
        leadership ``epoch`` (``Store.expire_registration``): removed as :meth:`remove`
        does, unless the store's record was renewed meanwhile (then kept: False).

        :raises core.store.Deposed: ``epoch`` is not the leadership's any more (nothing
            removed)"""
        ctx = self._ctx
        reg_id = state.record.id
        stored = ctx.store.expire_registration(reg_id, now, epoch=epoch)
        if stored is None and ctx.store.get_registration(reg_id) is not None:
            return False  # renewed through another instance: kept
        with ctx.registry.lock:
            ctx.registry.registrations.pop(reg_id, None)
        self._removed(stored)
        return True

    def _removed(self, stored: PublisherRegistration | None) -> None:
        """After the record's delete: release the demand subscription it held (None:
        another instance deleted it, and released it)."""
        if stored is not None:
            self._demand.release(stored)
        self._ctx.registry.update_gauges()

    def save(self, reg: PublisherRegistration, epoch: int) -> bool:
        """Store ``reg``'s subscription at its publisher (the demand manager changed it,
        as the leader of ``epoch``), and nothing else of it: a termination time written
        through another instance stays.  A registration gone from the store (destroyed
        through another instance that this one has not followed yet) is not written
        back.  Whether it was stored.

        :raises core.store.Deposed: ``epoch`` is not the leadership's any more (nothing written)
        """
        ctx = self._ctx
        if reg.id not in ctx.registry.registrations:
            return False
        return ctx.store.save_registration_demand(
            reg.id, reg.demand_subscription, reg.demand_paused, epoch=epoch
        )

    def take_stored_demand(self) -> None:
        """Take each demand-based registration's publisher subscription from the store
        (this instance is about to act as the leader: the leader before may have saved
        one that it has not followed yet; subscribing again would leave that one at the
        publisher for good)."""
        ctx = self._ctx
        for entry in self.demand_entries():
            record = entry.registration
            stored = ctx.store.get_registration(record.id)
            if stored is None:
                continue  # destroyed meanwhile: following it forgets the registration
            with ctx.registry.lock:
                record.demand_subscription = stored.demand_subscription
                record.demand_paused = stored.demand_paused

    def demand_entries(self) -> list[DemandEntry]:
        """The demand-based registrations."""
        ctx = self._ctx
        with ctx.registry.lock:
            return [
                DemandEntry(r.record, r.topics)
                for r in ctx.registry.registrations.values()
                if r.record.demand
            ]
