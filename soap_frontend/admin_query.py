"""Search, sort and paging of the subscriptions list on the server
(``GET /wsn/admin/api/subscriptions?q=&sort=&order=&offset=&limit=``), so that the admin
page and ``wsnmom subscriptions list`` stay fast with tens of thousands of subscriptions:
only the page asked for is rendered as JSON."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from wsnmom.core.model import SubscriptionState
from wsnmom.core.operations import SubscriptionStatus

__all__ = ["SORT_KEYS", "QueryError", "query_subscriptions"]


class QueryError(ValueError):
    """A parameter that cannot be used (HTTP 400)."""


def _state(s: SubscriptionStatus) -> str:
    if s.delivery is not None and s.delivery.failures:
        return "failing"
    return "paused" if s.record.state is SubscriptionState.PAUSED else "active"


def _topic(s: SubscriptionStatus) -> str:
    topic = s.record.topic
    if topic is None:
        return ""
    return " ".join([topic.text, *(f"{p}={u}" for p, u in topic.namespaces.items() if p)])


_EPOCH = datetime.min


#: sortable fields -> key (None sorts first ascending)
SORT_KEYS: Mapping[str, Callable[[SubscriptionStatus], Any]] = {
    "created": lambda s: (s.record.creation_time, s.record.id),
    "id": lambda s: s.record.id,
    "consumer": lambda s: (s.record.consumer.address, s.record.id),
    "topic": lambda s: (_topic(s), s.record.id),
    "state": lambda s: (_state(s), s.record.id),
    "backlog": lambda s: (-1 if s.backlog is None else s.backlog, s.record.id),
    "failures": lambda s: (s.delivery.failures if s.delivery else 0, s.record.id),
    "delivered": lambda s: (s.delivery.delivered if s.delivery else 0, s.record.id),
    "terminates": lambda s: (
        s.record.termination_time is None,
        s.record.termination_time.replace(tzinfo=None) if s.record.termination_time else _EPOCH,
        s.record.id,
    ),
}


def _int(args: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = args.get(name)
    if value in (None, ""):
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise QueryError(f"{name} must be a number") from None
    if number < 0:
        raise QueryError(f"{name} must not be negative")
    return number


def query_subscriptions(
    statuses: Sequence[SubscriptionStatus], args: Mapping[str, str]
) -> tuple[int, int, int | None, list[SubscriptionStatus]]:
    """(matched, offset, limit, the page) for the query ``args``: ``q`` (words that must
    all occur, case-insensitive, in id, consumer, topic expression or its namespaces, or
    state), ``sort`` (:data:`SORT_KEYS`, default ``created``), ``order`` (``asc`` or
    ``desc``), ``offset`` (0) and ``limit`` (all)."""
    sort = args.get("sort") or "created"
    if sort not in SORT_KEYS:
        raise QueryError(f"sort must be one of {', '.join(SORT_KEYS)}")
    order = args.get("order") or "asc"
    if order not in ("asc", "desc"):
        raise QueryError("order must be asc or desc")
    offset = _int(args, "offset", 0) or 0
    limit = _int(args, "limit", None)
    words = (args.get("q") or "").lower().split()
    items = list(statuses)
    if words:
        items = [
            s
            for s in items
            if all(
                w in f"{s.record.id} {s.record.consumer.address} {_topic(s)} {_state(s)}".lower()
                for w in words
            )
        ]
    items.sort(key=SORT_KEYS[sort], reverse=order == "desc")
    end = None if limit is None else offset + limit
    return len(items), offset, limit, items[offset:end]
