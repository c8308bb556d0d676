"""Credentials the client presents to a broker that requires authentication.

:class:`Credentials` is one of: an HTTP Basic name and password, a bearer token, or a
WS-Security UsernameToken (the name and password carried in the SOAP header, as
``PasswordDigest`` -- the default -- or ``PasswordText``), for brokers and clients that
speak only that (ONVIF).  The UsernameToken gets a fresh nonce and creation time for each
request.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import requests
from lxml import etree

from wsnmom.soap_frontend.wsse import PASSWORD_DIGEST, PASSWORD_TEXT, WSSE, token_digest
from wsnmom.soap_frontend.xml import WSU, qname

__all__ = ["Credentials"]


@dataclass(frozen=True, slots=True)
class Credentials:
    """How the client authenticates (see the module docstring)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    #: send ``user``/``password`` as a UsernameToken ("digest" or "text") instead of
    #: HTTP Basic
    wsse: Literal["digest", "text"] | None = None

    def __post_init__(self) -> None:
        if self.token is not None and self.user is not None:
            raise ValueError("give either a token or a user name and password, not both")
        if self.user is not None and self.password is None:
            raise ValueError(f"no password for user {self.user!r}")
        if self.wsse is not None and self.user is None:
            raise ValueError("a UsernameToken needs a user name and password")

    def apply(self, session: requests.Session) -> None:
        """Put the HTTP credentials on ``session`` (Basic or bearer)."""
        if self.token is not None:
            session.headers["Authorization"] = f"Bearer {self.token}"
        elif self.user is not None and self.wsse is None:
            session.auth = (self.user, self.password or "")

    def security_header(self) -> etree._Element | None:
        """A ``wsse:Security`` header block with a fresh UsernameToken, or None."""
        if self.wsse is None or self.user is None:
            return None
        password = self.password or ""
        security = etree.Element(qname(WSSE, "Security"), nsmap={"wsse": WSSE, "wsu": WSU})
        token = etree.SubElement(security, qname(WSSE, "UsernameToken"))
        etree.SubElement(token, qname(WSSE, "Username")).text = self.user
        nonce = os.urandom(16)
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        element = etree.SubElement(token, qname(WSSE, "Password"))
        if self.wsse == "digest":
            element.set("Type", PASSWORD_DIGEST)
            element.text = token_digest(nonce, created, password)
        else:
            element.set("Type", PASSWORD_TEXT)
            element.text = password
        nonce_el = etree.SubElement(token, qname(WSSE, "Nonce"))
        nonce_el.set(
            "EncodingType",
            "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0"
            "#Base64Binary",
        )
        nonce_el.text = base64.b64encode(nonce).decode("ascii")
        etree.SubElement(token, qname(WSU, "Created")).text = created
        return security
