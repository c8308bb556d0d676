"""WSGI middleware giving every HTTP request an id: the client's ``X-Request-Id`` when it
sends a usable one, else a new one.  The id is bound for log records emitted while the
request is handled (:mod:`wsnmom.core.log_context`) and returned as the ``X-Request-Id``
response header, with ``WSNMOM-Instance``: the instance that answered (GetMessages
included; for a request another instance answered, ``soap_frontend.pull_forward``, that
instance's), for clients of a cluster (docs/scale-out.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wsnmom.core.coordination import INSTANCE_HEADER
from wsnmom.core.log_context import bound_request_id, new_request_id, usable_request_id

__all__ = ["HEADER", "RequestIds"]

HEADER = "X-Request-Id"
_ENVIRON_KEY = "HTTP_X_REQUEST_ID"
_INSTANCE_LOWER = INSTANCE_HEADER.lower()

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class RequestIds:
    """Wraps a WSGI application (see the module docstring)."""

    def __init__(self, app: WsgiApp, instance: str = "") -> None:
        self.app = app
        #: this instance's id, sent as ``WSNMOM-Instance`` with every response ("": none)
        self.instance = instance

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        request_id = usable_request_id(environ.get(_ENVIRON_KEY)) or new_request_id()
        environ["wsnmom.request_id"] = request_id

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            headers.append((HEADER, request_id))
            if self.instance and not any(k.lower() == _INSTANCE_LOWER for k, _ in headers):
                # a relayed answer names the instance that gave it (``pull_forward``)
                headers.append((INSTANCE_HEADER, self.instance))
            if exc_info is None:
                return start_response(status, headers)
            return start_response(status, headers, exc_info)

        with bound_request_id(request_id):
            body = self.app(environ, start)
            if isinstance(body, list):  # produced already (the SOAP fast path)
                return body
        return _Bound(body, request_id)


class _Bound:
    """A streamed response body whose iteration still logs with the request id."""

    def __init__(self, body: Iterable[bytes], request_id: str) -> None:
        self.body = body
        self.request_id = request_id

    def __iter__(self) -> Iterator[bytes]:
        iterator = iter(self.body)
        while True:
            with bound_request_id(self.request_id):
                try:
                    chunk = next(iterator)
                except StopIteration:
                    return
            yield chunk

    def close(self) -> None:
        close = getattr(self.body, "close", None)
        if close is not None:
            with bound_request_id(self.request_id):
                close()
