"""Lifetimes: termination-time rules and the scheduler that destroys expired resources.

Termination-time rules (docs/conformance.md: ITT-01..08, REN-02..07, REG-07/08):

* not given -> now + the configured default (finite);
* an absolute dateTime is used as is; one without a timezone is UTC;
* a duration (``timedelta`` or ``isodate.Duration``) is added to the broker's clock;
* ``INFINITE`` (``xsi:nil="true"``) -> no termination, only when ``allow_infinite`` is set,
  otherwise the fault;
* a result that is not in the future -> the fault (``MinimumTime`` = now);
* a result beyond now + maximum -> the fault (``MaximumTime`` = now + maximum): ITT-03 and
  REN-04 forbid granting an earlier time than the one requested, so the broker does not
  clamp.

The fault raised carries ``minimum_time`` and ``maximum_time`` attributes (datetime or
None) for the frontend's ``MinimumTime`` / ``MaximumTime`` elements.

The expiry sweep itself runs on a ``core.periodic.PeriodicTask``;
the service's sweep destroys subscriptions, pull points and registrations whose
termination time has passed, native durable subscriptions included.  Resources that expired
while the broker was down are removed by the start-up restore.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from wsnmom.core import errors
from wsnmom.core.model import INFINITE, RequestedTime


def _fault(
    cls: type[errors.WsnError],
    message: str,
    *,
    now: datetime,
    maximum: timedelta | None,
) -> errors.WsnError:
    if issubclass(cls, errors.TerminationTimeFault):
        return cls(
            message, minimum_time=now, maximum_time=None if maximum is None else now + maximum
        )
    return cls(message)


def resolve_termination(
    requested: RequestedTime,
    *,
    now: datetime,
    default: timedelta,
    maximum: timedelta | None,
    allow_infinite: bool,
    error: type[errors.WsnError],
) -> datetime | None:
    """The termination time to grant for ``requested`` (None = never), or raise ``error``."""
    if requested is None:
        result = now + default
        if maximum is not None and default > maximum:
            result = now + maximum
        return result
    if requested is INFINITE:
        if allow_infinite:
            return None
        raise _fault(
            error,
            "infinite termination times are not granted by this broker",
            now=now,
            maximum=maximum,
        )
    result_dt: datetime
    if isinstance(requested, datetime):
        result_dt = requested if requested.tzinfo else requested.replace(tzinfo=UTC)
    elif isinstance(requested, timedelta):
        result_dt = now + requested
    else:
        try:
            added = now + cast(Any, requested)  # isodate.Duration
        except TypeError:
            raise _fault(
                error, f"unusable termination time {requested!r}", now=now, maximum=maximum
            ) from None
        if not isinstance(added, datetime):
            raise _fault(
                error, f"unusable termination time {requested!r}", now=now, maximum=maximum
            )
        result_dt = added
    if result_dt <= now:
        raise _fault(
            error,
            f"termination time {result_dt.isoformat()} is not in the future "
            f"(current time {now.isoformat()})",
            now=now,
            maximum=maximum,
        )
    if maximum is not None and result_dt > now + maximum:
        raise _fault(
            error,
            f"termination time {result_dt.isoformat()} is beyond the maximum lifetime "
            f"(latest acceptable: {(now + maximum).isoformat()})",
            now=now,
            maximum=maximum,
        )
    return result_dt


def is_expired(termination_time: datetime | None, now: datetime) -> bool:
    """True when a resource with ``termination_time`` has expired at ``now``."""
    return termination_time is not None and termination_time <= now


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)
