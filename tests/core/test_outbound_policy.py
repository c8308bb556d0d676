"""The one outbound-address policy (core.outbound_policy): every numeric host form is
normalised before the rules apply, names are resolved with an injected resolver (these
tests never look anything up), every resolved address is checked, refusals say why, and
the broker applies it at Subscribe and RegisterPublisher time."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.config import OutboundSettings
from wsnmom.core.model import EndpointReference, RegisterPublisherRequest, SubscribeRequest
from wsnmom.core.outbound_policy import (
    AddressRefused,
    Destination,
    OutboundPolicy,
    normalise_host,
)

from .conftest import Broker

METADATA = "169.254.169.254"

#: every spelling of the cloud metadata address a resolver or browser accepts
METADATA_FORMS = [
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[0:0:0:0:0:ffff:169.254.169.254]:80/",
    "http://2852039166/",
    "http://0xa9fea9fe/",
    "http://0XA9FEA9FE/",
    "http://0251.0376.0251.0376/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://169.254.43518/",
    "http://169.16689662/",
    "http://169.254.169.254./",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[::a9fe:a9fe]/",
    "http://[2002:a9fe:a9fe::1]/",
]

LOOPBACK_FORMS = [
    "http://127.0.0.1:9/c",
    "http://127.1:9/c",
    "http://127.0.1/c",
    "http://2130706433/c",
    "http://0x7f000001/c",
    "http://0x7f.1/c",
    "http://017700000001/c",
    "http://0177.0.0.1/c",
    "http://127.255.255.254/c",
    "http://[::1]:9/c",
    "http://[::ffff:127.0.0.1]:9/c",
    "http://[::ffff:7f00:1]/c",
    "http://[0:0:0:0:0:0:0:1]/c",
    "http://localhost:9/c",
    "http://LocalHost./c",
    "http://a.b.localhost/c",
]


class FakeResolver:
    """Answers from a table; records every lookup; never touches the network."""

    def __init__(self, table: dict[str, Sequence[str]] | None = None) -> None:
        self.table = dict(table or {})
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> Sequence[str]:
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.table[host]


@pytest.fixture(autouse=True)
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests must not resolve anything for real."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected DNS lookup {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def refusal(policy: OutboundPolicy, url: str) -> str:
    with pytest.raises(AddressRefused) as info:
        policy.check(url)
    return info.value.reason


@pytest.mark.parametrize("url", METADATA_FORMS)
def test_every_form_of_the_metadata_address_is_refused(url: str) -> None:
    reason = refusal(OutboundPolicy(), url)
    assert "link-local" in reason and METADATA in reason, reason
    assert "outbound.allow_link_local" in reason


#: issue 22 item 7: cloud metadata addresses outside 169.254.0.0/16 were accepted
OTHER_METADATA_FORMS = [
    ("http://[fd00:ec2::254]/latest/meta-data", "fd00:ec2::254"),
    ("http://[FD00:0EC2:0:0:0:0:0:0254]/", "fd00:ec2::254"),
    ("http://[fd00:ec2::254%25eth0]/", "fd00:ec2::254"),
    ("http://[fd00:ec2::23]/", "fd00:ec2::23"),
    ("http://100.100.100.200/latest/meta-data", "100.100.100.200"),
    ("http://[::ffff:100.100.100.200]/", "100.100.100.200"),
    ("http://[::ffff:6464:64c8]/", "100.100.100.200"),
    ("http://[64:ff9b::6464:64c8]/", "100.100.100.200"),
    ("http://1684301000/", "100.100.100.200"),
    ("http://0x646464c8/", "100.100.100.200"),
    ("http://0144.0144.0144.0310/", "100.100.100.200"),
    ("http://100.100.25800/", "100.100.100.200"),
    ("http://192.0.0.192/opc/v2/instance/", "192.0.0.192"),
    ("http://[::ffff:c000:c0]/", "192.0.0.192"),
    ("http://3221225664/", "192.0.0.192"),
    ("http://168.63.129.16/", "168.63.129.16"),
    ("http://metadata-v6.test/", "fd00:ec2::254"),
    ("http://alibaba.test/", "100.100.100.200"),
]
METADATA_NAMES = {"metadata-v6.test": ["fd00:ec2::254"], "alibaba.test": ["100.100.100.200"]}


@pytest.mark.parametrize(("url", "address"), OTHER_METADATA_FORMS)
def test_every_cloud_metadata_address_is_refused_by_default(url: str, address: str) -> None:
    for settings in (OutboundSettings(), OutboundSettings(allow_link_local=True)):
        reason = refusal(OutboundPolicy(settings, resolver=FakeResolver(METADATA_NAMES)), url)
        assert "cloud instance metadata" in reason and address in reason, reason
        assert "outbound.allow_cloud_metadata" in reason


def test_link_local_metadata_stays_refused_when_link_local_is_allowed() -> None:
    policy = OutboundPolicy(OutboundSettings(allow_link_local=True))
    for url in METADATA_FORMS:
        assert "cloud instance metadata" in refusal(policy, url)
    policy.check("http://169.254.1.1/")  # other link-local addresses are allowed then
    admitted = OutboundPolicy(
        OutboundSettings(allow_link_local=True, allow_cloud_metadata=True),
        resolver=FakeResolver(METADATA_NAMES),
    )
    for url, _ in OTHER_METADATA_FORMS:
        admitted.check(url)
    admitted.check("http://169.254.169.254/")


PRIVATE_FORMS = [
    "http://10.0.0.1/c",
    "http://10.1/c",
    "http://0xa000001/c",
    "http://172.16.0.1/c",
    "http://172.31.255.254/c",
    "http://192.168.1.10:8080/c",
    "http://100.64.0.1/c",
    "http://198.18.0.1/c",
    "http://[fd12:3456::1]/c",
    "http://[fc00::1]/c",
    "http://[::ffff:10.0.0.1]/c",
    "http://[64:ff9b::a00:1]/c",
    "http://intranet.test/c",
]


@pytest.mark.parametrize("url", PRIVATE_FORMS)
def test_the_strict_profile_refuses_private_and_loopback(url: str) -> None:
    resolver = FakeResolver({"intranet.test": ["192.0.2.1", "10.2.3.4"]})
    strict = OutboundPolicy(
        OutboundSettings(allow_loopback=False, allow_private=False), resolver=resolver
    )
    reason = refusal(strict, url)
    assert "private address" in reason and "outbound.allow_private" in reason, reason
    for loopback in LOOPBACK_FORMS:
        assert "loopback" in refusal(strict, loopback)
    strict.check("http://192.0.2.1/c")  # a public address is still fine
    OutboundPolicy(resolver=resolver).check(url)  # the default allows private networks


@pytest.mark.parametrize("url", LOOPBACK_FORMS)
def test_every_loopback_form_is_refused_without_allow_loopback(url: str) -> None:
    policy = OutboundPolicy(OutboundSettings(allow_loopback=False), resolver=FakeResolver())
    reason = refusal(policy, url)
    assert "loopback" in reason and "outbound.allow_loopback" in reason, reason


@pytest.mark.parametrize("url", [u for u in LOOPBACK_FORMS if "localhost" not in u.lower()])
def test_loopback_forms_are_reached_at_their_canonical_address(url: str) -> None:
    dest = OutboundPolicy().check(url)
    assert dest.literal and dest.addresses[0].is_loopback
    assert isinstance(dest.addresses[0], ipaddress.IPv4Address) or str(dest.addresses[0]) == "::1"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://[::1", "not a URL"),
        ("http://[abc]/", "not a URL"),
        ("http://[v1.fe]/", "only an IPv6 address may be written in brackets"),
        ("http://[::1]]/", "malformed host or port"),
        ("http://[::1]x/", "malformed host or port"),
        ("http://127.0.0.1:80:80/", "malformed host or port"),
        ("http://1.2.3.4\\@127.0.0.1/", "backslash"),
        ("http://a b/", "backslash or a blank"),
        ("http://h:99999/", "bad port"),
        ("http://h:abc/", "bad port"),
        ("http://h:0/", "port 0"),
        ("http:///x", "not an absolute URL"),
        ("consumer", "not an absolute URL"),
        ("", "not an absolute URL"),
        ("ftp://127.0.0.1/c", "scheme 'ftp'"),
        ("gopher://127.0.0.1:70/", "scheme 'gopher'"),
        ("http://1.2.3.08/", "not an IPv4 address"),
        ("http://1.2.3.4.5/", "not an IPv4 address"),
        ("http://256.1.1.1/", "not an IPv4 address"),
        ("http://1.2.3.0x100/", "not an IPv4 address"),
        ("http://4294967296/", "not an IPv4 address"),
        ("http://%31%32%37.0.0.1/", "not an IPv4 address"),
        ("http://ex%61mple.test/", "not a valid host name"),
        ("http://-bad-.test/", "not a valid host name"),
        ("http://" + "a" * 64 + ".test/", "not a valid host name"),
        ("http://0.0.0.0:8080/", "not a destination address"),
        ("http://0/", "not a destination address"),
        ("http://0.1.2.3/", "not a destination address"),
        ("http://[::]/", "not a destination address"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://255.255.255.255/", "reserved"),
        ("http://240.0.0.1/", "reserved"),
        ("http://[fe80::1%25eth0]/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fec0::1]/", "link-local"),
        ("http://[::ffff:0.0.0.0]/", "not a destination address"),
        ("http://[::ffff:224.0.0.1]/", "multicast"),
    ],
)
def test_malformed_and_never_callable_addresses(url: str, words: str) -> None:
    reason = refusal(OutboundPolicy(resolver=FakeResolver()), url)
    assert words in reason, reason


def test_normalise_host_forms() -> None:
    assert normalise_host("2852039166") == ("169.254.169.254", ipaddress.ip_address(METADATA))
    assert normalise_host("::ffff:127.0.0.1")[0] == "127.0.0.1"
    assert normalise_host("Example.TEST.") == ("example.test", None)
    assert normalise_host("bücher.example") == ("xn--bcher-kva.example", None)
    assert normalise_host("0x") == ("0.0.0.0", ipaddress.ip_address("0.0.0.0"))
    assert normalise_host("1e2.test") == ("1e2.test", None)  # a letter in the last label
    with pytest.raises(ValueError, match="not an IPv4 address"):
        normalise_host("example.123")


def test_names_are_resolved_and_every_address_checked() -> None:
    resolver = FakeResolver(
        {
            "metadata.test": [METADATA],
            "mapped.test": ["::ffff:169.254.169.254"],
            "one-bad.test": ["192.0.2.10", "2001:db8::1", "169.254.1.1"],
            "good.test": ["192.0.2.10", "2001:db8::1"],
            "loop.test": ["::ffff:127.0.0.1"],
            "junk.test": ["not-an-address"],
            "empty.test": [],
        }
    )
    policy = OutboundPolicy(OutboundSettings(allow_loopback=False), resolver=resolver)
    assert "metadata.test (169.254.169.254) is a link-local" in refusal(
        policy, "http://metadata.test/"
    )
    assert "link-local" in refusal(policy, "http://mapped.test/")
    assert "169.254.1.1" in refusal(policy, "http://one-bad.test/")
    assert "loopback" in refusal(policy, "http://loop.test/")
    assert "not an IP address" in refusal(policy, "http://junk.test/")
    assert "has no addresses" in refusal(policy, "http://empty.test/")
    assert "does not resolve" in refusal(policy, "http://nowhere.test/")
    dest = policy.check("https://Good.Test:8443/a/b?c=1#frag")
    assert dest == Destination(
        scheme="https",
        host="good.test",
        port=8443,
        addresses=(ipaddress.ip_address("192.0.2.10"), ipaddress.ip_address("2001:db8::1")),
        literal=False,
        host_header="good.test:8443",
        target="/a/b?c=1",
    )
    assert dest.connect_host == "192.0.2.10" and dest.server_hostname == "good.test"
    assert dest.url == "https://good.test:8443/a/b?c=1"


def test_a_temporary_resolver_failure_is_temporary() -> None:
    def flaky(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(AddressRefused) as info:
        OutboundPolicy(resolver=flaky).check("http://consumer.test/")
    assert info.value.temporary and "cannot resolve consumer.test now" in info.value.reason
    with pytest.raises(AddressRefused) as info:
        OutboundPolicy(resolver=FakeResolver()).check("http://consumer.test/")
    assert not info.value.temporary


def test_deny_and_allow_lists_see_every_form() -> None:
    resolver = FakeResolver({"db.internal": ["10.0.0.5"], "app.test": ["10.1.2.3"]})
    deny = OutboundPolicy(
        OutboundSettings(deny=["10.0.0.0/8", "*.evil.test", "0x0a000001"]), resolver=resolver
    )
    assert "deny list" in refusal(deny, "http://[::ffff:10.9.9.9]/")
    assert "deny list" in refusal(deny, "http://167772161/")  # 10.0.0.1 in decimal
    assert "deny list" in refusal(deny, "http://app.test/")  # by its resolved address
    assert "deny list" in refusal(deny, "http://x.EVIL.test./")
    assert resolver.calls == ["app.test"]  # a denied name is refused before any lookup
    allow = OutboundPolicy(
        OutboundSettings(allow=["192.0.2.0/24", "*.partner.test"]),
        resolver=FakeResolver({"a.partner.test": ["198.51.100.1"], "b.test": ["192.0.2.1"]}),
    )
    allow.check("http://[::ffff:192.0.2.9]/")
    allow.check("http://a.partner.test/")
    allow.check("http://b.test/")
    assert "allow list" in refusal(allow, "http://127.0.0.1/")


def test_resolutions_are_reused_for_resolve_cache_seconds() -> None:
    resolver = FakeResolver({"c.test": ["192.0.2.1"]})
    policy = OutboundPolicy(resolver=resolver)
    for path in ("/a", "/b", "/c"):
        assert policy.check(f"http://c.test{path}").target == path
    assert resolver.calls == ["c.test"]
    uncached = OutboundPolicy(OutboundSettings(resolve_cache=0), resolver=resolver)
    uncached.check("http://c.test/")
    uncached.check("http://c.test/")
    assert resolver.calls == ["c.test"] * 3
    resolver.table["c.test"] = [METADATA]  # a refusal is never cached
    with pytest.raises(AddressRefused):
        uncached.check("http://c.test/")
    with pytest.raises(AddressRefused):
        uncached.check("http://c.test/")


def test_extra_rules_see_the_checked_destination() -> None:
    seen: list[Destination] = []

    def not_port_25(destination: Destination) -> str | None:
        seen.append(destination)
        return "port 25 is mail" if destination.port == 25 else None

    policy = OutboundPolicy(resolver=FakeResolver({"mx.test": ["192.0.2.25"]}))
    policy.check("http://mx.test:25/")  # cached before the rule exists
    policy.add_rule(not_port_25)
    assert refusal(policy, "http://mx.test:25/") == "port 25 is mail"
    assert seen[-1].addresses == (ipaddress.ip_address("192.0.2.25"),)
    policy.check("http://mx.test:80/")
    ruled = OutboundPolicy(rules=[not_port_25])
    assert refusal(ruled, "http://192.0.2.1:25/") == "port 25 is mail"


# -- the broker applies it ------------------------------------------------------------------
def _subscribe(address: str) -> SubscribeRequest:
    return SubscribeRequest(consumer=EndpointReference(address))


@pytest.mark.parametrize("url", [*METADATA_FORMS, "http://metadata.test/", "http://[::1"])
def test_subscribe_refuses_with_a_precise_fault(make_broker: Any, url: str) -> None:
    resolver = FakeResolver({"metadata.test": ["::ffff:169.254.169.254"]})
    b: Broker = make_broker(resolver=resolver)
    assert b.service is not None
    with pytest.raises(errors.SubscribeCreationFailed) as info:
        b.service.subscribe(_subscribe(url))
    assert f"consumer address {url!r} refused: " in str(info.value)
    assert not b.service.registry.subscriptions


def test_subscribe_refuses_loopback_forms_when_loopback_is_off(make_broker: Any) -> None:
    b: Broker = make_broker(outbound__allow_loopback=False, resolver=FakeResolver())
    assert b.service is not None
    for url in LOOPBACK_FORMS:
        with pytest.raises(errors.SubscribeCreationFailed, match="loopback"):
            b.service.subscribe(_subscribe(url))


def test_register_publisher_with_demand_refuses_the_publisher(make_broker: Any) -> None:
    from wsnmom.core.model import ExpressionSource

    b: Broker = make_broker(resolver=FakeResolver({"pub.test": ["fe80::7"]}))
    assert b.service is not None
    for url in ("http://[::ffff:169.254.169.254]/p", "http://pub.test/p", "http://[::1"):
        with pytest.raises(errors.PublisherRegistrationRejected, match="refused: "):
            b.service.register_publisher(
                RegisterPublisherRequest(
                    publisher_reference=EndpointReference(url),
                    topics=(ExpressionSource(None, "t:a", {"t": "urn:t"}),),
                    demand=True,
                )
            )
