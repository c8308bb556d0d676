"""The client's HTTP side against stand-in servers: what the request looks like, and how
answers that are not plain SOAP replies are reported."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from lxml import etree
from wsnmom.core.model import EndpointReference, SoapVersion

from tests.support.threads import serve
from wsnmom.client import SoapFault, TransportError, WsnClient
from wsnmom.client.errors import ResourceUnknownFault
from wsnmom.client.model import tidy_xml

SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"


class Canned:
    """A server answering every POST with ``status``/``body`` and recording requests."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.ctype = "application/soap+xml"
        self.requests: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((dict(self.headers), data))
                self.send_response(outer.status)
                self.send_header("Content-Type", outer.ctype)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serve(self.server)
        self.url = f"http://127.0.0.1:{self.server.server_port}/wsn/broker"


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_request_shape_soap12(canned: Canned) -> None:
    canned.status, canned.body = 202, b""
    param = b'<r:Id xmlns:r="urn:r">9</r:Id>'
    with WsnClient(canned.url) as client:
        client.notify("<x/>", "{urn:t}a", to=EndpointReference(canned.url + "/pp", (param,)))
    headers, data = canned.requests[0]
    assert headers["Content-Type"].startswith("application/soap+xml")
    assert (
        'action="http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"'
        in (headers["Content-Type"])
    )
    assert headers["User-Agent"] == "wsnmom-client"
    env = etree.fromstring(data)
    assert env.findtext(f"{{{SOAP12}}}Header/{{{WSA}}}To") == canned.url + "/pp"
    echoed = env.find(f"{{{SOAP12}}}Header/{{urn:r}}Id")
    assert echoed is not None and echoed.text == "9"
    assert echoed.get(f"{{{WSA}}}IsReferenceParameter") == "true"
    payload = env.find(".//{*}Message/x")
    assert payload is not None and tidy_xml(payload) == b"<x/>"
    topic = env.find(".//{*}Topic")
    assert topic is not None and topic.text == "tns:a" and topic.nsmap["tns"] == "urn:t"


def test_request_shape_soap11(canned: Canned) -> None:
    canned.status = 202
    with WsnClient(canned.url, soap_version=SoapVersion.SOAP11) as client:
        client.notify("<x/>")
    headers, data = canned.requests[0]
    assert headers["Content-Type"].startswith("text/xml")
    assert (
        headers["SOAPAction"] == '"http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"'
    )
    assert (
        etree.QName(etree.fromstring(data)).namespace == "http://schemas.xmlsoap.org/soap/envelope/"
    )


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (200, b"<html>hi</html>", "did not answer a SOAP envelope"),
        (200, b"no xml at all", "did not answer a SOAP envelope"),
        (500, b"Internal Server Error", "HTTP 500"),
        (404, b"", "HTTP 404"),
    ],
)
def test_non_soap_answers(canned: Canned, status: int, body: bytes, match: str) -> None:
    canned.status, canned.body = status, body
    with WsnClient(canned.url) as client, pytest.raises(TransportError, match=match) as info:
        client.topic_expression_dialects()
    assert info.value.status == status


def test_fault_with_status_200_is_still_a_fault(canned: Canned) -> None:
    canned.body = (
        f'<s:Envelope xmlns:s="{SOAP12}"><s:Body><s:Fault><s:Code><s:Value>s:Sender</s:Value>'
        "</s:Code><s:Reason><s:Text>gone</s:Text></s:Reason><s:Detail>"
        '<r:ResourceUnknownFault xmlns:r="http://docs.oasis-open.org/wsrf/r-2" '
        'xmlns:bf="http://docs.oasis-open.org/wsrf/bf-2"><bf:Timestamp>2030-01-01T00:00:00Z'
        "</bf:Timestamp></r:ResourceUnknownFault></s:Detail></s:Fault></s:Body></s:Envelope>"
    ).encode()
    with WsnClient(canned.url) as client, pytest.raises(ResourceUnknownFault) as info:
        client.unsubscribe(canned.url + "/s/1")
    assert info.value.description == "gone" and info.value.status == 200
    assert isinstance(info.value, SoapFault)


def test_empty_answer_to_a_request_response_operation(canned: Canned) -> None:
    canned.status = 202
    with WsnClient(canned.url) as client, pytest.raises(TransportError, match="empty answer"):
        client.unsubscribe(canned.url + "/s/1")
