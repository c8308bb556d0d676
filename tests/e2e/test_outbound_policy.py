"""The outbound-address policy over HTTP: every spelling of a refused address is refused
at Subscribe (and RegisterPublisher with Demand) time with a precise fault, malformed
addresses included, and a consumer named by a host name is reached at the address the
policy checked.

The running gateway (``wsn``) has the default policy (loopback allowed, link-local
refused).  Gateways that need a different policy or a resolver for names run in this
process (``build_runtime`` with an injected resolver) behind a real HTTP server: nothing
here looks a name up or connects anywhere but loopback."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import requests
from lxml import etree
from werkzeug.serving import make_server
from wsnmom.core.config import load_settings
from wsnmom.core.outbound_policy import OutboundPolicy

from tests.e2e.conftest import Answer, Wsn
from tests.fixtures.server import ConsumerServer
from tests.support.soap import content_type, envelope, notify_body, subscribe_body
from tests.support.threads import serve
from tests.support.wsn_schemas import assert_body_valid
from wsnmom.server import build_runtime

pytestmark = pytest.mark.e2e

#: the cloud metadata address in every spelling a resolver or a browser accepts
METADATA_FORMS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://2852039166/",
    "http://0xa9fea9fe/",
    "http://0251.0376.0251.0376/",
    "http://169.254.43518/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[::a9fe:a9fe]/",
    "http://[fe80::1]/",
]

#: loopback in every spelling (refused by a gateway with allow_loopback=false)
LOOPBACK_FORMS = [
    "http://127.0.0.1:{port}/c",
    "http://[::ffff:127.0.0.1]:{port}/c",
    "http://127.1:{port}/c",
    "http://2130706433:{port}/c",
    "http://0x7f000001:{port}/c",
    "http://017700000001:{port}/c",
    "http://[::1]:{port}/c",
    "http://localhost:{port}/c",
]

#: addresses that are not callable URLs at all
MALFORMED = [
    ("http://[::1", "not a URL"),
    ("http://[::1]:99999/c", "bad port"),
    ("http://h:x/c", "bad port"),
    ("http://1.2.3.08/c", "not an IPv4 address"),
    ("http://a b/c", "backslash or a blank"),
    ("http://[v1.fe]/c", "only an IPv6 address may be written in brackets"),
    ("http://[::1]]:80/c", "malformed host or port"),
    ("http://0.0.0.0:80/c", "not a destination address"),
    ("ftp://127.0.0.1/c", "scheme 'ftp'"),
    ("no-scheme", "not an absolute URL"),
]


def _reason(answer: Answer) -> str:
    text = answer.body.find(".//{*}Reason/{*}Text")
    return "" if text is None else (text.text or "")


def _code(answer: Answer) -> str:
    value = answer.body.find(".//{*}Code/{*}Value")
    return "" if value is None else (value.text or "")


def _subscribe(wsn: Wsn, consumer: str) -> Answer:
    return wsn.post(wsn.broker, subscribe_body(consumer, "tns:t", ns=wsn.ns))


def test_every_form_of_the_metadata_address_is_refused_at_subscribe(wsn: Wsn) -> None:
    for url in METADATA_FORMS:
        answer = _subscribe(wsn, url)
        assert answer.status == 500 and answer.fault == "SubscribeCreationFailedFault", url
        reason = _reason(answer)
        assert f"consumer address '{url}' refused: " in reason, reason
        assert "link-local" in reason, reason
        assert "169.254.169.254" in reason or "fe80::1" in reason, reason
        assert _code(answer).endswith("Sender"), answer.data


def test_malformed_consumer_addresses_get_a_precise_fault(wsn: Wsn) -> None:
    for url, words in MALFORMED:
        answer = _subscribe(wsn, url)
        assert answer.status == 500 and answer.fault == "SubscribeCreationFailedFault", url
        assert words in _reason(answer), (url, _reason(answer))


def test_demand_publisher_addresses_are_checked_too(wsn: Wsn) -> None:
    for url in ("http://[::ffff:169.254.169.254]/p", "http://0xa9fea9fe/p", "http://[::1"):
        body = (
            "<wsn-br:RegisterPublisher><wsn-br:PublisherReference>"
            f"<wsa:Address>{url}</wsa:Address></wsn-br:PublisherReference>"
            f'<wsn-br:Topic xmlns:tns="{wsn.ns}">tns:t</wsn-br:Topic>'
            "<wsn-br:Demand>true</wsn-br:Demand></wsn-br:RegisterPublisher>"
        )
        answer = wsn.post(wsn.broker, body)
        assert answer.fault == "PublisherRegistrationRejectedFault", (url, answer.data)
        assert f"publisher address '{url}' refused: " in _reason(answer)


def test_a_malformed_wsa_to_is_a_fault_not_an_internal_error(wsn: Wsn) -> None:
    """wsa:To selects the resource on the broker endpoint; one that is not a URL addresses
    nothing (ResourceUnknown), it never breaks the request."""
    get_property = (
        "<wsrf-rp:GetResourceProperty "
        'xmlns:t="http://docs.oasis-open.org/wsn/b-2">t:FixedTopicSet</wsrf-rp:GetResourceProperty>'
    )
    ok = wsn.post(wsn.broker, get_property, to="http://[::1")
    assert ok.status == 200, ok.data
    destroy = '<wsrf-rl:Destroy xmlns:wsrf-rl="http://docs.oasis-open.org/wsrf/rl-2"/>'
    answer = wsn.post(wsn.broker, destroy, to="http://[::1")
    assert answer.fault == "ResourceUnknownFault", answer.data


# -- gateways in this process, with their own policy and resolver --------------------------
@contextmanager
def _gateway(
    env: dict[str, str], resolver: Callable[[str, int], Sequence[str]]
) -> Iterator[tuple[str, Any]]:
    """A gateway (embedded middleware) with an injected resolver, served over HTTP on a
    free loopback port; yields (broker URL, runtime)."""
    with tempfile.TemporaryDirectory(prefix="wsnmom-policy-") as tmp:
        settings = load_settings(
            None,
            environ={
                "WSNMOM_ADAPTER_URL": f"embedded://{tmp}/mw",
                "WSNMOM_STORE_URL": f"sqlite:///{tmp}/store.db",
                "WSNMOM_RETRY__TIMEOUT": "3",
                **env,
            },
        )
        policy = OutboundPolicy(settings.outbound, resolver=resolver)
        runtime = build_runtime(settings, outbound_policy=policy)
        server = make_server("127.0.0.1", 0, runtime.app, threaded=True)
        serve(server)
        try:
            yield f"http://127.0.0.1:{server.server_port}/wsn/broker", runtime
        finally:
            server.shutdown()
            runtime.close()


def _post(url: str, body: str) -> Answer:
    resp = requests.post(
        url, data=envelope(body), headers={"Content-Type": content_type()}, timeout=10
    )
    if resp.status_code in (200, 500):
        assert_body_valid(resp.content)
    return Answer(resp.status_code, resp.content)


class TableResolver:
    """Resolves from a table, records lookups; unknown names do not exist."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.table[host]


def test_loopback_in_any_form_and_names_resolving_to_refused_addresses(
    consumer: ConsumerServer,
) -> None:
    """allow_loopback=false: every loopback spelling is refused, and so is a name that
    resolves to loopback or link-local (in any form), or to several addresses of which
    one is refused; nothing reaches the loopback consumer."""
    resolver = TableResolver(
        {
            "metadata.test": ["169.254.169.254"],
            "mapped.test": ["::ffff:127.0.0.1"],
            "mixed.test": ["192.0.2.10", "127.0.0.1"],
        }
    )
    env = {"WSNMOM_OUTBOUND__ALLOW_LOOPBACK": "false"}
    with _gateway(env, resolver) as (broker, _):
        ns = "urn:test:policy"
        for template in LOOPBACK_FORMS:
            url = template.format(port=consumer.port)
            answer = _post(broker, subscribe_body(url, "tns:t", ns=ns))
            assert answer.fault == "SubscribeCreationFailedFault", url
            assert "loopback" in _reason(answer), _reason(answer)
        for name, words in (
            ("metadata.test", "metadata.test (169.254.169.254) is a link-local address"),
            ("mapped.test", "mapped.test (127.0.0.1) is a loopback address"),
            ("mixed.test", "mixed.test (127.0.0.1) is a loopback address"),
            ("nowhere.test", "host name nowhere.test does not resolve"),
        ):
            url = f"http://{name}:{consumer.port}/c"
            answer = _post(broker, subscribe_body(url, "tns:t", ns=ns))
            assert answer.fault == "SubscribeCreationFailedFault", url
            assert words in _reason(answer), _reason(answer)
        assert sorted(set(resolver.calls)) == [
            "mapped.test",
            "metadata.test",
            "mixed.test",
            "nowhere.test",
        ]
        answer = _post(broker, notify_body(("tns:t", "<m/>"), ns=ns))
        assert answer.status == 202
    assert consumer.notifies() == []


def test_a_named_consumer_is_reached_at_the_checked_address(
    consumer: ConsumerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is resolved once, by the policy; the delivery connects to that address
    (no second lookup of the name anywhere in the process) and keeps the name in the
    Host header."""
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def recording(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(str(host))
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    resolver = TableResolver({"consumer.test": ["127.0.0.1"]})
    with _gateway({}, resolver) as (broker, _):
        ns = "urn:test:named"
        url = f"http://consumer.test:{consumer.port}/named"
        assert _post(broker, subscribe_body(url, "tns:t", ns=ns)).status == 200
        assert _post(broker, notify_body(("tns:t", "<m>1</m>"), ns=ns)).status == 202
        (rec,) = consumer.wait_for_requests(1)
        assert rec.path == "/named" and rec.headers["Host"] == f"consumer.test:{consumer.port}"
        message = etree.fromstring(rec.body).find(".//{*}Message/m")
        assert message is not None and message.text == "1"
    assert "consumer.test" in resolver.calls
    assert not [h for h in looked_up if "consumer.test" in h]
