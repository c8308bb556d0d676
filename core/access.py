"""Who is calling the broker, and what that identity may do: ownership, topic ACLs and
per-identity quotas.

The frontend authenticates a request and binds its :class:`Principal` with
:func:`bound_principal` while core handles it; core reads it with
:func:`current_principal`.  Work that no client asked for (the lifetime sweep, recovery,
delivery threads, tests driving ``BrokerService`` directly) runs as :data:`SYSTEM`, the
default, which may do everything.

* **Ownership.**  A subscription, pull point or registration records the name of the
  identity that created it (``owner``; None = created anonymously, or before the gateway
  knew owners).  Only that identity or an admin may act on it or read it; anyone else is
  told exactly what an unknown id gets (:func:`may_manage`).
* **Topic ACLs.**  An identity may be restricted to topic patterns for Subscribe (and
  GetCurrentMessage) and for Notify (and RegisterPublisher).  A subscription's topic
  filter must lie within the Subscribe patterns (every topic it can select is allowed,
  :func:`~wsnmom.topic_mapping.model.pattern_covers`); a notification's topic must match a
  Notify pattern.  None means unrestricted.
* **Quotas.**  An identity's own bounds on live resources override the ``[quotas]``
  defaults (:class:`IdentityQuotas`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from wsnmom.topic_mapping.model import PathPattern, Topic, TopicExpression, pattern_covers

__all__ = [
    "ANONYMOUS",
    "PRINCIPAL",
    "SYSTEM",
    "IdentityQuotas",
    "Principal",
    "bound_principal",
    "current_principal",
    "may_manage",
]


@dataclass(frozen=True, slots=True)
class IdentityQuotas:
    """An identity's own bounds (None: the ``[quotas]`` setting applies)."""

    subscriptions: int | None = None
    pull_points: int | None = None
    registrations: int | None = None
    #: requests per second
    rate: float | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """An identity as core sees it.

    ``name`` is None for an anonymous caller.  ``method`` says how it was established
    ("anonymous", "basic", "bearer", "tls", "proxy", "wsse", "loopback", "system"); it is
    for logs and never decides anything.
    """

    name: str | None = None
    admin: bool = False
    #: topic patterns the identity may subscribe to (None: any)
    subscribe: tuple[PathPattern, ...] | None = None
    #: topic patterns the identity may notify on (None: any)
    notify: tuple[PathPattern, ...] | None = None
    quotas: IdentityQuotas = IdentityQuotas()
    method: str = "anonymous"

    @property
    def anonymous(self) -> bool:
        """True for a caller that gave no identity."""
        return self.name is None

    def __str__(self) -> str:
        return self.name if self.name is not None else "anonymous"

    def may_subscribe(self, expr: TopicExpression | None) -> bool:
        """Whether every topic ``expr`` can select is in the Subscribe ACL (None: a
        subscription without a topic filter, which selects every topic)."""
        allowed = self.subscribe
        if allowed is None or self.admin:
            return True
        if expr is None:
            return False
        return all(any(pattern_covers(a, p) for a in allowed) for p in expr.patterns)

    def may_read_topic(self, topic: Topic) -> bool:
        """Whether the identity may read ``topic`` (GetCurrentMessage, property lists)."""
        allowed = self.subscribe
        if allowed is None or self.admin:
            return True
        return any(a.matches(topic) for a in allowed)

    def may_notify(self, topic: Topic | None) -> bool:
        """Whether the identity may publish on ``topic`` (None: a topicless message,
        allowed only without a Notify ACL)."""
        allowed = self.notify
        if allowed is None or self.admin:
            return True
        return topic is not None and any(a.matches(topic) for a in allowed)

    def may_register(self, expr: TopicExpression | None) -> bool:
        """Whether a publisher registration for ``expr`` (None: every topic) lies within
        the Notify ACL."""
        allowed = self.notify
        if allowed is None or self.admin:
            return True
        if expr is None:
            return False
        return all(any(pattern_covers(a, p) for a in allowed) for p in expr.patterns)

    def may_see(self, topic: Topic) -> bool:
        """Whether ``topic`` may appear in the broker's property document for this
        identity: every topic for an identity without ACLs, else the topics its ACLs
        name (an unrestricted side of a one-sided ACL shows nothing)."""
        if self.admin or (self.subscribe is None and self.notify is None):
            return True
        return any(a.matches(topic) for acl in (self.subscribe, self.notify) if acl for a in acl)


#: a caller without an identity
ANONYMOUS = Principal()
#: the broker itself (background work, direct use of ``BrokerService``): may do everything
SYSTEM = Principal("wsnmom:system", admin=True, method="system")

#: the caller of the request being handled; :func:`bound_principal` sets it (the SOAP
#: frontend's hot path sets and resets it directly)
PRINCIPAL: ContextVar[Principal] = ContextVar("wsnmom_principal", default=SYSTEM)
_principal = PRINCIPAL


def current_principal() -> Principal:
    """The identity of the request being handled (:data:`SYSTEM` outside requests)."""
    return _principal.get()


@contextmanager
def bound_principal(principal: Principal) -> Iterator[None]:
    """Make ``principal`` the caller of whatever core does inside the block."""
    token = _principal.set(principal)
    try:
        yield
    finally:
        _principal.reset(token)


def may_manage(principal: Principal, owner: str | None) -> bool:
    """Whether ``principal`` may act on (and read) a resource owned by ``owner``."""
    return principal.admin or principal.name == owner
