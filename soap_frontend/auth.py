"""Authentication of HTTP requests: who the caller is (:class:`Authenticator`).

Sources of an identity, in this order:

1. the ``Authorization`` header: ``Basic`` (a name and password of the credentials file,
   or ``admin`` and ``auth.admin_token``) or ``Bearer`` (a token of the file, or the admin
   token).  Wrong credentials are refused; they never fall back to another source;
2. the TLS client certificate the gateway verified (mutual TLS, :mod:`wsnmom.https`):
   its subject, or its common name (``auth.tls_identity``);
3. the identity header of a trusted reverse proxy (``auth.proxy_header``), believed only
   from a peer listed in ``trusted_proxies``;
4. for SOAP requests only, a WS-Security UsernameToken in the envelope
   (:mod:`.wsse`), when the HTTP request carried none of the above.

Authentication is *enabled* when any identity source is configured (``auth.admin_token``,
``auth.users_file``, ``tls.client_ca``, ``auth.proxy_header``); it is *required* (an
anonymous request is refused) per ``auth.required``: "auto" requires it when it is
enabled or the gateway listens on a non-loopback address.  Refusals are a SOAP fault
(``wsse:FailedAuthentication``) with HTTP 401 and a ``WWW-Authenticate`` challenge; the
fault says nothing about why (the reason goes to the ``wsnmom.auth`` log).

Password hashes cost some 50 ms to check, so a verified name and password (and the Basic
header that carried them) are remembered under a keyed BLAKE2 hash, never in plain text,
until the process ends; a failed check is not.  A name that is unknown or has no hash
costs one check of a decoy hash with the same parameters, so the time of a refusal does
not tell which names exist.  Hashes are checked on the threads of :mod:`.hashing`,
bounded, never on a request thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from wsnmom.core import metrics
from wsnmom.core.access import ANONYMOUS, Principal
from wsnmom.core.config import ConfigError
from wsnmom.core.guard import ThrottledLog

from .credentials import Credentials, load_credentials
from .hashing import HashWorkers, PasswordChecksBusy
from .identity import AuthenticationFailed
from .passwords import decoy_hash, token_digest, verify_password
from .public_base import is_trusted
from .wsse import NonceCache, TokenRejected, UsernameToken, digest_matches

__all__ = [
    "FORWARDED_ADDRESS_KEY",
    "FORWARDED_ADMIN_KEY",
    "FORWARDED_IDENTITY_KEY",
    "TLS_IDENTITY_KEY",
    "Authenticator",
    "listens_on_loopback_only",
]

log = logging.getLogger("wsnmom.auth")

#: the environ key where the HTTPS server puts the verified client certificate's identity
TLS_IDENTITY_KEY = "wsnmom.tls.identity"
#: the environ key of the identity (name, method) another instance of the cluster
#: established for a request it forwarded (set only on a request whose signature
#: verifies, ``pull_forward``)
FORWARDED_IDENTITY_KEY = "wsnmom.forwarded.identity"
#: the environ key of the client's address of such a request (per-address rate limits)
FORWARDED_ADDRESS_KEY = "wsnmom.forwarded.address"
#: the environ key of the admin another instance authorised for the admin action it
#: forwarded (set only on an admin path of a request whose signature verifies)
FORWARDED_ADMIN_KEY = "wsnmom.forwarded.admin"

_CACHE_LIMIT = 4096

#: failure warnings, at most one per kind every 10 s (a password guesser must not flood
#: the log; the counter counts every one)
_failures = ThrottledLog(log)


def _trusts_everyone(trusted: list[str]) -> bool:
    """Whether ``trusted`` admits every peer: ``*`` or a network of prefix length 0."""
    for entry in trusted:
        text = entry.strip()
        if text == "*":
            return True
        try:
            if ipaddress.ip_network(text, strict=False).prefixlen == 0:
                return True
        except ValueError:
            continue
    return False


def listens_on_loopback_only(host: str) -> bool:
    """Whether ``host`` (a listen address or name) is a loopback address."""
    name = host.strip().strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Authenticator:
    """Establishes the caller of each request (see the module docstring)."""

    def __init__(self, settings: Any, credentials: Credentials | None = None) -> None:
        auth = getattr(settings, "auth", None)
        tls = getattr(settings, "tls", None)
        self.realm: str = getattr(auth, "realm", "wsnmom")
        self.credentials = credentials or (
            load_credentials(auth.users_file, auth.admin_token)
            if auth is not None
            else Credentials({}, {})
        )
        self.proxy_header: str | None = getattr(auth, "proxy_header", None) or None
        self._proxy_key = (
            "HTTP_" + self.proxy_header.upper().replace("-", "_") if self.proxy_header else None
        )
        self.trusted_proxies: list[str] = list(getattr(settings, "trusted_proxies", []) or [])
        self._secret_names = self.credentials.secret_names()
        hashes = [i.password_hash for i in self.credentials.identities.values() if i.password_hash]
        #: checked for names without a hash; without any hash every refusal is fast alike
        self._decoy = decoy_hash(hashes) if hashes else None
        client_ca = getattr(tls, "client_ca", None)
        #: whether any identity source is configured
        self.enabled = bool(
            not self.credentials.empty or client_ca or (self.proxy_header and self.trusted_proxies)
        )
        if self.proxy_header and not self.trusted_proxies:
            raise ConfigError(
                "auth.proxy_header is set but trusted_proxies is empty: the header would "
                "never be believed; list the proxies' addresses in trusted_proxies"
            )
        if (
            self.proxy_header
            and _trusts_everyone(self.trusted_proxies)
            and not getattr(auth, "i_know_any_client_can_claim_any_identity", False)
        ):
            raise ConfigError(
                f"auth.proxy_header with trusted_proxies = {self.trusted_proxies!r} believes "
                f"the {self.proxy_header} header from every client, so anyone can claim any "
                "identity: list only your proxies' addresses in trusted_proxies, or set "
                "auth.i_know_any_client_can_claim_any_identity = true"
            )
        required = getattr(auth, "required", "auto")
        host = str(getattr(settings, "host", "127.0.0.1"))
        if required == "true":
            self.required = True
        elif required == "false":
            self.required = False
        else:
            self.required = self.enabled or not listens_on_loopback_only(host)
        if self.required and not self.enabled:
            raise ConfigError(
                f"the gateway listens on {host}, beyond loopback, so it requires "
                "authentication, but no identity is configured: set auth.admin_token "
                "(WSNMOM_AUTH__ADMIN_TOKEN) or auth.users_file, or set auth.required = false "
                "to serve anonymous clients (see docs/security.md)"
            )
        self.wsse: bool = bool(getattr(auth, "wsse", True))
        self.hashing = HashWorkers(
            int(getattr(auth, "hash_threads", 1)), int(getattr(auth, "hash_queue", 16))
        )
        window = getattr(auth, "wsse_window", None)
        from datetime import timedelta

        self.nonces = NonceCache(window if isinstance(window, timedelta) else timedelta(minutes=5))
        self._key = os.urandom(32)
        self._verified: dict[bytes, str] = {}
        self._lock = threading.Lock()
        challenge = f'realm="{self.realm}"'
        self._challenge = (
            ("WWW-Authenticate", f'Basic {challenge}, charset="UTF-8"'),
            ("WWW-Authenticate", f"Bearer {challenge}"),
        )

    # -- HTTP ------------------------------------------------------------------------------
    def challenge_headers(self) -> tuple[tuple[str, str], ...]:
        """The ``WWW-Authenticate`` headers of a 401."""
        return self._challenge

    def http_caller(self, environ: Mapping[str, Any]) -> Principal:
        """The caller from the HTTP request alone (ANONYMOUS without credentials).

        :raises AuthenticationFailed: wrong credentials."""
        if not self.enabled:
            return ANONYMOUS
        header = environ.get("HTTP_AUTHORIZATION")
        if header:
            return self._authorization(str(header))
        forwarded = environ.get(FORWARDED_IDENTITY_KEY)
        if isinstance(forwarded, tuple) and len(forwarded) == 2:
            return self.credentials.principal(str(forwarded[0]), str(forwarded[1]))
        tls_name = environ.get(TLS_IDENTITY_KEY)
        if isinstance(tls_name, str) and tls_name:
            return self.credentials.principal(tls_name, "tls")
        if self._proxy_key is not None:
            value = environ.get(self._proxy_key)
            if isinstance(value, str) and value.strip():
                if is_trusted(environ.get("REMOTE_ADDR"), self.trusted_proxies):
                    return self._proxy_principal(value.strip())
                _failures.warning(
                    "proxy",
                    "ignored %s from %s, which is not in trusted_proxies",
                    self.proxy_header,
                    environ.get("REMOTE_ADDR"),
                )
        return ANONYMOUS

    def _proxy_principal(self, name: str) -> Principal:
        """The identity a trusted proxy asserts.  A proxy vouches only for identities
        without a secret of their own: a name with a password, token or UsernameToken
        password (``admin`` among them) must prove itself, so a header naming it is
        refused."""
        if name in self._secret_names:
            raise self._failed(
                "proxy", f"{self.proxy_header} names {name!r}, an identity with a secret"
            )
        return self.credentials.principal(name, "proxy")

    def _authorization(self, header: str) -> Principal:
        scheme, _, value = header.strip().partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == "bearer" and value:
            name = self.credentials.tokens.get(token_digest(value))
            if name is None:
                raise self._failed("bearer", "unknown bearer token")
            return self.credentials.principal(name, "bearer")
        if scheme == "basic" and value:
            # a header seen verified before: its keyed hash (never the password) -> name
            remembered = self._verified.get(self._header_key(value))
            if remembered is not None:
                return self.credentials.principal(remembered, "basic")
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                raise self._failed("basic", "malformed Basic credentials") from None
            name, sep, password = decoded.partition(":")
            if not sep:
                raise self._failed("basic", "malformed Basic credentials")
            if not self.check_password(name, password):
                raise self._failed("basic", f"wrong password for {name!r}")
            self._remember(self._header_key(value), name)
            return self.credentials.principal(name, "basic")
        raise self._failed("scheme", f"unsupported Authorization scheme {scheme[:20]!r}")

    def _failed(self, kind: str, reason: str) -> AuthenticationFailed:
        _failures.warning(kind, "authentication failed: %s", reason)
        metrics.AUTH_FAILURES.labels(reason=kind).inc()
        return AuthenticationFailed(reason)

    def check_password(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s (hashed password, admin token or plain
        ``wsse_password``), constant-time; verified pairs are remembered."""
        key = self._pair_key(name, password)
        if self._verified.get(key) == name:
            return True
        identity = self.credentials.identities.get(name)
        ok = False
        if identity is not None and identity.plain_password is not None:
            ok = hmac.compare_digest(
                identity.plain_password.encode("utf-8"), password.encode("utf-8")
            )
        stored = identity.password_hash if identity is not None else None
        if not ok and (stored or self._decoy):
            # an unknown name, or one without a hash, costs what a wrong password costs:
            # the time of the answer tells no one which names exist
            checked = self.hashing.run(verify_password, password, stored or self._decoy or "")
            ok = checked and stored is not None
        if ok:
            self._remember(key, name)
        return ok

    def _pair_key(self, name: str, password: str) -> bytes:
        data = f"{name}\0{password}".encode()
        return hashlib.blake2b(data, key=self._key, digest_size=32).digest()

    def _header_key(self, value: str) -> bytes:
        data = b"basic\0" + value.encode("utf-8", "surrogateescape")
        return hashlib.blake2b(data, key=self._key, digest_size=32).digest()

    def _remember(self, key: bytes, name: str) -> None:
        with self._lock:
            if len(self._verified) >= _CACHE_LIMIT:
                self._verified.clear()
            self._verified[key] = name

    # -- WS-Security -----------------------------------------------------------------------
    def wsse_caller(self, token: UsernameToken) -> Principal:
        """The identity a UsernameToken proves.  :raises AuthenticationFailed: it does
        not (wrong password, stale, replayed, or UsernameToken disabled)."""
        if not self.wsse or not self.enabled:
            raise self._failed("wsse", "WS-Security UsernameToken is not accepted")
        try:
            self.nonces.check_time(token)
        except TokenRejected as exc:
            raise self._failed("wsse", f"UsernameToken of {token.username!r}: {exc}") from None
        identity = self.credentials.identities.get(token.username)
        if token.digest:
            if identity is None:
                raise self._failed("wsse", f"unknown UsernameToken user {token.username!r}")
            if identity.plain_password is None or not digest_matches(
                token, identity.plain_password
            ):
                raise self._failed("wsse", f"wrong PasswordDigest for {token.username!r}")
        elif not self.check_password(token.username, token.password):
            raise self._failed("wsse", f"wrong password for {token.username!r}")
        try:  # only now: a client that cannot authenticate stores no nonce
            self.nonces.remember(token)
        except TokenRejected as exc:
            raise self._failed("wsse", f"UsernameToken of {token.username!r}: {exc}") from None
        return self.credentials.principal(token.username, "wsse")

    def recognises(self, header: str) -> bool:
        """Whether the ``Authorization`` value ``header`` names a caller without hashing a
        password: a known bearer token, or a Basic header verified before (the check of a
        reserved connection place, made while the request is read)."""
        if not self.enabled:
            return False
        scheme, _, value = header.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and value:
            return token_digest(value) in self.credentials.tokens
        if scheme == "basic" and value:
            return self._header_key(value) in self._verified
        return False


__all__ += ["AuthenticationFailed", "PasswordChecksBusy", "TokenRejected"]
