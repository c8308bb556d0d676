"""Secrets out of everything the gateway shows: logs, the start-up banner, faults,
property documents, the admin API.

One helper for all of them:

* :func:`redact_url` hides the password of a URL's user part and the values of query
  arguments whose name says they are secret (``kafka://h:9092?sasl.password=...``);
* :func:`redact_config` hides the values of secret keys in a mapping (librdkafka
  properties, adapter options);
* :func:`redact_text` does both inside free text (exception messages, log lines): every
  ``scheme://user:password@`` and every ``secret-name=value``.

A name is secret when it contains ``password``, ``passwd``, ``secret``, ``token``,
``jaas``, ``credential``, ``apikey``/``api_key`` or ends in ``.pem``/``.key``
(:data:`SECRET_NAME`).  The replacement is :data:`REDACTED`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = ["REDACTED", "SECRET_NAME", "redact_config", "redact_text", "redact_url"]

#: shown instead of a secret
REDACTED = "***"
#: names of settings, options and query arguments whose values are secrets
SECRET_NAME = re.compile(
    r"password|passwd|secret|token|jaas|credential|api[_-]?key|\.pem$|\.key$|"
    r"oauthbearer\.config",
    re.I,
)

#: ``scheme://user:password@`` inside text (the password up to the last ``@`` of the
#: authority)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s'\"]*:)[^/?#\s'\"]*@")
#: ``name=value`` where the name is secret (query arguments, key=value lists, options)
_ASSIGNMENT = re.compile(
    r"(?P<name>[A-Za-z0-9_.\-]*(?:password|passwd|secret|token|jaas|credential|api[_-]?key)"
    r"[A-Za-z0-9_.\-]*)(?P<sep>['\"]?\s*[=:]\s*['\"]?)(?P<value>[^&\s'\",;)}\]]+)",
    re.I,
)


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and secret query values hidden."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    hidden = _unencoded_password(url, parts)
    if hidden is not None:
        return redact_url(hidden)
    changed = False
    netloc = parts.netloc
    if parts.password is not None:
        host = netloc.rpartition("@")[2]
        netloc = f"{parts.username or ''}:{REDACTED}@{host}"
        changed = True
    query = parts.query
    if query and SECRET_NAME.search(unquote(query)):
        segments = []
        for segment in query.split("&"):
            name, eq, value = segment.partition("=")
            if eq and value and SECRET_NAME.search(unquote(name)):
                segment = f"{name}={REDACTED}"
                changed = True
            segments.append(segment)
        query = "&".join(segments)
    if not changed:
        return url
    return parts._replace(netloc=netloc, query=query).geturl()


def _unencoded_password(url: str, parts: SplitResult) -> str | None:
    """``url`` with its password hidden when the password holds an ``@``, ``/``, ``?`` or
    ``#`` that is not percent-encoded, or None.  ``urlsplit`` then ends the authority
    inside the password (``u:ab/cd@h``: host ``u``, port ``ab``) and what follows would be
    shown as the path; the user part is taken up to the last ``@`` instead."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest[len(parts.netloc) :]:
        return None
    try:
        broken = "@" in parts.netloc or (parts.port is None and ":" in parts.netloc)
    except ValueError:  # a port that is not a number: part of the password
        broken = True
    user, colon, tail = rest.partition(":")
    if not broken or not colon or any(c in user for c in "/?#@"):
        return None
    return f"{scheme}://{user}:{REDACTED}@{tail.rpartition('@')[2]}"


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the values of secret keys hidden (one level deep)."""
    return {k: (REDACTED if SECRET_NAME.search(str(k)) else v) for k, v in config.items()}


def redact_text(text: str) -> str:
    """``text`` with URL passwords and ``secret-name=value`` values hidden."""
    if "@" not in text and "=" not in text and ":" not in text:
        return text
    text = _USERINFO.sub(lambda m: m.group("head") + REDACTED + "@", text)
    if SECRET_NAME.search(text):
        text = _ASSIGNMENT.sub(
            lambda m: (
                m.group("name") + m.group("sep") + REDACTED
                if m.group("value") != REDACTED
                else m.group(0)
            ),
            text,
        )
    return text
