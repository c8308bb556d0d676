"""The JSON forms of what the admin API shows (``core.operations`` records).

Times are ``xsd:dateTime`` strings in UTC (``null``: none, or no scheduled end); topics
are ``{namespace}path`` strings; counts the middleware cannot give are ``null``; addresses
and errors have their secrets hidden (``core.redaction``).
docs/operations.md#admin-page-and-api describes every field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from wsnmom.core.delivery import ChannelStatus
from wsnmom.core.delivery_policy import DeliveryChoices, EffectivePolicy
from wsnmom.core.model import ExpressionSource, Subscription, SubscriptionState
from wsnmom.core.operations import (
    AdapterHealth,
    Overview,
    PullPointStatus,
    RegistrationStatus,
    SubscriptionStatus,
)
from wsnmom.core.peek import PeekResult
from wsnmom.core.rate_history import RatePoint
from wsnmom.core.redaction import redact_text, redact_url
from wsnmom.core.topic_stats import TopicCount

from .faults import xsd_datetime

__all__ = [
    "health_json",
    "overview_json",
    "peek_json",
    "pull_point_json",
    "registration_json",
    "status_json",
    "subscription_json",
    "topic_json",
]

_PREFIX_USE = re.compile(r"(?<![\w.-])([A-Za-z_][\w.-]*):")


def expression_json(expr: ExpressionSource | None) -> dict[str, Any] | None:
    """``{"dialect", "text", "namespaces"}`` (only the prefixes the text uses), or None."""
    if expr is None:
        return None
    used = set(_PREFIX_USE.findall(expr.text))
    return {
        "dialect": expr.dialect,
        "text": expr.text,
        "namespaces": {str(p): u for p, u in expr.namespaces.items() if p in used},
    }


def _time(value: datetime | None) -> str | None:
    return None if value is None or value.year >= 9999 else xsd_datetime(value)


def _posix(value: float | None) -> str | None:
    if value is None:
        return None
    return xsd_datetime(datetime.fromtimestamp(value, UTC))


def subscription_json(sub: Subscription, address: str) -> dict[str, Any]:
    """The stored facts of one subscription."""
    return {
        "id": sub.id,
        "address": address,
        "consumer": redact_url(sub.consumer.address),
        "state": "paused" if sub.state is SubscriptionState.PAUSED else "active",
        "created": _time(sub.creation_time),
        "terminates": _time(sub.termination_time),
        "topic": expression_json(sub.topic),
        "message_content": expression_json(sub.message_content),
        "producer_properties": expression_json(sub.producer_properties),
        "use_raw": sub.use_raw,
        "pull_point": sub.pull_point_id,
        "soap_version": "1.1" if sub.soap_version.name == "SOAP11" else "1.2",
        "wsn_version": sub.wire_version.value,
        # the store's revision this instance holds (a cluster's instances agree on it once
        # each followed the last change, docs/scale-out.md)
        "revision": sub.revision,
    }


def delivery_json(delivery: ChannelStatus | None) -> dict[str, Any] | None:
    """A delivery channel's state, or None (a subscription routed at publish time)."""
    if delivery is None:
        return None
    return {
        "active": delivery.active,
        "failures": delivery.failures,
        "retry_at": _posix(delivery.retry_at),
        "last_error": None if delivery.last_error is None else redact_text(delivery.last_error),
        "delivered": delivery.delivered,
        "last_delivery": _posix(delivery.last_delivery),
        "held": delivery.held,
    }


def attempts_json(delivery: ChannelStatus | None) -> list[dict[str, Any]]:
    """A channel's last delivery attempts, newest first (empty for a routed subscription)."""
    if delivery is None:
        return []
    return [
        {
            "at": _posix(a.at),
            "ok": a.ok,
            "messages": a.messages,
            "error": None if a.error is None else redact_text(a.error),
            "deferred": a.deferred,
        }
        for a in reversed(delivery.attempts)
    ]


def history_json(points: Sequence[RatePoint]) -> dict[str, Any]:
    """The last hour of traffic (``core.rate_history``), oldest first."""
    return {
        "points": [
            {
                "at": _posix(p.at),
                "notifications": p.notifications,
                "deliveries": p.deliveries,
                "failures": p.failures,
                "backlog": p.backlog,
            }
            for p in points
        ]
    }


def status_json(status: SubscriptionStatus) -> dict[str, Any]:
    """One subscription with its mode, backlog and delivery state."""
    data = subscription_json(status.record, status.address)
    data["mode"] = status.mode
    data["waiting"] = status.waiting
    data["backlog"] = status.backlog
    data["delivery"] = delivery_json(status.delivery)
    data["delivery_policy"] = delivery_policy_json(
        status.delivery_policy, status.record.delivery_policy
    )
    return data


def delivery_policy_json(
    policy: EffectivePolicy | None, chosen: DeliveryChoices | None
) -> dict[str, Any] | None:
    """The delivery policy a push subscription follows, what its subscriber chose (the
    rest is the gateway's) and a one-line summary the admin page shows."""
    if policy is None:
        return None
    data = policy.as_json()
    data["chosen"] = sorted(chosen.to_json()) if chosen is not None else []
    data["summary"] = delivery_policy_summary(policy, data["chosen"])
    return data


def delivery_policy_summary(policy: EffectivePolicy, chosen: list[str]) -> str:
    """``3 attempts, exponential from 0.2 s to 2 s, 3 s per attempt, ...`` ."""
    parts = [
        f"{policy.max_attempts} attempt{'s' if policy.max_attempts != 1 else ''}",
        f"{policy.backoff} backoff from {policy.initial_delay:g} s to {policy.max_delay:g} s",
        f"{policy.timeout:g} s per attempt",
        (
            f"Retry-After honoured up to {policy.retry_after_max:g} s"
            if policy.retry_after
            else "Retry-After ignored"
        ),
        (
            "final statuses " + " ".join(map(str, policy.final_statuses))
            if policy.final_statuses
            else "no final status"
        ),
        (
            f"unordered, {policy.in_flight} in flight"
            if policy.ordering == "unordered"
            else "ordered"
        ),
    ]
    origin = f"chosen: {', '.join(chosen)}" if chosen else "the gateway's"
    return "; ".join(parts) + f" ({origin})"


def pull_point_json(status: PullPointStatus) -> dict[str, Any]:
    """One pull point with the messages waiting in it."""
    record = status.record
    return {
        "id": record.id,
        "address": status.address,
        "name": record.name,
        "created": _time(record.creation_time),
        "terminates": _time(record.termination_time),
        "waiting": status.waiting,
        "feeding": list(status.feeding),
    }


def registration_json(status: RegistrationStatus) -> dict[str, Any]:
    """One publisher registration."""
    record = status.record
    publisher = record.publisher_reference
    return {
        "id": record.id,
        "address": status.address,
        "publisher": redact_url(publisher.address) if publisher is not None else None,
        "topics": [expression_json(t) for t in record.topics],
        "demand": record.demand,
        "demand_paused": record.demand_paused if record.demand else None,
        "created": _time(record.creation_time),
        "terminates": _time(record.termination_time),
    }


def topic_json(count: TopicCount) -> dict[str, Any]:
    """One topic's message count and rate."""
    return {
        "topic": str(count.topic),
        "namespace": count.topic.namespace,
        "path": "/".join(count.topic.path),
        "messages": count.messages,
        "rate": round(count.rate, 3),
        "last": _posix(count.last),
    }


def health_json(health: AdapterHealth) -> dict[str, Any]:
    """The adapter's and the broker's state."""
    return {
        "adapter": health.adapter,
        "url": health.url,
        "shape": health.shape,
        "available": health.available,
        "answers": health.answers,
        "started": health.started,
        "ready": health.ready,
        "disk_free": health.disk_free,
        "disk_low": health.disk_low,
        "reason": health.reason,
        "store_reason": health.store_reason,
    }


def overview_json(view: Overview, broker: str, limit: int) -> dict[str, Any]:
    """Everything the admin page shows; each list holds at most ``limit`` entries (the
    subscriptions that need attention most: ``Operations.overview(limit)`` chose them)
    and ``totals`` counts all of them."""
    counted = view.subscription_totals
    backlogs = [p.waiting for p in view.pull_points]
    return {
        "time": _posix(view.time),
        "broker": broker,
        "health": health_json(view.health),
        "totals": {
            "subscriptions": counted.count,
            "paused": counted.paused,
            "failing": counted.failing,
            "pull_points": len(view.pull_points),
            "registrations": len(view.registrations),
            "backlog": counted.backlog + sum(b for b in backlogs if b is not None),
            "backlog_unknown": counted.backlog_unknown + sum(1 for b in backlogs if b is None),
            "topics": len(view.topics),
            "messages": sum(t.messages for t in view.topics),
            "rate": round(sum(t.rate for t in view.topics), 3),
        },
        "limit": limit,
        "subscriptions": [status_json(s) for s in view.subscriptions[:limit]],
        "pull_points": [pull_point_json(p) for p in view.pull_points[:limit]],
        "registrations": [registration_json(r) for r in view.registrations[:limit]],
        "topics": [topic_json(t) for t in view.topics[:limit]],
        "topics_forgotten": view.topics_forgotten,
    }


def peek_json(result: PeekResult) -> dict[str, Any]:
    """A peek's messages, oldest first, as ``wsnmom pull --format json`` prints a
    notification (message id, timestamp, topic with namespace, headers, producer), with
    where each one is and whether the answer is complete (``core.peek``)."""
    items = []
    for p in result.messages:
        m = p.message
        items.append(
            {
                "message_id": m.message_id,
                "timestamp": _time(m.published_at),
                "stored_at": _time(p.stored_at),
                "topic": str(m.topic) if m.topic is not None else None,
                "namespace": m.topic.namespace if m.topic is not None else None,
                "path": "/".join(m.topic.path) if m.topic is not None else None,
                "dialect": m.topic_dialect,
                "producer": (
                    redact_url(m.producer_reference.address)
                    if m.producer_reference is not None
                    else None
                ),
                "headers": dict(m.headers),
                "content_type": m.content_type,
                "payload": m.payload.decode("utf-8", "replace"),
                "where": p.where,
                "redelivered": p.redelivered,
            }
        )
    return {
        "count": len(items),
        "complete": result.complete,
        "note": result.note or None,
        "messages": items,
    }
