"""Search, sort and paging of the subscriptions list on the server
(``GET /wsn/admin/api/subscriptions?q=&sort=&order=&offset=&limit=``), so that the admin
page and ``wsnmom subscriptions list`` stay fast with tens of thousands of subscriptions:
searching, sorting and paging look at :class:`~wsnmom.core.operations.SubscriptionRow`
(a few fields of each subscription), and only the page asked for is read in full and
rendered as JSON."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from wsnmom.core.operations import SubscriptionRow

__all__ = ["SORT_KEYS", "QueryError", "needs_delivery", "query_subscriptions"]


class QueryError(ValueError):
    """A parameter that cannot be used (HTTP 400)."""


def _state(s: SubscriptionRow) -> str:
    if s.delivery is not None and s.delivery.failures:
        return "failing"
    return "paused" if s.paused else "active"


def _topic(s: SubscriptionRow) -> str:
    topic = s.topic
    if topic is None:
        return ""
    return " ".join([topic.text, *(f"{p}={u}" for p, u in topic.namespaces.items() if p)])


_EPOCH = datetime.min


#: sortable fields -> key (None sorts first ascending)
SORT_KEYS: Mapping[str, Callable[[SubscriptionRow], Any]] = {
    "created": lambda s: (s.creation_time, s.id),
    "id": lambda s: s.id,
    "consumer": lambda s: (s.consumer, s.id),
    "topic": lambda s: (_topic(s), s.id),
    "state": lambda s: (_state(s), s.id),
    "backlog": lambda s: (-1 if s.backlog is None else s.backlog, s.id),
    "failures": lambda s: (s.delivery.failures if s.delivery else 0, s.id),
    "delivered": lambda s: (s.delivery.delivered if s.delivery else 0, s.id),
    "terminates": lambda s: (
        s.termination_time is None,
        s.termination_time.replace(tzinfo=None) if s.termination_time else _EPOCH,
        s.id,
    ),
}


#: sorts that look at the delivery state (``SubscriptionRow.delivery``)
_DELIVERY_SORTS = frozenset({"state", "backlog", "failures", "delivered"})


def needs_delivery(args: Mapping[str, str]) -> bool:
    """Whether the query ``args`` looks at the delivery states: a search (a subscription
    whose delivery fails is "failing") or a sort by one of them."""
    return bool((args.get("q") or "").split()) or args.get("sort") in _DELIVERY_SORTS


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
    rows: Sequence[SubscriptionRow], args: Mapping[str, str]
) -> tuple[int, int, int | None, list[SubscriptionRow]]:
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
    items = list(rows)
    if words:
        items = [
            s
            for s in items
            if all(w in f"{s.id} {s.consumer} {_topic(s)} {_state(s)}".lower() for w in words)
        ]
    items.sort(key=SORT_KEYS[sort], reverse=order == "desc")
    end = None if limit is None else offset + limit
    return len(items), offset, limit, items[offset:end]
