"""WSGI middleware: a request to a pull point goes to the instance that reads it.

In a cluster on a middleware without a pull of its own, one instance reads each pull
point (``core.pull_owners``).  A POST to ``/wsn/pullpoints/<id>`` (GetMessages,
DestroyPullPoint, Notify, properties) that arrives at another instance is sent on to the
reading instance's address (``cluster.address``, from the store's instance table), and
its answer relayed as it came: status, body, ``Retry-After`` and the reader's
``WSNMOM-Instance`` (the instance that read the messages).  While no live instance reads
the pull point (a hand-over), the answer is ResourceUnavailableFault, HTTP 503 with
``Retry-After``, as for every "try again" of the gateway; so is a reader that cannot be
reached.

A forwarded request carries :data:`FORWARD_HEADER`: the sending instance, a time and an
HMAC-SHA256 of those, the path and the body under the cluster's secret (made once in the
store, ``Coordination.secret``).  An instance serves a request with a valid header
itself, never forwarding it again; a header that does not verify (a client's, a stale
one) is refused with HTTP 403.  The client's own credentials travel with the request:
the reading instance authenticates and authorises the client as any instance would.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from wsnmom.core import errors
from wsnmom.core.addresses import ResourceKind, parse_resource_path
from wsnmom.core.model import SoapVersion
from wsnmom.core.pull_owners import PullOwners, Reader

from .dispatch import transport_reply
from .envelope import HttpError, content_type_for, envelope_bytes, version_for_media_type
from .faults import count_fault, fault_for_error

__all__ = ["FORWARD_HEADER", "PullForward", "sign"]

log = logging.getLogger("wsnmom.soap.pull_forward")

#: the header of a request one instance forwards to another
FORWARD_HEADER = "WSNMOM-Forwarded"
_ENVIRON_KEY = "HTTP_WSNMOM_FORWARDED"
#: seconds a forwarded request's signature stays valid (clocks of one cluster agree)
WINDOW = 60.0
#: seconds to wait for the reading instance's answer
TIMEOUT = 30.0
#: request headers sent on with a forwarded request
_SENT_ON = {
    "CONTENT_TYPE": "Content-Type",
    "HTTP_SOAPACTION": "SOAPAction",
    "HTTP_AUTHORIZATION": "Authorization",
    "HTTP_HOST": "Host",
    "HTTP_ACCEPT": "Accept",
}
#: response headers not relayed (the connection's own, or set again here)
_NOT_RELAYED = {"connection", "keep-alive", "transfer-encoding", "content-length", "x-request-id"}

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def sign(secret: str, instance: str, moment: int, path: str, body: bytes) -> str:
    """The :data:`FORWARD_HEADER` value of a request ``instance`` forwards at ``moment``
    (Unix seconds): ``<instance> <moment> <hex HMAC>``."""
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    mac.update(f"{instance}\n{moment}\n{path}\n".encode())
    mac.update(hashlib.sha256(body).digest())
    return f"{instance} {moment} {mac.hexdigest()}"


def _verified(secret: str, value: str, path: str, body: bytes, now: float) -> bool:
    parts = value.split(" ")
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    instance, moment = parts[0], int(parts[1])
    if abs(now - moment) > WINDOW:
        return False
    return hmac.compare_digest(sign(secret, instance, moment, path, body), value)


class PullForward:
    """Wraps a WSGI application (see the module docstring)."""

    def __init__(self, app: WsgiApp, readers: PullOwners | None, max_body: int | None) -> None:
        self.app = app
        self.readers = readers
        self.max_body = max_body

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        claimed = environ.get(_ENVIRON_KEY)
        readers = self.readers
        if claimed is not None:
            return self._forwarded(environ, start_response, str(claimed))
        if readers is None or not readers.active or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        path = str(environ.get("PATH_INFO") or "")
        found = parse_resource_path(path)
        if found is None or found[0] is not ResourceKind.PULL_POINT:
            return self.app(environ, start_response)
        body = self._body(environ)
        if body is None:  # no plain Content-Length within the limit: answered here
            return self.app(environ, start_response)
        try:
            reader = readers.reader(found[1])
        except errors.ResourceUnavailable as exc:
            return self._fault(environ, start_response, exc)
        if reader.here:
            return self.app(environ, start_response)
        return self._forward(environ, start_response, reader, path, body)

    # -- a request another instance forwarded --------------------------------------------
    def _forwarded(self, environ: dict[str, Any], start_response: StartResponse, value: str) -> Any:
        readers = self.readers
        path = str(environ.get("PATH_INFO") or "")
        body = self._body(environ)
        ok = False
        if readers is not None and readers.active and body is not None:
            try:
                ok = _verified(readers.secret(), value, path, body, time.time())
            except Exception:
                log.warning("reading the cluster's secret failed", exc_info=True)
        if not ok:
            log.info("refused a request to %s: its %s does not verify", path, FORWARD_HEADER)
            reply = transport_reply(
                None,
                HttpError(403, f"the {FORWARD_HEADER} header is for the cluster's instances"),
                environ.get("CONTENT_TYPE"),
            )
            start_response(
                "403 Forbidden",
                [
                    ("Content-Type", reply.content_type),
                    ("Content-Length", str(len(reply.body))),
                    *reply.headers,
                ],
            )
            return [reply.body]
        return self.app(environ, start_response)

    # -- forwarding ----------------------------------------------------------------------
    def _body(self, environ: dict[str, Any]) -> bytes | None:
        """The request body (put back for the application to read), or None when it has
        no plain Content-Length within the limit (left alone)."""
        length = environ.get("CONTENT_LENGTH")
        if (
            "HTTP_TRANSFER_ENCODING" in environ
            or not isinstance(length, str)
            or not length.isdigit()
            or not length.isascii()
            or (self.max_body is not None and int(length) > self.max_body)
        ):
            return None
        stream = environ["wsgi.input"]
        wanted = int(length)
        parts: list[bytes] = []
        got = 0
        while got < wanted:
            chunk = stream.read(wanted - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        body = b"".join(parts)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input_terminated"] = True
        return body

    def _forward(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        reader: Reader,
        path: str,
        body: bytes,
    ) -> Any:
        readers = self.readers
        assert readers is not None
        target = urlsplit(reader.address)
        query = environ.get("QUERY_STRING")
        url_path = path + (f"?{query}" if query else "")
        headers = {name: str(environ[key]) for key, name in _SENT_ON.items() if environ.get(key)}
        request_id = environ.get("wsnmom.request_id")
        if request_id:
            headers["X-Request-Id"] = str(request_id)
        try:
            headers[FORWARD_HEADER] = sign(
                readers.secret(), readers.instance, int(time.time()), path, body
            )
            connection_class = (
                http.client.HTTPSConnection
                if target.scheme == "https"
                else http.client.HTTPConnection
            )
            connection = connection_class(target.netloc, timeout=TIMEOUT)
            try:
                connection.request("POST", url_path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                status = f"{response.status} {response.reason}"
                relayed = [
                    (k, v) for k, v in response.getheaders() if k.lower() not in _NOT_RELAYED
                ]
            finally:
                connection.close()
        except Exception as exc:
            readers.forget()
            log.warning(
                "forwarding a request for pull point %s to instance %s at %s failed: %s",
                path.rsplit("/", 1)[-1],
                reader.instance,
                reader.address,
                exc,
            )
            return self._fault(environ, start_response, readers.refusal(path.rsplit("/", 1)[-1]))
        relayed.append(("Content-Length", str(len(data))))
        start_response(status, relayed)
        return [data]

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
