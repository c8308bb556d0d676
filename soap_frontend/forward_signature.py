"""The signature of a request one instance of a cluster forwards to another.

A forwarded request (``pull_forward``, ``admin_forward``) carries :data:`FORWARD_HEADER`:
the sending instance, a time (Unix seconds), a nonce (32 hex digits, used once) and an
HMAC-SHA256 of those, the method, the path (with its query), the
:data:`FORWARDED_IDENTITY_HEADER` and :data:`FORWARDED_FOR_HEADER` values and the body,
under the cluster's secret (made once in the store, ``Coordination.secret``).  A header
verifies (:func:`verify`) when it is well formed, its time is within :data:`WINDOW` of
the receiver's clock and its HMAC matches the request as it arrived; whether its nonce was
seen before (a replay) the receiver asks the store (``PullOwners.first_use``), keeping it
until the signature's time plus :data:`WINDOW`.

The signed path is the request line's, percent-encoded (:func:`target_path`): one
signature, one path and query.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any
from urllib.parse import quote

__all__ = [
    "FORWARDED_FOR_HEADER",
    "FORWARDED_IDENTITY_HEADER",
    "FORWARD_HEADER",
    "WINDOW",
    "sign",
    "target_path",
    "verify",
]

#: the header of a request one instance forwards to another
FORWARD_HEADER = "WSNMOM-Forwarded"
#: the header naming the identity the forwarding instance established for its client
#: (``<method> <percent-encoded name>``), covered by the signature
FORWARDED_IDENTITY_HEADER = "WSNMOM-Forwarded-Identity"
#: the header naming the client's address (per-address rate limits), covered by the
#: signature
FORWARDED_FOR_HEADER = "WSNMOM-Forwarded-For"
#: seconds a forwarded request's signature stays valid (clocks of one cluster agree)
WINDOW = 60.0
_NONCE = re.compile(r"[0-9a-f]{32}")
#: what a forwarded request line's path keeps as it is (RFC 3986 ``pchar`` and ``/``)
_PATH_SAFE = "/:@!$&'()*+,;="


def sign(
    secret: str,
    instance: str,
    moment: int,
    path: str,
    body: bytes,
    identity: str = "",
    address: str = "",
    *,
    nonce: str,
    method: str = "POST",
) -> str:
    """The :data:`FORWARD_HEADER` value of a request ``instance`` forwards at ``moment``
    (Unix seconds) with ``nonce`` (32 hex digits, used once), naming ``identity`` and
    the client's ``address`` (the :data:`FORWARDED_IDENTITY_HEADER` and
    :data:`FORWARDED_FOR_HEADER` values, "" for none); ``path`` includes the query:
    ``<instance> <moment> <nonce> <hex HMAC>``."""
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    mac.update(f"{instance}\n{moment}\n{nonce}\n{method}\n{path}\n{identity}\n{address}\n".encode())
    mac.update(hashlib.sha256(body).digest())
    return f"{instance} {moment} {nonce} {mac.hexdigest()}"


def verify(
    secret: str,
    value: str,
    method: str,
    path: str,
    body: bytes,
    identity: str,
    address: str,
    now: float,
) -> tuple[int, str] | None:
    """The moment and nonce of a :data:`FORWARD_HEADER` ``value`` that verifies at
    ``now`` for the request as it arrived, else None."""
    parts = value.split(" ")
    if len(parts) != 4 or not value.isascii():  # made up (compare_digest takes ASCII)
        return None
    if not parts[1].isdigit() or not _NONCE.fullmatch(parts[2]):
        return None
    instance, moment, nonce = parts[0], int(parts[1]), parts[2]
    if abs(now - moment) > WINDOW:
        return None
    signed = sign(
        secret, instance, moment, path, body, identity, address, nonce=nonce, method=method
    )
    return (moment, nonce) if hmac.compare_digest(signed, value) else None


def target_path(environ: dict[str, Any]) -> str:
    """The request line's target a forwarded request is sent with, and its signature
    covers: the request's path, percent-encoded (a ``?``, a space or a ``#`` in it stays
    in the path: one target names one path and one query), and its query."""
    path = str(environ.get("PATH_INFO") or "")
    try:
        raw = path.encode("latin-1")  # PEP 3333: the path's bytes, as latin-1
    except UnicodeEncodeError:
        raw = path.encode()
    query = environ.get("QUERY_STRING")
    return quote(raw, safe=_PATH_SAFE) + (f"?{query}" if query else "")
