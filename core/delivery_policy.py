"""A subscriber's delivery policy: the Subscribe policy extension ``wsnmom:DeliveryPolicy``
(issue 25, item 2), checked against the gateway's ``retry`` and ``delivery`` settings,
which are its defaults and its bounds.

The element holds any of these children (namespace ``urn:wsnmom:ns:1``), each at most
once; an absent one takes the gateway's value:

``MaxAttempts``
    attempts per batch, the first included: 1 to ``retry.max_attempts``.
``Backoff``
    ``exponential`` (``InitialDelay * retry.multiplier**(n-1)``) or ``linear``
    (``InitialDelay * n``), after the n-th failed attempt, capped at ``MaxDelay``.
``InitialDelay`` / ``MaxDelay``
    xsd:duration or seconds, 0 to ``retry.max_delay``; ``InitialDelay`` <= ``MaxDelay``.
``Timeout``
    of each attempt: above 0, at most ``retry.timeout``.
``RetryAfter``
    ``true``/``false``: whether a ``Retry-After`` of a 429 or 503 answer sets the next
    attempt's delay (instead of the backoff), capped at ``RetryAfterMax`` (0 to
    ``retry.retry_after_max``).
``FinalStatuses``
    HTTP statuses (space or comma separated, 300 to 599) after which the batch is not
    retried: it goes straight to the dead letters and delivery goes on.
``Ordering``
    ``ordered`` (one batch at a time, in arrival order) or ``unordered`` (several
    deliveries at once, each retried on its own: ``core.unordered``); default the
    gateway's ``delivery.ordering``.
``InFlight``
    deliveries in flight at once when unordered: 1 to ``delivery.max_in_flight`` (default
    ``delivery.in_flight``); refused with ``Ordering`` ``ordered``.

:func:`parse` turns the element's (name, text) pairs into a :class:`DeliveryChoices`
(only what the subscriber chose; stored with the subscription, so later defaults follow the
gateway's configuration) or raises ``ValueError`` naming the child and the bound.
:func:`resolve` gives the :class:`~wsnmom.core.channel.Backoff` a channel uses
(:func:`effective` also its ordering and deliveries in flight): the choices
over the gateway's settings, clamped to its current bounds (a gateway restarted with lower
bounds does not keep serving old choices above them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from wsnmom.core.backoff import Backoff
from wsnmom.core.config_values import check_statuses, parse_duration

if TYPE_CHECKING:
    from wsnmom.core.config import DeliverySettings, RetrySettings

__all__ = [
    "CHILDREN",
    "ORDERINGS",
    "DeliveryChoices",
    "EffectivePolicy",
    "check_statuses",
    "effective",
    "parse",
    "resolve",
]

#: the element's children (local names) and the ``DeliveryChoices`` field each sets
CHILDREN: dict[str, str] = {
    "MaxAttempts": "max_attempts",
    "Backoff": "backoff",
    "InitialDelay": "initial_delay",
    "MaxDelay": "max_delay",
    "Timeout": "timeout",
    "RetryAfter": "retry_after",
    "RetryAfterMax": "retry_after_max",
    "FinalStatuses": "final_statuses",
    "Ordering": "ordering",
    "InFlight": "in_flight",
}
BACKOFFS = ("exponential", "linear")
ORDERINGS = ("ordered", "unordered")
_TRUE = ("true", "1")
_FALSE = ("false", "0")


@dataclass(frozen=True, slots=True)
class DeliveryChoices:
    """What a subscriber chose (None: the gateway's value); durations in seconds."""

    max_attempts: int | None = None
    backoff: str | None = None
    initial_delay: float | None = None
    max_delay: float | None = None
    timeout: float | None = None
    retry_after: bool | None = None
    retry_after_max: float | None = None
    final_statuses: tuple[int, ...] | None = None
    ordering: str | None = None
    in_flight: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The chosen fields only (stored with the subscription)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> DeliveryChoices | None:
        """Inverse of :meth:`to_json` (None stays None; unknown keys are ignored)."""
        if data is None:
            return None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "final_statuses" in values and values["final_statuses"] is not None:
            values["final_statuses"] = tuple(int(s) for s in values["final_statuses"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The policy a subscription's deliveries follow (choices over the gateway's)."""

    max_attempts: int
    backoff: str
    initial_delay: float
    max_delay: float
    timeout: float
    retry_after: bool
    retry_after_max: float
    final_statuses: tuple[int, ...]
    #: "ordered" or "unordered"
    ordering: str = "ordered"
    #: deliveries in flight at once (1 when ordered)
    in_flight: int = 1

    def as_json(self) -> dict[str, Any]:
        """JSON-able view (the admin API)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# --- parsing ----------------------------------------------------------------------------
def _seconds(text: str) -> float:
    try:
        seconds = parse_duration(text).total_seconds()
    except OverflowError:
        raise ValueError(f"{text!r} is too long a duration") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration of 0 or more")
    return seconds


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{text!r} is not true or false")


def _int(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def parse(
    children: Sequence[tuple[str, str]],
    retry: RetrySettings,
    delivery: DeliverySettings | None = None,
) -> DeliveryChoices:
    """The subscriber's choices from the element's children (local name, text), checked
    against the gateway's bounds (``delivery`` None: its defaults).
    :raises ValueError: "Child: problem"."""
    delivery = delivery or _delivery_defaults()
    values: dict[str, Any] = {}
    for name, raw in children:
        field = CHILDREN.get(name)
        if field is None:
            raise ValueError(
                f"{name}: not a child of DeliveryPolicy (one of {', '.join(CHILDREN)})"
            )
        if field in values:
            raise ValueError(f"{name}: given twice")
        text = raw.strip()
        try:
            values[field] = _value(field, text, retry, delivery)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    choices = DeliveryChoices(**values)
    first = choices.initial_delay
    most = choices.max_delay
    if most is None:
        most = retry.max_delay.total_seconds()
    if first is not None and first > most:
        raise ValueError(f"InitialDelay: {first:g}s is above MaxDelay ({most:g}s)")
    if choices.in_flight is not None and (choices.ordering or delivery.ordering) == "ordered":
        raise ValueError(
            "InFlight: only with Ordering unordered (an ordered subscription has one "
            "delivery in flight)"
        )
    return choices


def _delivery_defaults() -> DeliverySettings:
    from wsnmom.core.config import DeliverySettings

    return DeliverySettings()


def _value(field: str, text: str, retry: RetrySettings, delivery: DeliverySettings) -> Any:
    """One child's value, checked against its bound."""
    if field == "ordering":
        if text not in ORDERINGS:
            raise ValueError(f"{text!r} is not one of: {', '.join(ORDERINGS)}")
        return text
    if field == "in_flight":
        n = _int(text)
        if not 1 <= n <= delivery.max_in_flight:
            raise ValueError(f"{n} is not 1 to {delivery.max_in_flight} (the gateway's most)")
        return n
    max_delay = retry.max_delay.total_seconds()
    if field == "max_attempts":
        n = _int(text)
        if not 1 <= n <= retry.max_attempts:
            raise ValueError(f"{n} is not 1 to {retry.max_attempts} (the gateway's most)")
        return n
    if field == "backoff":
        if text not in BACKOFFS:
            raise ValueError(f"{text!r} is not one of: {', '.join(BACKOFFS)}")
        return text
    if field in ("initial_delay", "max_delay"):
        seconds = _seconds(text)
        if seconds > max_delay:
            raise ValueError(f"{seconds:g}s is above the gateway's most ({max_delay:g}s)")
        return seconds
    if field == "timeout":
        seconds = _seconds(text)
        if not 0 < seconds <= retry.timeout:
            raise ValueError(f"{seconds:g}s is not above 0 and at most {retry.timeout:g}s")
        return seconds
    if field == "retry_after":
        return _bool(text)
    if field == "retry_after_max":
        seconds = _seconds(text)
        cap = retry.retry_after_max.total_seconds()
        if seconds > cap:
            raise ValueError(f"{seconds:g}s is above the gateway's most ({cap:g}s)")
        return seconds
    # final_statuses
    items = [t for t in re.split(r"[\s,]+", text) if t]
    if not items:
        raise ValueError("no status given")
    return check_statuses(items)


# --- resolving --------------------------------------------------------------------------
def effective(
    choices: DeliveryChoices | None,
    retry: RetrySettings,
    delivery: DeliverySettings | None = None,
) -> EffectivePolicy:
    """``choices`` over the gateway's ``retry`` and ``delivery`` settings (None: its
    defaults), within its current bounds."""
    c = choices or DeliveryChoices()
    d = delivery or _delivery_defaults()
    ordering = c.ordering or d.ordering
    most = d.max_in_flight
    in_flight = min(c.in_flight or d.in_flight, most) if ordering == "unordered" else 1
    max_delay = retry.max_delay.total_seconds()
    mine_max = min(c.max_delay if c.max_delay is not None else max_delay, max_delay)
    first = retry.initial_delay.total_seconds() if c.initial_delay is None else c.initial_delay
    cap = retry.retry_after_max.total_seconds()
    return EffectivePolicy(
        max_attempts=min(c.max_attempts or retry.max_attempts, retry.max_attempts),
        backoff=c.backoff or "exponential",
        initial_delay=min(first, mine_max),
        max_delay=mine_max,
        timeout=min(c.timeout or retry.timeout, retry.timeout),
        retry_after=retry.honour_retry_after if c.retry_after is None else c.retry_after,
        retry_after_max=min(c.retry_after_max if c.retry_after_max is not None else cap, cap),
        final_statuses=(
            tuple(retry.final_statuses) if c.final_statuses is None else c.final_statuses
        ),
        ordering=ordering,
        in_flight=in_flight,
    )


def resolve(choices: DeliveryChoices | None, retry: RetrySettings) -> Backoff:
    """The ``core.channel.Backoff`` of a subscription with ``choices``."""
    policy = effective(choices, retry)
    return Backoff(
        max_attempts=policy.max_attempts,
        initial_delay=policy.initial_delay,
        multiplier=retry.multiplier,
        max_delay=policy.max_delay,
        give_up=retry.give_up,
        linear=policy.backoff == "linear",
        retry_after_max=policy.retry_after_max if policy.retry_after else None,
        final_statuses=frozenset(policy.final_statuses),
    )
