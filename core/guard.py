"""What the caller of a request may do to the broker's resources: ownership, topic ACLs
and quotas, checked by ``BrokerService`` before it delegates (see :mod:`.access` for the
model).

* A resource the caller may not manage is answered exactly as an unknown id (the same
  ResourceUnknownFault text), so ids cannot be probed.
* ``auth.third_party_pause`` lets any authenticated identity Pause and Resume.
* Quotas: the caller's live subscriptions, pull points and registrations are counted per
  owner by the registry (:class:`~wsnmom.core.registry.OwnedMap`); reaching a bound
  refuses the creation with the operation's own fault naming the bound.  Concurrent
  creations by one identity may pass a bound by the number of requests in flight.
* Ad-hoc topics: a new topic (a Notify's to the broker, not to a pull point: see
  ``core.inbound``; a RegisterPublisher's, a SubscriptionEnd topic) is admitted to the
  topic set only while it holds fewer than ``quotas.ad_hoc_topics`` topics beyond the
  declared ones; beyond, it is refused with TopicNotSupportedFault naming the bound.
  A request's new topics are checked in order
  and admitted together once every other check passed (the Notify ACL, a registration,
  the fan-out bound...), or none: a refused request admits nothing; the topics of
  resources accepted before (a restart's, another instance's) are admitted whatever
  the bound.  Every per-topic state (the topic
  set, the TopicSet document, current messages, the middleware's per-topic resources, a
  cluster's recorded topics) grows only through admission.
* Notify fan-out: a Notify whose payload bytes times the subscriptions they may reach
  exceed ``quotas.notify_fanout_bytes`` is refused (HTTP 413) before anything is
  admitted or published; the count is exact only when the cheap upper bound (every live
  subscription) is over the bound.  A Notify sent to a pull point copies its payload
  once, into that pull point: it is refused when the payload alone exceeds the bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from wsnmom.core import errors, metrics
from wsnmom.core.access import Principal, current_principal, may_manage
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import NotificationMessage
from wsnmom.topic_mapping import errors as tm_errors
from wsnmom.topic_mapping.model import Topic, TopicExpression

if TYPE_CHECKING:
    from wsnmom.core.context import BrokerContext
    from wsnmom.core.registry import (
        LivePullPoint,
        LiveRegistration,
        LiveSubscription,
        OwnedMap,
    )

__all__ = ["Guard", "ThrottledLog", "refusals"]

log = logging.getLogger("wsnmom.access")


class ThrottledLog:
    """Repeated log lines (refusals, faults), at most one per key every ``interval``
    seconds, with the number left out since: a client hammering a quota or sending bad
    requests must not flood the log.  The count left out is told on the next line of the
    key that is written."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        """Log ``message % args`` at WARNING unless ``key`` was logged within the interval."""
        self._emit(logging.WARNING, key, message, args)

    def info(self, key: str, message: str, *args: object) -> None:
        """Log ``message % args`` at INFO unless ``key`` was logged within the interval."""
        self._emit(logging.INFO, key, message, args)

    def reset(self) -> None:
        """Forget what was logged: the next line of every key is written."""
        with self._lock:
            self._last.clear()

    def _emit(self, level: int, key: str, message: str, args: tuple[object, ...]) -> None:
        if not self._log.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            last, skipped = self._last.get(key, (-self._interval, 0))
            if now - last < self._interval:
                self._last[key] = (last, skipped + 1)
                return
            self._last[key] = (now, 0)
            if len(self._last) > 10_000:
                self._last.clear()
        if skipped:
            message += f" ({skipped} more like it in the last {self._interval:g} s)"
        self._log.log(level, message, *args)


#: refusal warnings of core and the frontend (keyed by identity and quota or fault)
refusals = ThrottledLog(log)


def _refuse(error: errors.WsnError, status: int, quota: str) -> errors.WsnError:
    error.http_status = status
    metrics.QUOTA_REFUSALS.labels(quota=quota).inc()
    principal = current_principal()
    refusals.warning(f"{principal}:{quota}", "refused for %s: %s", principal, error.description)
    return error


def _denied(error: errors.WsnError) -> errors.WsnError:
    error.http_status = 403
    metrics.ACCESS_DENIED.labels(fault=error.fault_name).inc()
    principal = current_principal()
    refusals.warning(
        f"{principal}:{error.fault_name}", "denied to %s: %s", principal, error.description
    )
    return error


class Guard:
    """Ownership, ACL and quota checks for the caller bound to the current request."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        # the topics admit_topics bounds, at scrape time
        metrics.set_topics_source(lambda: float(ctx.topic_set.grown))

    # -- ownership -------------------------------------------------------------------------
    @staticmethod
    def owner() -> str | None:
        """The owner to record for a resource the caller creates (None when no client
        asked: the broker itself)."""
        principal = current_principal()
        return None if principal.method == "system" else principal.name

    def subscription(self, subscription_id: str, *, pause: bool = False) -> LiveSubscription:
        """The live subscription if the caller may act on it (``pause``: Pause/Resume,
        which ``auth.third_party_pause`` opens to every authenticated identity)."""
        state = self._ctx.registry.live_subscription(subscription_id)
        principal = current_principal()
        if may_manage(principal, state.record.owner):
            return state
        if pause and not principal.anonymous and self._ctx.settings.auth.third_party_pause:
            return state
        raise self._unknown(f"no subscription {subscription_id!r}")

    def pull_point(self, pull_point_id: str) -> LivePullPoint:
        """The live pull point if the caller may act on it."""
        state = self._ctx.registry.live_pull_point(pull_point_id)
        if not may_manage(current_principal(), state.record.owner):
            raise self._unknown(f"no pull point {pull_point_id!r}")
        return state

    def registration(self, registration_id: str) -> LiveRegistration:
        """The live registration if the caller may act on it."""
        state = self._ctx.registry.live_registration(registration_id)
        if not may_manage(current_principal(), state.record.owner):
            raise self._unknown(f"no publisher registration {registration_id!r}")
        return state

    @staticmethod
    def _unknown(text: str) -> errors.ResourceUnknown:
        # the same fault and text as an id that does not exist; counted and logged apart
        metrics.ACCESS_DENIED.labels(fault="ResourceUnknownFault").inc()
        principal = current_principal()
        refusals.warning(
            f"{principal}:not-owner",
            "%s may not use a resource it does not own: %s",
            principal,
            text,
        )
        return errors.ResourceUnknown(text)

    # -- topic ACLs ------------------------------------------------------------------------
    def check_subscribe(self, topic: TopicExpression | None) -> None:
        """Refuse a subscription whose topic filter reaches beyond the Subscribe ACL."""
        principal = current_principal()
        if not principal.may_subscribe(topic):
            what = f"topic expression {topic.text!r}" if topic else "a subscription to every topic"
            raise _denied(
                errors.SubscribeCreationFailed(f"{principal} may not subscribe to {what}")
            )

    def check_read(self, topic: Topic) -> None:
        """Refuse GetCurrentMessage on a topic outside the Subscribe ACL (answered as a
        topic without a current message would be)."""
        principal = current_principal()
        if not principal.may_read_topic(topic):
            metrics.ACCESS_DENIED.labels(fault="NoCurrentMessageOnTopicFault").inc()
            refusals.warning(
                f"{principal}:current", "denied to %s: GetCurrentMessage on %s", principal, topic
            )
            raise errors.NoCurrentMessageOnTopic(f"no current message on topic {topic}")

    def check_notify(self, topic: Topic | None) -> None:
        """Refuse a notification on a topic outside the Notify ACL."""
        principal = current_principal()
        if not principal.may_notify(topic):
            what = str(topic) if topic is not None else "a notification without a topic"
            raise _denied(errors.NotificationRefused(f"{principal} may not notify on {what}"))

    def check_register(self, topics: Sequence[TopicExpression]) -> None:
        """Refuse a registration for topics outside the Notify ACL."""
        principal = current_principal()
        if not topics:
            if not principal.may_register(None):
                raise _denied(
                    errors.PublisherRegistrationRejected(
                        f"{principal} may not register for every topic"
                    )
                )
            return
        for expr in topics:
            if not principal.may_register(expr):
                raise _denied(
                    errors.PublisherRegistrationRejected(
                        f"{principal} may not register for topic expression {expr.text!r}"
                    )
                )

    # -- quotas ----------------------------------------------------------------------------
    def _bounds(self, kind: str, principal: Principal) -> tuple[int | None, int | None]:
        quotas = self._ctx.settings.quotas
        own = getattr(principal.quotas, kind)
        per_identity = own if own is not None else getattr(quotas, kind)
        return per_identity, getattr(quotas, f"total_{kind}")

    def check_quota(self, kind: str, fault: type[errors.WsnError]) -> None:
        """Refuse creating one more ``kind`` ("subscriptions", "pull_points",
        "registrations") beyond the caller's or the global bound."""
        registry = self._ctx.registry
        maps: dict[str, OwnedMap[Any]] = {
            "subscriptions": registry.subscriptions,
            "pull_points": registry.pull_points,
            "registrations": registry.registrations,
        }
        live = maps[kind]
        principal = current_principal()
        if principal.method == "system":
            return
        per_identity, total = self._bounds(kind, principal)
        label = kind.replace("_", " ")
        if total is not None and len(live) >= total:
            raise _refuse(
                fault(f"the broker holds its maximum of {total} {label} (quotas.total_{kind})"),
                500,
                f"total_{kind}",
            )
        if per_identity is not None and live.owned_by(self.owner()) >= per_identity:
            raise _refuse(
                fault(f"{principal} owns its maximum of {per_identity} {label} (quotas.{kind})"),
                500,
                kind,
            )

    def check_topic(self, topic: Topic, *, ahead: int = 0) -> bool:
        """Whether ``topic`` is new (False: a member), refused as :meth:`admit_topics`
        would refuse it after ``ahead`` other new topics of the same request, without
        admitting it: a request checks its topics in order (a refusal names the first
        topic that does not fit) and admits them once every check passed."""
        limit = self._ctx.settings.quotas.ad_hoc_topics
        try:
            return self._ctx.topic_set.check(topic, limit=limit, ahead=ahead)
        except tm_errors.TopicSetFull as exc:
            raise self._full(topic, exc.limit) from None

    def admit_topic(self, topic: Topic, *, accepted: bool = False) -> None:
        """:meth:`admit_topics` of one topic."""
        self.admit_topics((topic,), accepted=accepted)

    def admit_topics(self, topics: Iterable[Topic], *, accepted: bool = False) -> None:
        """Admit ``topics`` to the topic set, all of them or none (members are no-ops): new
        ones beyond ``quotas.ad_hoc_topics`` are refused (TopicNotSupportedFault naming
        the bound), also for the broker's own requests.  A request admits its topics
        after every other check passed (its topics checked in order by
        :meth:`check_topic`, the Notify ACL, a registration, the fan-out bound...): a
        refused request takes no room and leaves no topic behind, here or in a cluster's
        recorded topics.  ``accepted``: the topics of a resource accepted before
        (restored at a restart, made through another instance, ending), admitted
        whatever the bound: the bound refuses new requests, never undoes what was
        accepted.  Other topic errors are the topic set's (raised as topic_mapping
        errors, for ``topic_errors`` to translate)."""
        limit = None if accepted else self._ctx.settings.quotas.ad_hoc_topics
        try:
            self._ctx.topic_set.admit_all(topics, limit=limit)
        except tm_errors.TopicSetFull as exc:
            raise self._full(exc.topic, exc.limit) from None

    @staticmethod
    def _full(topic: object, limit: int) -> errors.WsnError:
        return _refuse(
            errors.TopicNotSupported(
                f"topic {topic} is new and the broker's topic set holds its maximum of "
                f"{limit} topics beyond the declared ones (quotas.ad_hoc_topics)"
            ),
            500,  # a WS-N fault at a count bound, as the other count quotas
            "ad_hoc_topics",
        )

    def check_fanout(
        self, messages: Sequence[NotificationMessage], *, pull_point: str | None = None
    ) -> None:
        """Refuse a Notify whose payload bytes times their fan-out exceed
        ``quotas.notify_fanout_bytes``; a Notify sent to ``pull_point`` copies each
        payload once, into that pull point (as a broker's Notify reaching nobody)."""
        bound = self._ctx.settings.quotas.notify_fanout_bytes
        if bound is None or current_principal().method == "system":
            return
        registry = self._ctx.registry
        size = sum(len(m.payload) for m in messages)
        if pull_point is not None:
            if size > bound:
                raise _refuse(
                    errors.NotificationRefused(
                        f"this Notify would copy {size} bytes into pull point {pull_point} "
                        f"(its payload), more than quotas.notify_fanout_bytes ({bound})"
                    ),
                    413,
                    "notify_fanout_bytes",
                )
            return
        if size * max(1, len(registry.subscriptions)) <= bound:
            return
        now = self._ctx.now()
        with registry.lock:
            states = list(registry.subscriptions.values())
        copied = 0
        for m in messages:
            reach = sum(
                1
                for s in states
                if not is_expired(s.record.termination_time, now)
                and (
                    s.filter.topic is None
                    or (m.topic is not None and s.filter.topic.matches(m.topic))
                )
            )
            copied += len(m.payload) * max(1, reach)
        if copied > bound:
            raise _refuse(
                errors.NotificationRefused(
                    f"this Notify would copy {copied} bytes to its subscribers (payload x "
                    f"matching subscriptions), more than quotas.notify_fanout_bytes ({bound})"
                ),
                413,
                "notify_fanout_bytes",
            )
