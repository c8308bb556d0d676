"""How the RabbitMQ adapter reports failures: the adapter errors core understands.

:func:`refusal` tells a permanent refusal (credentials, vhost, permissions) from an
unreachable broker, :func:`busy` turns a connection's overload into ``MiddlewareBusy``,
and :func:`run` runs a coroutine on a connection's I/O thread with every failure turned
into an adapter error, so that core answers with a WS-N fault, never an internal error.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

import pika
from wsnmom.core.adapter import (
    AccessRefused,
    AdapterError,
    AdapterUnavailable,
    CredentialsRefused,
    MiddlewareBusy,
    MiddlewareRefused,
    PublishFailed,
)

from ._link import ChannelError, Link, LinkBusy, LinkDown, describe

log = logging.getLogger("wsnmom.adapters.rabbitmq")


class PublishUnavailable(PublishFailed, AdapterUnavailable):
    """A publish could not even be attempted: no connection to RabbitMQ."""


def refusal(error: BaseException | None, where: str) -> MiddlewareRefused | None:
    """The permanent error for RabbitMQ refusing us (credentials, vhost, permissions),
    which no retry will change, or None when ``error`` means RabbitMQ is unreachable."""
    if error is None:
        return None
    text = f"RabbitMQ at {where} refused the connection: {describe(error)}"
    if isinstance(
        error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.AuthenticationError
    ):
        return CredentialsRefused(text)
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return AccessRefused(text)
    code = getattr(error, "reply_code", None)
    if code == 403:  # ACCESS_REFUSED: a login refused, or no permission
        if "login" in describe(error).lower():
            return CredentialsRefused(text)
        return AccessRefused(text)
    if code == 530:  # NOT_ALLOWED: the vhost does not exist or the user may not use it
        return AccessRefused(text)
    return None


def busy(error: LinkBusy) -> MiddlewareBusy:
    """The adapter error for an operation a connected RabbitMQ did not answer in time."""
    return MiddlewareBusy(
        f"RabbitMQ is connected but overloaded: {error}",
        retry_after=error.retry_after,
        backlog=error.waiting,
    )


def run(link: Link, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    """Run ``coro`` on ``link``'s I/O thread and wait up to ``timeout`` seconds.

    Failures become adapter errors: no connection or no answer -> AdapterUnavailable, a
    channel the broker closed -> AdapterUnavailable, anything else pika or the adapter
    raises (``NoFreeChannels``, a connection closed under the call) -> AdapterError.
    """
    try:
        return link.submit(coro, timeout)
    except AdapterError:
        raise
    except LinkBusy as exc:
        raise busy(exc) from exc
    except (LinkDown, TimeoutError) as exc:
        raise AdapterUnavailable(str(exc)) from exc
    except ChannelError as exc:
        raise AdapterUnavailable(f"RabbitMQ refused: {exc}") from exc
    except Exception as exc:
        log.warning("RabbitMQ operation failed: %r", exc)
        raise AdapterError(f"RabbitMQ operation failed: {describe(exc)}") from exc
