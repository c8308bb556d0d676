"""Password and token hashes of the credentials file (standard library only).

Passwords are stored as ``scrypt$N$r$p$SALT$HASH`` (``hashlib.scrypt``; salt and hash in
unpadded URL-safe base64) or ``pbkdf2-sha256$ITERATIONS$SALT$HASH``; tokens, which are
long random strings, as ``sha256$HEX``.  ``wsnmom auth hash-password`` and ``wsnmom auth
hash-token`` write them.  Every comparison is constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

__all__ = [
    "InvalidHash",
    "decoy_hash",
    "hash_password",
    "hash_token",
    "new_token",
    "token_digest",
    "verify_password",
]

#: scrypt cost of new hashes: 16 MiB of memory and some 50 ms per check
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


class InvalidHash(ValueError):
    """A stored hash is malformed or of an unknown scheme."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new scrypt hash of ``password`` (random salt)."""
    salt = os.urandom(16)
    digest = _scrypt(password, salt, n, r, p)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=32
    )


def check_hash(stored: str) -> None:
    """Raise :class:`InvalidHash` unless ``stored`` is a usable password hash."""
    _parse(stored)


def _parse(stored: str) -> tuple[str, tuple[int, ...], bytes, bytes]:
    parts = stored.split("$")
    try:
        if parts[0] == "scrypt" and len(parts) == 6:
            n, r, p = (int(x) for x in parts[1:4])
            if n < 2 or n & (n - 1) or r < 1 or p < 1:
                raise InvalidHash("scrypt parameters out of range")
            return "scrypt", (n, r, p), _unb64(parts[4]), _unb64(parts[5])
        if parts[0] == "pbkdf2-sha256" and len(parts) == 4:
            iterations = int(parts[1])
            if iterations < 1:
                raise InvalidHash("pbkdf2 iterations out of range")
            return "pbkdf2-sha256", (iterations,), _unb64(parts[2]), _unb64(parts[3])
    except (ValueError, TypeError) as exc:
        raise InvalidHash(f"malformed password hash: {exc}") from None
    raise InvalidHash(
        "not a password hash (expected scrypt$N$r$p$SALT$HASH or "
        "pbkdf2-sha256$ITERATIONS$SALT$HASH; `wsnmom auth hash-password` writes one)"
    )


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the hash ``stored``."""
    scheme, params, salt, expected = _parse(stored)
    if scheme == "scrypt":
        n, r, p = params
        actual = _scrypt(password, salt, n, r, p)
    else:
        actual = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, params[0])
    return hmac.compare_digest(actual, expected)


def decoy_hash(like: list[str]) -> str:
    """A hash no password matches, that costs what checking the commonest of ``like``
    costs (the defaults when ``like`` holds none): checked for a name that has no hash,
    so that an unknown name takes as long as a wrong password."""
    counts: dict[tuple[str, tuple[int, ...]], int] = {}
    for stored in like:
        try:
            scheme, params, _, _ = _parse(stored)
        except InvalidHash:
            continue
        counts[(scheme, params)] = counts.get((scheme, params), 0) + 1
    scheme, params = max(counts, key=lambda k: counts[k]) if counts else ("scrypt", ())
    salt, digest = _b64(os.urandom(16)), _b64(os.urandom(32))
    if scheme == "pbkdf2-sha256":
        return f"pbkdf2-sha256${params[0]}${salt}${digest}"
    n, r, p = params or (SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${n}${r}${p}${salt}${digest}"


def new_token() -> str:
    """A new random bearer token (256 bits)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> bytes:
    """The SHA-256 of a token (what is compared)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def hash_token(token: str) -> str:
    """The stored form of a token: ``sha256$HEX``."""
    return "sha256$" + token_digest(token).hex()


def parse_token_hash(stored: str) -> bytes:
    """The digest of a stored token hash.  :raises InvalidHash: malformed."""
    scheme, _, hexdigest = stored.partition("$")
    try:
        digest = bytes.fromhex(hexdigest)
    except ValueError:
        digest = b""
    if scheme != "sha256" or len(digest) != 32:
        raise InvalidHash(
            "not a token hash (expected sha256$HEX; `wsnmom auth hash-token` writes one)"
        )
    return digest
