"""Who may use the reserved connection places (``connections.reserve``).

When ``connections.limit`` is nearly reached, :class:`wsnmom.connections.ConnectionGuard`
admits a connection only on one of the last ``reserve`` places, and only for a request
whose head is a probe (``GET /healthz``, ``/readyz``) or carries credentials that can be
checked at once: a known bearer token, or a Basic header that was verified before (a
password hash costs some 50 ms, far too much for the thread that reads every request; a
client whose Basic credentials were never verified is served on an ordinary place first).
Over HTTPS a verified client certificate vouches as well (``wsnmom.tls_ingress``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["authorization_of", "credential_vouch"]


def authorization_of(head: bytes) -> str | None:
    """The ``Authorization`` header's value in a raw request head (None when absent)."""
    lower = head.lower()
    start = lower.find(b"\nauthorization:")
    if start < 0:
        return None
    start += len(b"\nauthorization:")
    end = head.find(b"\r\n", start)
    value = head[start:] if end < 0 else head[start:end]
    return value.strip().decode("latin-1")


def credential_vouch(app: Any) -> Callable[[bytes], bool] | None:
    """The reserve's check of a request head for the Flask ``app`` (None when it has no
    authentication: then only probes use the reserve)."""
    auth = getattr(app, "extensions", {}).get("wsnmom.auth")
    if auth is None or not auth.enabled:
        return None

    def vouch(head: bytes) -> bool:
        value = authorization_of(head)
        return value is not None and bool(auth.recognises(value))

    return vouch
