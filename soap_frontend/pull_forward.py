"""WSGI middleware: a request to a pull point goes to the instance that reads it.

In a cluster on a middleware without a pull of its own, one instance reads each pull
point (``core.pull_owners``).  A POST to ``/wsn/pullpoints/<id>`` (GetMessages,
DestroyPullPoint, Notify, properties), or to an ONVIF pull-point subscription
``/onvif/subscriptions/<id>`` (PullMessages, SetSynchronizationPoint, Renew, Unsubscribe:
read where the pull point the subscription feeds is read), or to the broker or the ONVIF
event service with one of those addresses in ``wsa:To`` (parsed only when the body holds
such a path), or naming a pull point by the ``wsnmom:ResourceId`` reference parameter its
EPR carries (the store says whether the id is a pull point's), that arrives at another
instance is sent on to the reading instance's address (``cluster.address``, from the
store's instance table), and its answer relayed as it came: status, body,
``Retry-After`` and the reader's ``WSNMOM-Instance`` (the instance that read the
messages).  While no live instance reads the pull point (a hand-over), the
answer is ResourceUnavailableFault, HTTP 503 with ``Retry-After``, as for every "try
again" of the gateway; so is a reader that cannot be reached, or whose answer could not be
read whole: the reader settles a GetMessages answer's messages only once its server wrote
the whole answer to this instance (``soap_frontend.settled_answers``), so they come again.
An operator's purge or peek through the admin API is sent on the same way
(:meth:`PullForward.relay`, called by ``admin_forward`` once the admin was authorised
where the request arrived).

A forwarded request is signed under the cluster's secret (``forward_signature``).  An
instance serves a request whose :data:`FORWARD_HEADER` verifies itself, never forwarding
it again; a header that does not verify (a client's, one too old) is refused with HTTP
403, and so is one whose nonce was seen before (a replay, to this instance or any other:
the nonce is recorded in the store, ``PullOwners.first_use``).  While the store cannot
say which pull point an ONVIF subscription feeds, give the cluster's secret or record a
nonce, the answer is 503 (never served where the pull point may not be read).
The client's own credentials travel with the request: the reading instance authenticates
and authorises the client as any instance would.  A client known without an
``Authorization`` header (its TLS certificate, a trusted proxy's identity header) is named
in :data:`FORWARDED_IDENTITY_HEADER`, which the signature covers: the reader takes that
identity (``auth.FORWARDED_IDENTITY_KEY``).  An admin action names the admin the
forwarding instance authorised there (method ``admin``; taken on admin paths only,
``auth.FORWARDED_ADMIN_KEY``).  The client's address goes in
:data:`FORWARDED_FOR_HEADER`, also signed: the reader's per-address rate limits count it
(``auth.FORWARDED_ADDRESS_KEY``).

Only a pull point's own path (or an ONVIF subscription's), or one named in ``wsa:To`` or
by ``ResourceId``, is forwarded; its body, chunked too, is read whole first
(``whole_body``; over the limit it is left to the application).  Of the reader's answer only
its own headers are relayed (:data:`_RELAYED`).  Connecting to the reader waits
:data:`CONNECT_TIMEOUT`, its answer :data:`TIMEOUT` (an ONVIF PullMessages, which may
wait up to ``onvif.MAX_TIMEOUT`` for a message, that much longer).  An ``https://``
reader's certificate is checked against the CA bundle outbound HTTPS uses
(``outbound_http.ca_bundle``).
"""

from __future__ import annotations

import http.client
import logging
import math
import secrets
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from wsnmom.core import errors
from wsnmom.core.addresses import BROKER_PATH, ResourceKind, parse_resource_path, resource_path
from wsnmom.core.model import SoapVersion
from wsnmom.core.pull_owners import PullOwners, Reader

from .auth import FORWARDED_ADDRESS_KEY, FORWARDED_ADMIN_KEY, FORWARDED_IDENTITY_KEY
from .dispatch import transport_reply
from .envelope import (
    HttpError,
    content_type_for,
    envelope_bytes,
    parse_request,
    version_for_media_type,
)
from .faults import count_fault, fault_for_error
from .forward_signature import (
    FORWARD_HEADER,
    FORWARDED_FOR_HEADER,
    FORWARDED_IDENTITY_HEADER,
    WINDOW,
    sign,
    target_path,
    verify,
)
from .long_poll import RESUMED
from .onvif import EVENT_SERVICE_PATH, MAX_TIMEOUT, SUBSCRIPTIONS_PATH, subscription_id_of
from .outbound_http import OutboundEnvironment, verifying_context
from .whole_body import read_whole

__all__ = [
    "CONNECT_TIMEOUT",
    "TIMEOUT",
    "PullForward",
    "Relayed",
    "identity_value",
]

log = logging.getLogger("wsnmom.soap.pull_forward")

#: the WSGI environ keys of the forwarding headers (``forward_signature``)
_ENVIRON_KEY = "HTTP_WSNMOM_FORWARDED"
_IDENTITY_ENVIRON_KEY = "HTTP_WSNMOM_FORWARDED_IDENTITY"
_ADDRESS_ENVIRON_KEY = "HTTP_WSNMOM_FORWARDED_FOR"
#: seconds to wait for the reading instance's answer
TIMEOUT = 30.0
#: seconds to wait for the answer to a forwarded ONVIF request: a PullMessages may wait
#: for a message up to its Timeout (at most ``onvif.MAX_TIMEOUT``)
ONVIF_TIMEOUT = MAX_TIMEOUT.total_seconds() + TIMEOUT
#: the identity method naming the admin a forwarding instance authorised
ADMIN_METHOD = "admin"
#: the admin API's paths (an admin identity named in a forward is taken there only)
ADMIN_PREFIX = "/wsn/admin/"
#: endpoints whose requests name their pull point in ``wsa:To`` (when they name one)
_SHARED_ENDPOINTS = frozenset({BROKER_PATH, EVENT_SERVICE_PATH})
#: what a body naming a pull point or an ONVIF subscription holds
_PULL_POINT_MARK = resource_path(ResourceKind.PULL_POINT, "").encode()
_ONVIF_MARK = (SUBSCRIPTIONS_PATH + "/").encode()
#: the local name of the reference parameter the broker's EPRs carry
_ID_MARK = b"ResourceId"
#: the environ key marking a forwarded request whose signature and nonce were checked
_VERIFIED = "wsnmom.forward.verified"
#: seconds to wait for a connection to the reading instance (TLS handshake included): a
#: silent host (dead, its lease not run out yet) holds a request thread no longer
CONNECT_TIMEOUT = 2.0
#: request headers sent on with a forwarded request
_SENT_ON = {
    "CONTENT_TYPE": "Content-Type",
    "HTTP_SOAPACTION": "SOAPAction",
    "HTTP_AUTHORIZATION": "Authorization",
    "HTTP_HOST": "Host",
    "HTTP_ACCEPT": "Accept",
}
#: response headers relayed (the answer's own; never the reader's connection, server,
#: cookies or other internals; ``X-Request-Id`` and ``Content-Length`` are set again here)
_RELAYED = {"content-type", "retry-after", "wsnmom-instance", "www-authenticate", "allow"}

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
#: the identity (name, method) of a request's client known without an Authorization
#: header, or None (anonymous)
IdentityOf = Callable[[dict[str, Any]], "tuple[str, str] | None"]


def identity_value(identity: tuple[str, str]) -> str:
    """The :data:`FORWARDED_IDENTITY_HEADER` value naming ``(name, method)``."""
    name, method = identity
    return f"{method} {quote(name, safe='')}"


def _identity_of_value(value: str) -> tuple[str, str] | None:
    method, _, name = value.partition(" ")
    return (unquote(name), method) if method and name else None


@dataclass(frozen=True, slots=True)
class Relayed:
    """The reading instance's answer to a forwarded request: status line, the headers
    relayed (:data:`_RELAYED`) and the body."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


class PullForward:
    """Wraps a WSGI application (see the module docstring)."""

    def __init__(
        self,
        app: WsgiApp,
        readers: PullOwners | None,
        max_body: int | None,
        identity: IdentityOf | None = None,
    ) -> None:
        self.app = app
        self.readers = readers
        self.max_body = max_body
        #: the identity this instance establishes for a client without Authorization
        self.identity = identity
        self._tls: ssl.SSLContext | None = None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        if RESUMED in environ or _VERIFIED in environ:
            # a parked long poll run again (``long_poll``): its first run was let through
            # here (and a forwarded one verified, its nonce spent), its body read
            return self.app(environ, start_response)
        claimed = environ.get(_ENVIRON_KEY)
        readers = self.readers
        if claimed is not None:
            return self._forwarded(environ, start_response, str(claimed))
        if readers is None or not readers.active or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        path = str(environ.get("PATH_INFO") or "")
        try:
            pull_point_id = self._pull_point_of(readers, path)
        except errors.ResourceUnavailable as exc:
            return self._fault(environ, start_response, exc)
        if pull_point_id is None and path not in _SHARED_ENDPOINTS:
            return self.app(environ, start_response)
        body = read_whole(environ, self.max_body)
        if body is None:  # no plain Content-Length within the limit: answered here
            return self.app(environ, start_response)
        try:
            if pull_point_id is None:
                pull_point_id = self._addressed(readers, environ, body)
            reader = None if pull_point_id is None else readers.reader(pull_point_id)
        except errors.ResourceUnavailable as exc:
            return self._fault(environ, start_response, exc)
        if reader is None or pull_point_id is None or reader.here:
            return self.app(environ, start_response)
        return self._forward(environ, start_response, reader, pull_point_id, body)

    def _pull_point_of(self, readers: PullOwners, path: str) -> str | None:
        """The pull point a request to ``path`` reads: a pull point's own path, or an
        ONVIF pull-point subscription's (its pull point); None: answered here.

        :raises errors.ResourceUnavailable: the store cannot say which pull point the
            subscription feeds (retry later)
        """
        found = parse_resource_path(path)
        if found is not None and found[0] is ResourceKind.PULL_POINT:
            # only a pull point's own path: a client never picks where a signed request goes
            if path.rstrip("/") == resource_path(ResourceKind.PULL_POINT, found[1]):
                return found[1]
            return None
        subscription_id = subscription_id_of(path)
        if subscription_id is None:
            return None
        try:
            return readers.pull_point_fed_by(subscription_id)
        except Exception as exc:  # the store: never answered where it may not be read
            log.warning("finding the pull point of %s failed: %s", path, exc)
            raise errors.ResourceUnavailable(
                f"the store does not answer: {exc}; retry later", retry_after=readers.retry_after
            ) from exc

    def _addressed(self, readers: PullOwners, environ: dict[str, Any], body: bytes) -> str | None:
        """The pull point a request to a shared endpoint (the broker, the ONVIF event
        service) names: in ``wsa:To`` (a pull point's address or an ONVIF subscription's)
        or, when ``wsa:To`` names no pull point, by an echoed ``wsnmom:ResourceId``
        reference parameter that is a pull point's id (the order the broker resolves a
        request's resource in).  Only a body that holds such a path or that parameter's
        name is parsed (not a Notify's, unless its payload quotes one).

        :raises errors.ResourceUnavailable: the store cannot say whether the
            ``ResourceId`` names a pull point (retry later)
        """
        if _PULL_POINT_MARK not in body and _ONVIF_MARK not in body and _ID_MARK not in body:
            return None
        try:
            addressing = parse_request("POST", environ.get("CONTENT_TYPE"), body).addressing
            target = urlsplit(addressing.to).path if addressing.to else ""
        except Exception:  # malformed: the application answers its fault
            return None
        if target and target not in _SHARED_ENDPOINTS:
            found = self._pull_point_of(readers, target)
            if found is not None:
                return found
        named = addressing.resource_id
        if named is None:
            return None
        try:
            return named if readers.is_pull_point(named) else None
        except Exception as exc:  # the store: never answered where it may not be read
            log.warning("finding whether %s is a pull point failed: %s", named, exc)
            raise errors.ResourceUnavailable(
                f"the store does not answer: {exc}; retry later", retry_after=readers.retry_after
            ) from exc

    # -- a request another instance forwarded --------------------------------------------
    def _forwarded(self, environ: dict[str, Any], start_response: StartResponse, value: str) -> Any:
        readers = self.readers
        path = str(environ.get("PATH_INFO") or "")
        body = read_whole(environ, self.max_body)
        named = str(environ.get(_IDENTITY_ENVIRON_KEY) or "")
        address = str(environ.get(_ADDRESS_ENVIRON_KEY) or "")
        method = str(environ.get("REQUEST_METHOD") or "")
        verified = None
        if readers is not None and readers.clustered and body is not None:
            try:
                secret = readers.secret()
            except Exception as exc:  # the store: nothing can be checked now
                log.warning("reading the cluster's secret failed: %s", exc)
                return self._fault(environ, start_response, self._store_down(readers, exc))
            verified = verify(
                secret,
                value,
                method,
                target_path(environ),
                body,
                named,
                address,
                time.time(),
            )
        if verified is None:
            log.info("refused a request to %s: its %s does not verify", path, FORWARD_HEADER)
            why = f"the {FORWARD_HEADER} header is for the cluster's instances"
            return self._refused(environ, start_response, why)
        assert readers is not None
        moment, nonce = verified
        try:
            first = readers.first_use(nonce, moment + WINDOW)
        except Exception as exc:
            log.warning("recording a forwarded request's nonce failed: %s", exc)
            return self._fault(environ, start_response, self._store_down(readers, exc))
        if not first:
            log.warning(
                "refused a replayed request to %s: the nonce of its %s was used before",
                path,
                FORWARD_HEADER,
            )
            return self._refused(
                environ,
                start_response,
                f"replayed: this {FORWARD_HEADER} request (nonce {nonce}) was served before "
                "(or is older by the store's clock than a nonce is kept)",
            )
        environ[_VERIFIED] = True
        identity = _identity_of_value(named)
        if identity is not None:
            name, identity_method = identity
            if identity_method != ADMIN_METHOD:
                environ[FORWARDED_IDENTITY_KEY] = identity
            elif path.startswith(ADMIN_PREFIX):
                environ[FORWARDED_ADMIN_KEY] = name
        if address:
            environ[FORWARDED_ADDRESS_KEY] = address
        return self.app(environ, start_response)

    @staticmethod
    def _store_down(readers: PullOwners, exc: Exception) -> errors.ResourceUnavailable:
        """The "try again" of a forwarded request the store's failure leaves unchecked."""
        return errors.ResourceUnavailable(
            f"the store does not answer: {exc}; retry later", retry_after=readers.retry_after
        )

    def _refused(
        self, environ: dict[str, Any], start_response: StartResponse, why: str
    ) -> list[bytes]:
        """HTTP 403 with a Sender fault saying ``why``."""
        reply = transport_reply(None, HttpError(403, why), environ.get("CONTENT_TYPE"))
        start_response(
            "403 Forbidden",
            [
                ("Content-Type", reply.content_type),
                ("Content-Length", str(len(reply.body))),
                *reply.headers,
            ],
        )
        return [reply.body]

    # -- forwarding ----------------------------------------------------------------------
    def _forward(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        reader: Reader,
        pull_point_id: str,
        body: bytes,
    ) -> Any:
        named = ""
        if self.identity is not None and not environ.get("HTTP_AUTHORIZATION"):
            try:
                identity = self.identity(environ)
            except Exception:  # wrong credentials: answered here (401), as any request
                return self.app(environ, start_response)
            if identity is not None:
                named = identity_value(identity)
        try:
            answer = self.relay(environ, reader, pull_point_id, body, named)
        except errors.ResourceUnavailable as exc:
            return self._fault(environ, start_response, exc)
        start_response(answer.status, answer.headers)
        return [answer.body]

    def relay(
        self,
        environ: dict[str, Any],
        reader: Reader,
        resource_id: str,
        body: bytes,
        named: str = "",
    ) -> Relayed:
        """Send the request ``environ`` (its method, path, query, ``body`` and the headers
        of :data:`_SENT_ON`) to ``reader``, signed, naming the identity ``named`` (the
        :data:`FORWARDED_IDENTITY_HEADER` value, "" for none); the reader's answer.

        :raises errors.ResourceUnavailable: the reader cannot be reached (retry later)
        """
        readers = self.readers
        assert readers is not None
        target = urlsplit(reader.address)
        method = str(environ.get("REQUEST_METHOD") or "POST")
        url_path = target_path(environ)
        headers = {name: str(environ[key]) for key, name in _SENT_ON.items() if environ.get(key)}
        request_id = environ.get("wsnmom.request_id")
        if request_id:
            headers["X-Request-Id"] = str(request_id)
        if named:
            headers[FORWARDED_IDENTITY_HEADER] = named
        address = str(environ.get("REMOTE_ADDR") or "")
        if address:
            headers[FORWARDED_FOR_HEADER] = address
        path = str(environ.get("PATH_INFO") or "")
        onvif = path == EVENT_SERVICE_PATH or subscription_id_of(path) is not None
        wait = ONVIF_TIMEOUT if onvif else TIMEOUT
        try:
            headers[FORWARD_HEADER] = sign(
                readers.secret(),
                readers.instance,
                int(time.time()),
                url_path,
                body,
                named,
                address,
                nonce=secrets.token_hex(16),
                method=method,
            )
            connection: http.client.HTTPConnection
            if target.scheme == "https":
                connection = http.client.HTTPSConnection(
                    target.netloc, timeout=CONNECT_TIMEOUT, context=self._tls_context()
                )
            else:
                connection = http.client.HTTPConnection(target.netloc, timeout=CONNECT_TIMEOUT)
            try:
                connection.connect()
                assert connection.sock is not None
                connection.sock.settimeout(wait)
                connection.request(method, url_path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                status = f"{response.status} {response.reason}"
                relayed = [(k, v) for k, v in response.getheaders() if k.lower() in _RELAYED]
            finally:
                connection.close()
        except Exception as exc:
            readers.forget()
            log.warning(
                "forwarding a request for %s to instance %s at %s failed: %s",
                resource_id,
                reader.instance,
                reader.address,
                exc,
            )
            raise readers.refusal(resource_id) from exc
        relayed.append(("Content-Length", str(len(data))))
        return Relayed(status, relayed, data)

    def _tls_context(self) -> ssl.SSLContext:
        """The context checking an ``https://`` reader's certificate (made once)."""
        if self._tls is None:
            self._tls = verifying_context(OutboundEnvironment.from_environ())
        return self._tls

    def _fault(
        self, environ: dict[str, Any], start_response: StartResponse, exc: errors.WsnError
    ) -> list[bytes]:
        """ResourceUnavailableFault, HTTP 503, ``Retry-After``: try again."""
        version = version_for_media_type(environ.get("CONTENT_TYPE")) or SoapVersion.SOAP11
        fault, action, rendered = fault_for_error(exc, version)
        count_fault(rendered.fault_name)
        data = envelope_bytes(version, fault, action=action)
        retry = getattr(exc, "retry_after", None) or 1.0
        start_response(
            "503 Service Unavailable",
            [
                ("Content-Type", content_type_for(version, action)),
                ("Content-Length", str(len(data))),
                ("Retry-After", str(max(1, math.ceil(retry)))),
            ],
        )
        return [data]
