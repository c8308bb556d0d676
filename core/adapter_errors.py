"""The adapter contract's failures: the exceptions an adapter raises, which core tells apart.

``AdapterUnavailable`` (retry later), ``MiddlewareBusy`` (overloaded, answer 503 with
``Retry-After``), ``MiddlewareRefused`` and its kinds (an operator must act),
``DirectoryInUse``, ``PublishFailed`` and ``TopicUnavailable``.  Part of the contract in
:mod:`wsnmom.core.adapter`, which re-exports every name; plugin authors import them from
there.
"""

from __future__ import annotations


class AdapterError(Exception):
    """Base class of adapter failures."""


class AdapterUnavailable(AdapterError):
    """The middleware cannot be reached now (connection lost, not yet open).

    Retrying may help, unless it is a :class:`MiddlewareRefused`: the middleware answered
    and turned the gateway away, which needs an operator."""


class MiddlewareBusy(AdapterError):
    """The middleware is connected but did not answer in time: it is overloaded, not
    unreachable (never an ``AdapterUnavailable``).  ``retry_after`` (seconds) is the
    adapter's estimate of when the backlog in front of the operation will have cleared;
    ``backlog`` how many operations were waiting (None when the adapter cannot tell).
    Core answers a ResourceUnavailableFault of its own text, HTTP 503 with that
    ``Retry-After``, and does not treat the middleware as down."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, backlog: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.backlog = backlog


class MiddlewareRefused(AdapterError):
    """The middleware answered but will not serve the gateway; retrying does not help
    (not an ``AdapterUnavailable``: a gateway does not keep waiting for it)."""


class CredentialsRefused(MiddlewareRefused):
    """Wrong user name, password or client certificate."""


class AccessRefused(MiddlewareRefused):
    """The credentials were accepted but the virtual host / namespace does not exist or
    the user may not use it."""


class DirectoryInUse(AdapterError):
    """A directory the adapter keeps (its queues, its session state) is held by another
    process; waiting would not help (not an ``AdapterUnavailable``): another gateway uses
    that data directory."""


class PublishFailed(AdapterError):
    """The middleware did not confirm a publish (nacked, timed out, rejected)."""


class TopicUnavailable(AdapterError):
    """The middleware has no place for this topic and will not create one (e.g. a Kafka
    topic that must exist already, an MQTT name past 65,535 bytes); core answers
    TopicNotSupportedFault to the Notify or Subscribe that needed it."""
