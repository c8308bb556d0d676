"""How the RabbitMQ adapter reports failures: the adapter errors core understands.

:func:`refusal` tells a permanent refusal (credentials, vhost, permissions) from an
unreachable broker, :func:`outage` says why RabbitMQ is unreachable now (core's 503 and
``/readyz``) in words rather than pika's nested exception reprs, :func:`busy` turns a
connection's overload into ``MiddlewareBusy``, and :func:`run` runs a coroutine on a
connection's I/O thread with every failure turned into an adapter error, so that core
answers with a WS-N fault, never an internal error.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Coroutine, Sequence
from typing import Any

import pika
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorPhaseErrorBase,
    AMQPConnectorStackTimeout,
)
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
    kind = _refused(error)
    if error is None or kind is None:
        return None
    text = f"RabbitMQ at {where} refused the connection: {describe(error)}"
    return CredentialsRefused(text) if kind == "credentials" else AccessRefused(text)


def _refused(error: BaseException | None) -> str | None:
    """ "credentials" or "access" when ``error`` is RabbitMQ refusing the login or the
    vhost, else None."""
    if isinstance(
        error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.AuthenticationError
    ):
        return "credentials"
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return "access"
    code = getattr(error, "reply_code", None)
    if code == 403:  # ACCESS_REFUSED: a login refused, or no permission
        return "credentials" if "login" in describe(error).lower() else "access"
    if code == 530:  # NOT_ALLOWED: the vhost does not exist or the user may not use it
        return "access"
    return None


def outage(links: Sequence[Link], where: str) -> str | None:
    """Why RabbitMQ is unreachable, from the first of ``links`` that is down (None when
    all are up): what its last attempt met and, when that attempt followed a loss, why
    the connection was lost.  No I/O."""
    for link in links:
        if link.is_up:
            continue
        now = reason(link.last_error, where)
        lost = link.lost_reason
        if lost is not None and lost is not link.last_error:
            return f"{now} (before that, {reason(lost)})"
        return now
    return None


def reason(error: BaseException | None, where: str = "") -> str:
    """``error`` of a connection to RabbitMQ at ``where`` (an address without
    credentials; "": not named) in words: refused, closed by the broker, heartbeat
    missed, lost."""
    error = _root(error)
    rabbit = f"RabbitMQ at {where}" if where else "RabbitMQ"
    if error is None:
        return f"not connected to {rabbit} yet"
    kind = _refused(error)
    if kind == "credentials":
        return f"{rabbit} refused the gateway's credentials: {_reply(error)}"
    if kind == "access":
        return f"{rabbit} refused access to the vhost: {_reply(error)}"
    if isinstance(error, pika.exceptions.AMQPHeartbeatTimeout):
        return f"heartbeat missed: {rabbit} sent nothing in time ({describe(error)})"
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker):
        return f"{rabbit} closed the connection: {_reply(error)}"
    if isinstance(error, pika.exceptions.StreamLostError):
        return f"the connection to {rabbit} was lost: {describe(error)}"
    if isinstance(error, ConnectionRefusedError):
        return f"cannot connect to {rabbit}: connection refused"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host of {rabbit}: {error.strerror or error}"
    if isinstance(error, TimeoutError | AMQPConnectorStackTimeout):
        return f"cannot connect to {rabbit}: no answer in time"
    if isinstance(error, OSError) and error.strerror:
        return f"cannot connect to {rabbit}: {error.strerror}"
    return f"no connection to {rabbit}: {describe(error)}"


def _root(error: BaseException | None) -> BaseException | None:
    """The error inside pika's connection workflow wrappers (the socket's, the broker's)."""
    for _ in range(8):
        if isinstance(error, AMQPConnectionWorkflowFailed) and error.exceptions:
            error = error.exceptions[-1]
        elif isinstance(error, AMQPConnectorPhaseErrorBase):
            error = error.exception
        elif (
            error is not None
            and type(error) is pika.exceptions.AMQPConnectionError
            and error.args
            and isinstance(error.args[0], BaseException)
        ):
            error = error.args[0]
        else:
            break
    return error


def _reply(error: BaseException) -> str:
    """The broker's reply code and text in ``error`` (pika's "probable" errors carry the
    closing error's text as their argument)."""
    if isinstance(error, pika.exceptions.ConnectionClosed):
        return f"({error.reply_code}) {error.reply_text}"
    if error.args and isinstance(error.args[0], str):
        return error.args[0].removeprefix("ConnectionClosedByBroker: ")
    return describe(error)


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
