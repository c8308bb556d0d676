"""The rig of the tests of ``PullForward`` (soap_frontend/pull_forward.py) over real HTTP
(tests/soap_frontend/test_pull_forward.py, test_pull_forward_trust.py,
test_admin_forward.py): a cluster's two instances as two WSGI stacks in the test's process,
the reading instance (:class:`Reader`, a context manager) served by a real HTTP server and
recording what reached its application, the instance a client asks (:func:`front`), the
forwarding signature with a fresh nonce (:func:`signed`), and the pull-point owners each
instance sees (:func:`readers`, :func:`owner_info`).
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import requests
from wsnmom.core.coordination import InstanceInfo, shard_of
from wsnmom.core.pull_owners import PullOwners
from wsnmom.soap_frontend.auth import FORWARDED_ADDRESS_KEY, FORWARDED_IDENTITY_KEY
from wsnmom.soap_frontend.forward_signature import (
    sign,
)
from wsnmom.soap_frontend.pull_forward import PullForward
from wsnmom.soap_frontend.request_ids import RequestIds

from tests.support.soap import content_type, envelope
from tests.support.threads import serve
from wsnmom.testing.gateway import free_port

__all__ = [
    "BODY",
    "PATH",
    "PP",
    "SECRET",
    "Quiet",
    "Reader",
    "front",
    "owner_info",
    "post",
    "readers",
    "signed",
]

SECRET = "s" * 64


def signed(*args: Any, **named: Any) -> str:
    """:func:`sign` with a fresh nonce."""
    return sign(*args, nonce=secrets.token_hex(16), **named)


PP = "pp-1"
PATH = f"/wsn/pullpoints/{PP}"
BODY = envelope("<wsnt:GetMessages/>")


class Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None


def readers(
    instance: str,
    *,
    here: bool,
    table: list[InstanceInfo],
    secret: str = SECRET,
    nonces: set[str] | None = None,
    fed: dict[str, str] | None = None,
    fed_by: Callable[[str], str | None] | None = None,
    is_pull_point: Callable[[str], bool] = lambda rid: rid == PP,
) -> PullOwners:
    seen = set() if nonces is None else nonces

    def first_use(nonce: str, _expires: float) -> bool:
        if nonce in seen:
            return False
        seen.add(nonce)
        return True

    return PullOwners(
        active=True,
        instance=instance,
        shards=4,
        lease=3.0,
        delivers=lambda _id: here,
        instances=lambda: table,
        retry_after=5.0,
        secret=lambda: secret,
        first_use=first_use,
        fed_by=fed_by or (lambda sid: (fed or {}).get(sid)),
        is_pull_point=is_pull_point,
    )


def owner_info(url: str, *, age: float = 0.1) -> InstanceInfo:
    return InstanceInfo("g1", url, "v", age, ((shard_of(PP, 4), 1),), 2.0)


class Reader:
    """The reading instance: records what reached its application."""

    def __init__(self, nonces: set[str] | None = None, tls: Any = None) -> None:
        self.seen: list[tuple[str, bytes, dict[str, str]]] = []
        #: the identity each request named (``auth.FORWARDED_IDENTITY_KEY``)
        self.identities: list[tuple[str, str] | None] = []
        #: the client address each request named (``auth.FORWARDED_ADDRESS_KEY``)
        self.addresses: list[str | None] = []
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        stack = RequestIds(
            PullForward(self._app, readers("g1", here=True, table=[], nonces=nonces), 1 << 20),
            instance="g1",
        )
        self.server: WSGIServer = make_server("127.0.0.1", port, stack, handler_class=Quiet)
        if tls is not None:  # a trustme certificate: served over HTTPS
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.configure_cert(context)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.url = f"https://127.0.0.1:{port}"
        self.thread = serve(self.server)

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        headers = {k: str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        self.seen.append((str(environ["PATH_INFO"]), body, headers))
        self.identities.append(environ.get(FORWARDED_IDENTITY_KEY))
        self.addresses.append(environ.get(FORWARDED_ADDRESS_KEY))
        start(
            "200 OK",
            [
                ("Content-Type", "application/soap+xml"),
                ("X-Read", "yes"),
                ("Set-Cookie", "reader=g1; Path=/"),
            ],
        )
        return [b"<answer/>"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def front(
    table: list[InstanceInfo],
    fed: dict[str, str] | None = None,
    is_pull_point: Callable[[str], bool] = lambda rid: rid == PP,
) -> tuple[str, Callable[[], None]]:
    """The instance a client asks (g0, not the reader), served over HTTP."""

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    port = free_port()
    stack = RequestIds(
        PullForward(
            local,
            readers("g0", here=False, table=table, fed=fed, is_pull_point=is_pull_point),
            1 << 20,
        ),
        "g0",
    )
    server = make_server("127.0.0.1", port, stack, handler_class=Quiet)
    serve(server)

    def close() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{port}", close


def post(url: str, path: str = PATH, **headers: str) -> requests.Response:
    return requests.post(
        url + path, data=BODY, headers={"Content-Type": content_type(), **headers}, timeout=10
    )
