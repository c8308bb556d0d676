"""WS-Security UsernameToken Profile 1.0/1.1 in a SOAP request's ``wsse:Security`` header:
the credentials of SOAP clients that speak nothing else (ONVIF devices and clients).

``PasswordText`` carries the password; ``PasswordDigest`` carries
``Base64(SHA-1(nonce + created + password))``, which the gateway can only check against
a password it knows in plain text (see :mod:`.credentials`).  Replays: a token with a
``wsu:Created`` must be within ``auth.wsse_window`` of the gateway's clock, and its
nonce is remembered for that long, per user and only once the token authenticated -- a
second use is refused.  A digest without a nonce
and a creation time is refused (it would be replayable forever).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import isodate
from lxml import etree

from .xml import WSU, children, text_of

__all__ = ["WSSE", "NonceCache", "UsernameToken", "find_username_token", "token_digest"]

WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
_PROFILE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0"
PASSWORD_TEXT = _PROFILE + "#PasswordText"
PASSWORD_DIGEST = _PROFILE + "#PasswordDigest"

_SECURITY = f"{{{WSSE}}}Security"
_TOKEN = f"{{{WSSE}}}UsernameToken"
_USERNAME = f"{{{WSSE}}}Username"
_PASSWORD = f"{{{WSSE}}}Password"
_NONCE = f"{{{WSSE}}}Nonce"
_CREATED = f"{{{WSU}}}Created"


class TokenRejected(Exception):
    """A UsernameToken that is malformed, stale or replayed (the reason is logged only)."""


@dataclass(frozen=True, slots=True)
class UsernameToken:
    """A parsed UsernameToken."""

    username: str
    password: str
    digest: bool
    nonce: bytes | None = None
    created: str | None = None


def find_username_token(headers: list[etree._Element]) -> UsernameToken | None:
    """The UsernameToken of the first ``wsse:Security`` header block, if any.

    :raises TokenRejected: the Security header holds a malformed token."""
    for block in headers:
        if block.tag != _SECURITY:
            continue
        for token in children(block):
            if token.tag == _TOKEN:
                return _parse(token)
        return None
    return None


def _parse(token: etree._Element) -> UsernameToken:
    username = password = None
    digest = False
    nonce: bytes | None = None
    created: str | None = None
    for child in children(token):
        if child.tag == _USERNAME:
            username = text_of(child)
        elif child.tag == _PASSWORD:
            password = text_of(child) or ""
            kind = (child.get("Type") or PASSWORD_TEXT).strip()
            if kind == PASSWORD_DIGEST:
                digest = True
            elif kind != PASSWORD_TEXT:
                raise TokenRejected(f"unknown password type {kind!r}")
        elif child.tag == _NONCE:
            try:
                nonce = base64.b64decode(text_of(child) or "", validate=True)
            except (binascii.Error, ValueError):
                raise TokenRejected("nonce is not base64") from None
        elif child.tag == _CREATED:
            created = text_of(child)
    if not username or password is None:
        raise TokenRejected("UsernameToken without Username or Password")
    return UsernameToken(username, password, digest, nonce, created)


def token_digest(nonce: bytes, created: str, password: str) -> str:
    """The PasswordDigest value for ``password``."""
    raw = hashlib.sha1(nonce + created.encode("utf-8") + password.encode("utf-8")).digest()
    return base64.b64encode(raw).decode("ascii")


def digest_matches(token: UsernameToken, password: str) -> bool:
    """Whether ``token``'s digest proves ``password`` (constant-time)."""
    if token.nonce is None or token.created is None:
        return False
    expected = token_digest(token.nonce, token.created, password)
    return hmac.compare_digest(expected.encode("ascii"), token.password.encode("utf-8"))


class NonceCache:
    """The nonces each authenticated user sent within the replay window.

    :meth:`check_time` runs before the token is authenticated and stores nothing;
    :meth:`remember` runs only once it is, and keeps the nonce in that user's own table
    (bounded; full = refuse, never forget early).  So a client that cannot authenticate
    stores nothing, and a user who fills its table refuses only its own tokens.
    """

    def __init__(self, window: timedelta, capacity: int = 200_000) -> None:
        self.window = window
        #: nonces kept per user
        self._capacity = capacity
        self._seen: dict[str, dict[bytes, float]] = {}
        self._lock = threading.Lock()

    def check_time(self, token: UsernameToken, now: datetime | None = None) -> None:
        """Refuse a token whose Created is outside the window, or a digest without a
        nonce and a Created.  :raises TokenRejected: stale, future or incomplete."""
        if token.digest and (token.nonce is None or token.created is None):
            raise TokenRejected("a PasswordDigest needs a Nonce and a Created time")
        if token.created is not None:
            moment = now or datetime.now(UTC)
            try:
                created = isodate.parse_datetime(token.created.strip())
            except (isodate.ISO8601Error, ValueError):
                raise TokenRejected("Created is not a dateTime") from None
            if created.tzinfo is None:
                created = created.replace(tzinfo=UTC)
            if abs(moment - created) > self.window:
                raise TokenRejected("Created is outside the replay window")

    def remember(self, token: UsernameToken) -> None:
        """Refuse a nonce the (authenticated) user sent before within the window, else
        remember it.  :raises TokenRejected: replayed, or the user's table is full."""
        if token.nonce is None:
            return
        clock = time.monotonic()
        with self._lock:
            seen = self._seen.setdefault(token.username, {})
            if seen.get(token.nonce, 0.0) > clock:
                raise TokenRejected("nonce replayed")
            if len(seen) >= self._capacity:
                seen = self._seen[token.username] = {k: t for k, t in seen.items() if t > clock}
                if len(seen) >= self._capacity:
                    raise TokenRejected("too many nonces of this user in the replay window")
            # remembered for twice the window: a Created at the window's far edge
            seen[token.nonce] = clock + 2 * self.window.total_seconds()

    def check(self, token: UsernameToken, now: datetime | None = None) -> None:
        """:meth:`check_time`, then :meth:`remember`."""
        self.check_time(token, now)
        self.remember(token)

    def stored(self) -> int:
        """Nonces held, over all users."""
        with self._lock:
            return sum(len(seen) for seen in self._seen.values())
