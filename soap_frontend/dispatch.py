"""SOAP request handling, independent of Flask: ``soap_post`` turns one POST to a WS-N
endpoint into a :class:`Reply`, calling the broker through ``core.ports.BrokerPort``.

The Flask views (:mod:`.app`) and the WSGI fast path (:mod:`.fastpath`) both call it, so
they give the same answers.

Dispatch is on the QName of the Body's first child; ``wsa:Action`` is not required and not
checked.  Here: who the caller is, the request rate, an older wire format's rewriting, the
answer and the fault as HTTP replies, long polls.  Which resource a request addresses and
the broker call of each operation: :mod:`.broker_calls`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lxml import etree
from wsnmom.core import errors, metrics
from wsnmom.core.access import ANONYMOUS, PRINCIPAL, Principal
from wsnmom.core.config import Settings
from wsnmom.core.guard import refusals
from wsnmom.core.log_context import bound_request_id
from wsnmom.core.model import EndpointReference, InboundNotification, SoapVersion
from wsnmom.core.ports import BrokerPort

from . import codec, legacy_answers, legacy_faults, settled_answers
from .auth import FORWARDED_ADDRESS_KEY, Authenticator
from .broker_calls import Role, broker_address, run_operation
from .codec import Op
from .envelope import (
    HttpError,
    SoapProtocolErrorWithContext,
    SoapRequest,
    content_type_for,
    envelope_bytes,
    parse_request,
    version_for_media_type,
)
from .faults import (
    BaseFaultError,
    authentication_fault,
    count_fault,
    count_request,
    fault_for_error,
    invalid_requests,
    transport_fault,
)
from .hashing import PasswordChecksBusy
from .identity import AuthenticationFailed
from .legacy import Legacy, recognise
from .legacy_requests import Answered, to_current
from .long_poll import PARK, Poll, Poller, WaitFor
from .message_info import apply_app_headers, trace_headers
from .ratelimit import RateLimiter
from .settled_answers import Settlements
from .splice import Spliced
from .wsse import TokenRejected, find_username_token

__all__ = ["Frontend", "Posted", "Reply", "SoapHandler", "soap_post", "transport_reply"]


@dataclass(slots=True)
class Frontend:
    """What the blueprints need, kept in ``app.extensions["wsnmom.soap"]``."""

    service: BrokerPort
    settings: Settings | None
    #: who the caller is (also ``app.extensions["wsnmom.auth"]``)
    auth: Authenticator = field(default_factory=lambda: Authenticator(None))
    #: request-rate quotas
    limiter: RateLimiter = field(default_factory=lambda: RateLimiter(None, False))
    #: retries the long polls (ONVIF's PullMessages) without their request threads
    poller: Poller = field(default_factory=Poller)
    #: where Notify posted to ``/wsn/upstream/<key>`` goes (``wsnmom.upstreams``): called
    #: with the key and the messages; raises ResourceUnknown for an unknown key
    relay: Callable[[str, Sequence[InboundNotification]], None] | None = None


#: what a handler answers: a Body child (None: one-way) and the response's wsa:Action
Result = tuple[etree._Element | Spliced | None, str | None]


class SoapHandler(Protocol):
    """The operations of an endpoint that is not one of WS-N's (the ONVIF event service,
    :mod:`.onvif`): soap_post authenticates, parses, limits and renders faults for it."""

    def operation_name(self, operation: str) -> str:
        """The ``operation`` label of the request metric ("unknown" when not served)."""
        ...

    def handle(self, req: SoapRequest, environ: Mapping[str, Any] | None) -> Result:
        """Answer ``req`` (core errors become faults), or raise :class:`WaitFor`."""
        ...


@dataclass(frozen=True, slots=True)
class Reply:
    """The HTTP answer to a SOAP POST: status, body, the full Content-Type value and any
    other headers."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()
    #: what the answer carries unsettled (GetMessages): settled once it was written
    settlements: Settlements | None = None


#: Flask's default Content-Type of a Response without one (the body-less 202 of one-ways)
_DEFAULT_CONTENT_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Posted:
    """One SOAP request as whatever received it (the Flask views, the WSGI fast path)
    hands it to :func:`soap_post`: the endpoint it was posted to (``role``, and the
    resource's id in the path), the HTTP method, Content-Type, body, path and query
    string, the WSGI environ (credentials, client address), and ``handler``, whose
    operations are served instead of WS-N's (the ONVIF event service)."""

    role: Role
    resource_id: str | None
    method: str
    content_type: str | None
    data: bytes
    path: str
    args: Mapping[str, str]
    environ: Mapping[str, Any] | None = None
    handler: SoapHandler | None = None


def soap_post(fe: Frontend, post: Posted) -> Reply:
    """Handle one SOAP request.  Independent of Flask's request context, so that the WSGI
    fast path (:mod:`.fastpath`) and the Flask view give the same answers.  A handler
    (``post.handler``) that raises :class:`WaitFor` is answered when its retry answers,
    by the poller, without this thread when the server can park the request
    (:mod:`.long_poll`).  A GetMessages answer carries its messages unsettled
    (``Reply.settlements``): the server settles them once it wrote the answer
    (:mod:`.settled_answers`); a fault gives them back."""
    with settled_answers.collecting() as taken:
        try:
            reply = _soap_post(fe, post)
        except BaseException:
            taken.give_back()
            raise
    return _carrying(reply, taken)


def _carrying(reply: Reply, taken: Settlements) -> Reply:
    """``reply`` carrying what its answer took unsettled (``taken``), settled once it is
    sent; a fault takes nothing: given back.  A reply that already carries settlements
    (a long poll's, :func:`_long_poll`) keeps them."""
    if not taken:
        return reply
    if reply.status != 200:  # a fault: nothing was handed out
        taken.give_back()
        return reply
    return dataclasses.replace(reply, settlements=taken)


def _parsed(fe: Frontend, post: Posted) -> SoapRequest | Reply:
    """The request's envelope, or the answer that refuses it (not SOAP, not usable)."""
    try:
        return parse_request(post.method, post.content_type, post.data)
    except HttpError as exc:
        invalid_requests.info("rejected", "rejected request to %s: %s", post.path, exc.message)
        return transport_reply(fe, exc, post.content_type)
    except SoapProtocolErrorWithContext as exc:
        invalid_requests.info("unusable", "unusable SOAP request to %s: %s", post.path, exc)
        return _fault(fe, BaseFaultError(str(exc)), exc.version, exc.addressing.message_id)


def _soap_post(fe: Frontend, post: Posted) -> Reply:
    """``soap_post`` without the settlement of what the answer carries."""
    auth = fe.auth
    principal: Principal = ANONYMOUS
    environ, handler = post.environ, post.handler
    if post.role is Role.UPSTREAM:
        # the producer cannot authenticate here: the unguessable key in the path is what
        # admits its Notify, which is published as the gateway's own (SYSTEM)
        return _upstream_post(fe, post)
    if auth.enabled and environ is not None:
        caller = _http_caller(fe, post.content_type, environ)
        if isinstance(caller, Reply):
            return caller
        principal = caller
    req = _parsed(fe, post)
    if isinstance(req, Reply):
        return req
    if auth.enabled and principal.anonymous:
        caller = _wsse_caller(fe, req, principal)
        if isinstance(caller, Reply):
            return caller
        principal = caller
    legacy = recognise(req)  # an older WS-N wire format: rewritten into 1.3 here
    if legacy is not None:
        try:
            req = to_current(legacy[0], req, legacy[1])
        except Answered as answered:  # no 1.3 request stands for it (a producer's Resume)
            count_request(legacy[1])
            return _answer(req, answered.element, None, legacy)
        except Exception as exc:
            count_request(legacy[1])
            return _fault(fe, exc, req.version, req.addressing.message_id, legacy)
    op = codec.OPERATIONS.get(req.operation)
    if handler is not None:
        count_request(handler.operation_name(req.operation))
    else:
        count_request(op.local if op else "unknown")
    if fe.limiter.enabled:
        refused = fe.limiter.check(principal, _client_address(environ))
        if refused is not None:
            return _rate_limited(fe, req, principal, *refused)
    bound = PRINCIPAL.set(principal)  # core reads the caller from here
    try:
        if handler is not None:
            result, action = handler.handle(req, environ)
        else:
            if op is None:
                raise BaseFaultError(f"unsupported operation {req.operation}")
            result = run_operation(
                fe.service, post.role, post.resource_id, op, req, post.args, environ
            )
            action = codec.response_action(op)
    except WaitFor as wait:
        return _long_poll(fe, req, principal, wait, environ)
    except Exception as exc:
        return _failed(fe, req, exc, legacy)
    finally:
        PRINCIPAL.reset(bound)
    return _answer(req, result, action, legacy)


def _client_address(environ: Mapping[str, Any] | None) -> str | None:
    """The client's address for the rate limit: of a request another instance forwarded,
    its client's (``pull_forward``), else the peer's."""
    if environ is None:
        return None
    address = environ.get(FORWARDED_ADDRESS_KEY) or environ.get("REMOTE_ADDR")
    return str(address) if address is not None else None


def _http_caller(
    fe: Frontend, content_type: str | None, environ: Mapping[str, Any]
) -> Principal | Reply:
    """The caller by HTTP credentials, or the fault that refuses the request (none given
    where they are required and WS-Security cannot give them either)."""
    auth = fe.auth
    try:
        principal = auth.http_caller(environ)
    except PasswordChecksBusy as exc:
        return _busy(fe, version_for_media_type(content_type), exc)
    except AuthenticationFailed:
        return _unauthorized(fe, version_for_media_type(content_type), None)
    if principal.anonymous and auth.required and not auth.wsse:
        metrics.AUTH_FAILURES.labels(reason="missing").inc()
        return _unauthorized(fe, version_for_media_type(content_type), None)
    return principal


def _wsse_caller(fe: Frontend, req: SoapRequest, principal: Principal) -> Principal | Reply:
    """The caller by a WS-Security UsernameToken in ``req`` (``principal`` when it has
    none), or the fault that refuses the request."""
    auth = fe.auth
    try:
        token = find_username_token(req.addressing.other_headers)
        if token is not None:
            principal = auth.wsse_caller(token)
    except TokenRejected:
        metrics.AUTH_FAILURES.labels(reason="wsse").inc()
        return _unauthorized(fe, req.version, req.addressing.message_id)
    except PasswordChecksBusy as exc:
        return _busy(fe, req.version, exc)
    except AuthenticationFailed:
        return _unauthorized(fe, req.version, req.addressing.message_id)
    if principal.anonymous and auth.required:
        metrics.AUTH_FAILURES.labels(reason="missing").inc()
        return _unauthorized(fe, req.version, req.addressing.message_id)
    return principal


def _answer(
    req: SoapRequest,
    result: etree._Element | Spliced | None,
    action: str | None,
    legacy: tuple[Legacy, str] | None = None,
) -> Reply:
    if result is None:  # one-way
        return Reply(202, b"", _DEFAULT_CONTENT_TYPE)
    if legacy is not None:  # answered in the older wire format the request came in
        answer = legacy_answers.response(legacy[0], result)
        element = answer.element if isinstance(answer, Spliced) else answer
        legacy_action = legacy[0].action(str(element.tag))
        data = legacy_answers.envelope_bytes(
            legacy[0],
            req.version,
            answer,
            action=legacy_action,
            relates_to=req.addressing.message_id,
        )
        return Reply(200, data, content_type_for(req.version, legacy_action))
    data = envelope_bytes(req.version, result, action=action, relates_to=req.addressing.message_id)
    return Reply(200, data, content_type_for(req.version, action))


def _failed(
    fe: Frontend, req: SoapRequest, exc: Exception, legacy: tuple[Legacy, str] | None = None
) -> Reply:
    if isinstance(exc, errors.WsnError):
        _fault_line(exc, req)
    return _fault(fe, exc, req.version, req.addressing.message_id, legacy)


def _long_poll(
    fe: Frontend,
    req: SoapRequest,
    principal: Principal,
    wait: WaitFor,
    environ: Mapping[str, Any] | None,
) -> Reply:
    """Retry ``wait`` on the poller until it answers (or its deadline passes); without
    this thread when the server can park the request."""

    request_id = environ.get("wsnmom.request_id") if environ is not None else None

    def attempt(final: bool) -> Reply | None:
        # on the poller's thread: as the caller, logging with the request's id; what the
        # answer takes is settled once it is sent (given back if its client is gone)
        bound = PRINCIPAL.set(principal)
        try:
            with bound_request_id(request_id), settled_answers.collecting() as taken:
                try:
                    found = wait.attempt(final)
                    reply = None if found is None else _answer(req, *found)
                except Exception as exc:
                    taken.give_back()
                    return _failed(fe, req, exc)
                if reply is None:
                    taken.give_back()
                    return None
            reply = _carrying(reply, taken)
            if reply.settlements is not None:
                poll.unanswered = reply.settlements.give_back
            return reply
        finally:
            PRINCIPAL.reset(bound)

    poll: Poll[Reply] = Poll(attempt, wait.deadline, request_id=request_id)
    park = environ.get(PARK) if environ is not None else None
    if park is None:
        return fe.poller.wait(poll)
    poller = fe.poller
    poll.begin = lambda: poller.add(poll)
    park(poll)  # raises Parked: the server answers poll.reply later
    raise AssertionError("the park function returned")  # pragma: no cover


def _upstream_post(fe: Frontend, post: Posted) -> Reply:
    """A Notify from an upstream producer (the only operation of that endpoint; the
    resource id is the upstream's key)."""
    key, environ = post.resource_id, post.environ
    req = _parsed(fe, post)
    if isinstance(req, Reply):
        return req
    op = codec.OPERATIONS.get(req.operation)
    count_request(op.local if op else "unknown")
    try:
        if op is not Op.NOTIFY:
            raise BaseFaultError(
                f"{req.operation} is not an operation of this endpoint: it takes Notify only"
            )
        if fe.relay is None or not key:
            raise errors.ResourceUnknown("no upstream subscription delivers here")
        messages = codec.parse_notify(req.body)
        others = req.addressing.other_headers
        if others:
            messages = codec.apply_hops(others, messages)
        messages = apply_app_headers(others, messages, trace_headers(environ))
        fe.relay(key, messages)
    except Exception as exc:
        if isinstance(exc, errors.WsnError):
            _fault_line(exc, req)
        return _fault(fe, exc, req.version, req.addressing.message_id)
    return Reply(202, b"", _DEFAULT_CONTENT_TYPE)


def _fault_line(exc: errors.WsnError, req: SoapRequest) -> None:
    """The ``wsnmom.soap.invalid`` line of a WS-N fault (throttled per fault)."""
    invalid_requests.info(
        exc.fault_name, "%s on %s: %s", exc.fault_name, req.operation, exc.description
    )


def _unauthorized(fe: Frontend, version: SoapVersion | None, relates_to: str | None) -> Reply:
    """HTTP 401 with the challenge and a ``wsse:FailedAuthentication`` fault that says
    nothing about why (the reason is in the ``wsnmom.auth`` log): not even whether the
    envelope was read, so it never relates to the request's MessageID."""
    version = version or SoapVersion.SOAP11
    fault, action = authentication_fault(version)
    count_fault("FailedAuthentication")
    data = envelope_bytes(version, fault, action=action)
    return Reply(401, data, content_type_for(version, action), fe.auth.challenge_headers())


def _busy(fe: Frontend, version: SoapVersion | None, exc: PasswordChecksBusy) -> Reply:
    """HTTP 503 with ``Retry-After``: the password could not be checked now (too many
    checks in flight); says nothing about the credentials."""
    metrics.AUTH_FAILURES.labels(reason="busy").inc()
    refusals.warning("hash:busy", "password check refused: %s", exc)
    busy = errors.ResourceUnavailable(
        "too many password checks in flight; retry shortly", retry_after=1.0
    )
    return _fault(fe, busy, version or SoapVersion.SOAP11, None)


def _rate_limited(
    fe: Frontend, req: SoapRequest, principal: Principal, quota: str, wait: float
) -> Reply:
    metrics.QUOTA_REFUSALS.labels(quota=quota).inc()
    refusals.warning(
        f"{principal}:{quota}", "request rate of %s exceeds quotas.%s", principal, quota
    )
    exc = errors.ResourceUnavailable(
        f"too many requests: the request rate exceeds quotas.{quota}; retry after {wait:g} s",
        retry_after=wait,
    )
    exc.http_status = 429
    return _fault(fe, exc, req.version, req.addressing.message_id)


def transport_reply(fe: Frontend | None, exc: HttpError, content_type: str | None) -> Reply:
    """A request refused before SOAP processing: its HTTP status with a SOAP fault."""
    now, originator = _fault_context(fe)
    answer = transport_fault(exc, content_type, now=now, originator=originator)
    return Reply(answer.status, answer.body, answer.content_type, answer.headers)


def _fault_context(fe: Frontend | None) -> tuple[datetime, EndpointReference | None]:
    """The Timestamp and Originator of a fault."""
    try:
        assert fe is not None
        return fe.service.now(), EndpointReference(broker_address(fe.service))
    except Exception:
        return datetime.now(UTC), None


def _fault(
    fe: Frontend,
    exc: BaseException,
    version: SoapVersion,
    relates_to: str | None,
    legacy: tuple[Legacy, str] | None = None,
) -> Reply:
    """The fault answering ``exc``; in an older WS-N version's form for ``legacy``
    (version, kind of request)."""
    now, originator = _fault_context(fe)
    if legacy is None:
        fault, action, rendered = fault_for_error(exc, version, now=now, originator=originator)
        data = envelope_bytes(version, fault, action=action, relates_to=relates_to)
    else:
        fault, action, rendered = legacy_faults.fault(
            legacy[0], exc, version, legacy[1], now=now, originator=originator
        )
        data = legacy_answers.envelope_bytes(
            legacy[0], version, fault, action=action, relates_to=relates_to
        )
    count_fault(rendered.fault_name)
    exc = rendered  # the fault an error stands for (a full disk: ResourceUnavailable)
    retry_after = getattr(exc, "retry_after", None)
    status = getattr(exc, "http_status", None) or 500
    if retry_after is not None and (status != 500 or isinstance(exc, errors.ResourceUnavailable)):
        # temporary (middleware unreachable: 503; request rate: 429): come back later
        seconds = str(max(1, math.ceil(retry_after)))
        if status == 500:
            status = 503
        return Reply(status, data, content_type_for(version, action), (("Retry-After", seconds),))
    return Reply(status, data, content_type_for(version, action))
