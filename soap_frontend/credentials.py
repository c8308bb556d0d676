"""The identities the gateway knows: ``auth.admin_token`` and the credentials file
(``auth.users_file``).

The file is TOML, one table per identity::

    [users.alice]
    password = "scrypt$16384$8$1$...$..."     # wsnmom auth hash-password
    tokens = ["sha256$9f86d0..."]            # wsnmom auth hash-token
    admin = false
    subscribe = ["{urn:example}sensors//*"]   # topic ACLs (Full dialect, Clark notation)
    notify = ["{urn:example}sensors/room1"]
    subscriptions = 100                       # this identity's quotas
    pull_points = 10
    registrations = 10
    rate = 20

    [users."CN=device-17,O=Example"]          # a TLS client certificate subject (or the
    notify = ["{urn:example}devices//."]      # name a trusted proxy sends): no secret

    [users.onvif-camera]
    wsse_password = "plain text"              # only for WS-Security PasswordDigest

A PasswordDigest proves knowledge of the password itself, so the gateway can only check
it against a password it knows in plain text (``wsse_password``); everything else is
stored hashed.  The file should be readable by the gateway's user only; a start-up
warning says when it is not.

``auth.admin_token`` adds the identity ``admin`` (an admin) whose bearer token, HTTP
Basic password and UsernameToken password is that token.
"""

from __future__ import annotations

import logging
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsnmom.core.access import IdentityQuotas, Principal
from wsnmom.core.config import ConfigError
from wsnmom.topic_mapping.dialects import FULL, parse_topic_expression
from wsnmom.topic_mapping.errors import TopicError
from wsnmom.topic_mapping.model import PathPattern

from .passwords import InvalidHash, check_hash, parse_token_hash, token_digest

__all__ = ["ADMIN", "Credentials", "Identity", "load_credentials", "parse_acl"]

log = logging.getLogger("wsnmom.auth")

#: the identity of ``auth.admin_token``
ADMIN = "admin"

_KEYS = {
    "password",
    "tokens",
    "admin",
    "subscribe",
    "notify",
    "subscriptions",
    "pull_points",
    "registrations",
    "rate",
    "wsse_password",
}


@dataclass(frozen=True, slots=True)
class Identity:
    """One identity: what core sees and the secrets that prove it."""

    principal: Principal
    password_hash: str | None = None
    #: a password known in plain text (``auth.admin_token``, ``wsse_password``)
    plain_password: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Credentials:
    """Every identity by name, and the names of the bearer tokens (by SHA-256)."""

    identities: Mapping[str, Identity]
    tokens: Mapping[bytes, str]
    #: principals made so far, by (name, method): one object per caller, not per request
    made: dict[tuple[str, str], Principal] = field(default_factory=dict, repr=False)

    @property
    def empty(self) -> bool:
        """No identity is configured."""
        return not self.identities

    def secret_names(self) -> frozenset[str]:
        """The identities that prove themselves with a secret (a password, a token, a
        UsernameToken password, the admin token)."""
        return frozenset(
            name
            for name, identity in self.identities.items()
            if identity.password_hash is not None or identity.plain_password is not None
        ) | frozenset(self.tokens.values())

    def principal(self, name: str, method: str) -> Principal:
        """The principal called ``name`` (a plain one when the file does not list it: a
        certificate or a proxy vouched for it), established by ``method``.  Made once per
        name and method (the same object for every request)."""
        key = (name, method)
        made = self.made.get(key)
        if made is not None:
            return made
        known = self.identities.get(name)
        base = known.principal if known is not None else Principal(name)
        made = Principal(base.name, base.admin, base.subscribe, base.notify, base.quotas, method)
        if len(self.made) < 10_000:  # names from certificates and proxies: bounded
            self.made[key] = made
        return made


def parse_acl(patterns: object, where: str) -> tuple[PathPattern, ...]:
    """Topic patterns in Clark notation (``{urn:example}sensors//*``, Full dialect).

    :raises ConfigError: a pattern is malformed (``where`` names it)."""
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"{where}: expected a list of topic patterns")
    out: list[PathPattern] = []
    for text in patterns:
        ns, sep, path = text.strip().partition("}")
        if not text.strip().startswith("{") or not sep or not path:
            raise ConfigError(
                f"{where}: {text!r} is not a topic pattern like '{{urn:example}}sensors//*'"
            )
        try:
            expr = parse_topic_expression(path, FULL, {None: ns[1:]})
        except TopicError as exc:
            raise ConfigError(f"{where}: {text!r}: {exc}") from None
        out.extend(expr.patterns)
    return tuple(out)


def _optional_int(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}.{key}: expected a count, got {value!r}")
    return value


def _identity(name: str, data: object, where: str) -> tuple[Identity, list[bytes]]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a table")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {', '.join(unknown)}")
    password = data.get("password")
    if password is not None:
        try:
            check_hash(str(password))
        except InvalidHash as exc:
            raise ConfigError(f"{where}.password: {exc}") from None
    digests: list[bytes] = []
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list):
        raise ConfigError(f"{where}.tokens: expected a list of token hashes")
    for token in tokens:
        try:
            digests.append(parse_token_hash(str(token)))
        except InvalidHash as exc:
            raise ConfigError(f"{where}.tokens: {exc}") from None
    admin = data.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"{where}.admin: expected true or false")
    rate = data.get("rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
        raise ConfigError(f"{where}.rate: expected requests per second")
    quotas = IdentityQuotas(
        subscriptions=_optional_int(data, "subscriptions", where),
        pull_points=_optional_int(data, "pull_points", where),
        registrations=_optional_int(data, "registrations", where),
        rate=float(rate) if rate is not None else None,
    )
    principal = Principal(
        name,
        admin=admin,
        subscribe=parse_acl(data["subscribe"], f"{where}.subscribe")
        if "subscribe" in data
        else None,
        notify=parse_acl(data["notify"], f"{where}.notify") if "notify" in data else None,
        quotas=quotas,
    )
    plain = data.get("wsse_password")
    return (
        Identity(principal, str(password) if password is not None else None, plain and str(plain)),
        digests,
    )


def load_credentials(users_file: str | None, admin_token: str | None) -> Credentials:
    """The identities of the credentials file and the admin token.

    :raises ConfigError: the file cannot be read or an entry is unusable.
    """
    identities: dict[str, Identity] = {}
    tokens: dict[bytes, str] = {}
    if users_file:
        path = Path(users_file)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise ConfigError(
                f"auth.users_file: cannot read {path}: {exc.strerror or exc}"
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"auth.users_file: {path} is not valid TOML: {exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "the credentials file %s can be read by other users (mode %o); chmod 600 it",
                path,
                stat.S_IMODE(mode),
            )
        users = data.get("users", {})
        extra = sorted(set(data) - {"users"})
        if extra or not isinstance(users, Mapping):
            raise ConfigError(f"auth.users_file: {path}: expected only [users.NAME] tables")
        for name, entry in users.items():
            identity, digests = _identity(str(name), entry, f"{path}: users.{name}")
            identities[str(name)] = identity
            for digest in digests:
                if digest in tokens:
                    raise ConfigError(f"{path}: users.{name}: a token of {tokens[digest]!r} too")
                tokens[digest] = str(name)
    if admin_token:
        if ADMIN in identities:
            raise ConfigError(
                f"auth.admin_token: the credentials file defines an identity {ADMIN!r} too; "
                "remove one of them"
            )
        identities[ADMIN] = Identity(Principal(ADMIN, admin=True), plain_password=admin_token)
        tokens[token_digest(admin_token)] = ADMIN
    return Credentials(identities, tokens)
