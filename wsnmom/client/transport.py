"""SOAP over HTTP for the WS-N client: one request envelope out, one Body element back.

Requests are built with the SOAP frontend's own envelope code (SOAP 1.1 or 1.2 with
WS-Addressing ``Action``, ``MessageID`` and ``To``); reference parameters of the target
endpoint reference are echoed as header blocks marked ``wsa:IsReferenceParameter``, as
WS-Addressing requires.  Answers are parsed with the hardened parser; SOAP faults become the
exceptions of :mod:`wsnmom.client.errors`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Final

import requests
from lxml import etree

from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.soap_frontend.envelope import build_envelope, content_type_for, to_bytes
from wsnmom.soap_frontend.xml import WSA, XmlRejected, children, parse_fragment, parse_xml, qname

from .credentials import Credentials
from .errors import TransportError, fault_from_envelope

__all__ = ["USER_AGENT", "SoapTransport"]

USER_AGENT: Final = "wsnmom-client"
_IS_REFERENCE_PARAMETER = qname(WSA, "IsReferenceParameter")


class SoapTransport:
    """Posts SOAP envelopes over a kept-alive ``requests`` session."""

    def __init__(
        self,
        *,
        version: SoapVersion = SoapVersion.SOAP12,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        credentials: Credentials | None = None,
        verify: str | bool | None = None,
        cert: str | tuple[str, str] | None = None,
    ) -> None:
        self.version = version
        #: CA bundle (file or directory) or False for HTTPS brokers; None: requests' default
        self.verify = verify
        #: client certificate (PEM with its key, or (certificate, key)) for mutual TLS
        self.cert = cert
        self.timeout = timeout
        self._own_session = session is None
        self.session = session or requests.Session()
        if session is None:
            self.session.headers["User-Agent"] = USER_AGENT
        self.credentials = credentials
        if credentials is not None:
            credentials.apply(self.session)

    def close(self) -> None:
        """Close the HTTP session (when this transport created it)."""
        if self._own_session:
            self.session.close()

    def call(
        self,
        target: EndpointReference | str,
        body: etree._Element,
        action: str,
        extra_headers: Sequence[etree._Element] = (),
    ) -> etree._Element | None:
        """POST ``body`` to ``target`` (with ``extra_headers`` as SOAP header blocks); the
        answer's first Body element (None for a one-way request answered 202/204 or with
        an empty Body), still in its envelope (its SOAP headers are reachable from it).

        Raises :class:`~wsnmom.client.errors.SoapFault` (or the WsnFault subclass named by
        the fault's detail) for a fault, :class:`~wsnmom.client.errors.TransportError`
        when the broker cannot be reached or does not answer SOAP."""
        epr = EndpointReference(target) if isinstance(target, str) else target
        headers = [_reference_parameter(p) for p in epr.reference_parameters]
        if self.credentials is not None:
            security = self.credentials.security_header()
            if security is not None:
                headers.append(security)
        headers.extend(extra_headers)
        env = build_envelope(
            self.version, body, action=action, to=epr.address, extra_headers=headers
        )
        http_headers = {"Content-Type": content_type_for(self.version, action)}
        if self.version is SoapVersion.SOAP11:
            http_headers["SOAPAction"] = f'"{action}"'
        try:
            resp = self.session.post(
                epr.address,
                data=to_bytes(env),
                headers=http_headers,
                timeout=self.timeout,
                verify=self.verify,
                cert=self.cert,
            )
        except requests.RequestException as exc:
            raise TransportError(f"cannot reach {epr.address}: {exc}") from exc
        return self._answer(epr.address, resp)

    def _answer(self, address: str, resp: requests.Response) -> etree._Element | None:
        status, data = resp.status_code, resp.content
        if status in (202, 204) or (status == 200 and not data.strip()):
            return None
        if status != 200:
            fault = fault_from_envelope(data, status)
            if fault is not None:
                raise fault
            raise TransportError(
                f"{address} answered HTTP {status} {resp.reason}: {_excerpt(data)}",
                status=status,
                body=data,
            )
        try:
            env = parse_xml(data)
        except XmlRejected as exc:
            raise TransportError(
                f"{address} did not answer a SOAP envelope ({exc})", status=status, body=data
            ) from None
        body = env.find("{*}Body")
        if body is None or etree.QName(env).localname != "Envelope":
            raise TransportError(
                f"{address} did not answer a SOAP envelope", status=status, body=data
            )
        kids = children(body)
        if not kids:
            return None
        if etree.QName(kids[0]).localname == "Fault":
            fault = fault_from_envelope(data, status)
            if fault is not None:
                raise fault
        return kids[0]


def _reference_parameter(data: bytes) -> etree._Element:
    el = copy.deepcopy(parse_fragment(data))
    el.set(_IS_REFERENCE_PARAMETER, "true")
    return el


def _excerpt(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(empty body)"
