"""What ``BrokerService`` builds from the settings before its parts: the outbound-address
policy (with the rule that the gateway's own endpoints are never a consumer or a
publisher), the delivery engine, the demand manager (wired to the registrations made
after it), and the version an instance announces to the others."""

from __future__ import annotations

from collections.abc import Callable

from wsnmom.core.config import Settings
from wsnmom.core.context import BrokerContext
from wsnmom.core.delivery import DeliveryEngine
from wsnmom.core.delivery_budget import MemoryBudget
from wsnmom.core.delivery_policy import resolve as resolve_delivery_policy
from wsnmom.core.demand import DemandManager
from wsnmom.core.lanes import BreakerSettings
from wsnmom.core.loops import SelfAddressRule
from wsnmom.core.model import EndpointReference
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.registrations import Registrations
from wsnmom.core.subscriptions import Subscriptions

__all__ = [
    "build_delivery_engine",
    "build_demand_manager",
    "build_outbound_policy",
    "gateway_version",
]


def gateway_version() -> str:
    """The installed wsnmom's version ("unknown" when it is not installed)."""
    try:
        from importlib.metadata import version

        return version("wsnmom")
    except Exception:
        return "unknown"


def build_outbound_policy(settings: Settings, given: OutboundPolicy | None) -> OutboundPolicy:
    """The outbound-address policy (``given``, else built from ``settings.outbound``), with
    the rule that the gateway's own endpoints are never a consumer or a publisher."""
    policy = given or OutboundPolicy(settings.outbound)
    # the gateway's own endpoints are never a consumer or a publisher (loops)
    policy.add_rule(
        SelfAddressRule(
            settings.base_url,
            settings.host,
            settings.port,
            resolver=policy.resolver,
        )
    )
    return policy


def build_delivery_engine(settings: Settings) -> DeliveryEngine:
    """The delivery engine under ``settings.delivery`` and ``settings.retry``."""
    r = settings.retry
    d = settings.delivery
    return DeliveryEngine(
        workers=d.workers,
        # the gateway's [retry]: the schedule of subscriptions without a policy of their own
        backoff=resolve_delivery_policy(None, r),
        prefetch=d.prefetch,
        max_workers=max(d.max_workers, d.workers),
        per_destination=d.per_destination or None,
        per_host=d.per_host or None,
        per_owner=d.per_owner or max(1, max(d.max_workers, d.workers) // 4),
        budget=MemoryBudget(d.memory, d.memory_per_owner),
        slow_after=d.slow_after,
        breaker=BreakerSettings(
            failures=d.breaker_failures,
            open_for=d.breaker_open.total_seconds(),
            max_open=max(r.max_delay.total_seconds(), d.breaker_open.total_seconds()),
        ),
    )


def build_demand_manager(
    ctx: BrokerContext,
    registrations: Callable[[], Registrations],
    subscriptions: Subscriptions,
    interval: float,
) -> DemandManager:
    """The demand manager (``core.demand``) on the service's ``registrations`` (made after
    it: they release through it, so asked for when used) and ``subscriptions``."""
    return DemandManager(
        ctx.outbound,
        broker_consumer=lambda: EndpointReference(ctx.broker_address),
        entries=lambda: registrations().demand_entries(),
        active_filters=subscriptions.active_topic_filters,
        save=lambda reg, epoch: registrations().save(reg, epoch),
        timeout=ctx.settings.retry.timeout,
        interval=interval,
        leadership=lambda: ctx.leader_epoch() if ctx.leads() else None,
        refresh=lambda: registrations().take_stored_demand(),
    )
