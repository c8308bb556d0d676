"""Delivery loops refused (``core.loops``): the gateway's own endpoints are never a
consumer or a demand publisher, and the hop marker stops loops between gateways.

Address checks for names use an injected resolver (no lookups leave the machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from wsnmom.core import errors, interfaces
from wsnmom.core.codec import decode, encode
from wsnmom.core.config import OutboundSettings
from wsnmom.core.interfaces import parse_fib_trie, parse_if_inet6
from wsnmom.core.loops import LoopGuard, SelfAddressRule
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    InboundNotification,
    NotificationMessage,
    RegisterPublisherRequest,
    SubscribeRequest,
)
from wsnmom.core.outbound_policy import AddressRefused, OutboundPolicy
from wsnmom.topic_mapping.model import Topic

from .conftest import Broker, note, simple


def resolver(table: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError(f"unknown test host {host}")
        return table[host]

    return resolve


NAMES = resolver(
    {
        "gw.example.com": ["192.0.2.10"],
        "alias.example.com": ["192.0.2.10"],
        "elsewhere.example.com": ["192.0.2.99"],
        "localhost": ["127.0.0.1", "::1"],
        "this-host": ["192.0.2.50"],
    }
)


def policy(rule: SelfAddressRule) -> OutboundPolicy:
    return OutboundPolicy(OutboundSettings(), resolver=NAMES, rules=[rule])


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:8080/wsn/broker",
        "http://localhost:8080/wsn/subscriptions/abc",
        "http://[::ffff:127.0.0.1]:8080/wsn/broker",
        "http://2130706433:8080/wsn/broker",  # 127.0.0.1 as a number
        "http://127.0.0.1:8080//wsn/./broker",
        "http://127.0.0.1:8080/%77sn/broker",
        "https://gw.example.com/prefix/wsn/broker",
        "https://alias.example.com/prefix/wsn/registrations/x",  # same address as public
    ],
)
def test_own_endpoints_are_refused(address: str) -> None:
    rule = SelfAddressRule("https://gw.example.com/prefix", "127.0.0.1", 8080, resolver=NAMES)
    with pytest.raises(AddressRefused, match="this gateway's own endpoint"):
        policy(rule).check(address)


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:8080/consumer",  # loopback consumers stay allowed
        "http://127.0.0.1:9090/wsn/broker",  # another gateway on this machine
        "http://127.0.0.2:8080/wsn/broker",  # not an address this gateway listens on
        "https://elsewhere.example.com/prefix/wsn/broker",
        "https://gw.example.com/other/wsn/broker",  # outside the public path
        "http://localhost:8080/wsnx/broker",
    ],
)
def test_other_addresses_are_not_refused(address: str) -> None:
    rule = SelfAddressRule("https://gw.example.com/prefix", "127.0.0.1", 8080, resolver=NAMES)
    policy(rule).check(address)


def test_wildcard_listen_address_counts_every_local_address() -> None:
    rule = SelfAddressRule(
        "http://0.0.0.0:8080", "0.0.0.0", 8080, resolver=NAMES, local_addresses=["192.0.2.50"]
    )
    p = policy(rule)
    for address in (
        "http://127.0.0.5:8080/wsn/broker",
        "http://192.0.2.50:8080/wsn/broker",
        "http://[::1]:8080/wsn/broker",
    ):
        with pytest.raises(AddressRefused):
            p.check(address)
    p.check("http://192.0.2.51:8080/wsn/broker")


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
     |-- 203.0.113.0
        /24 link UNICAST
     |-- 203.0.113.7
        /32 host LOCAL
     |-- 203.0.113.255
        /32 link BROADCAST
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
20010db8000000000000000000000007 04 40 00 82     eth0
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
"""


def test_interface_addresses_from_the_kernel_listings() -> None:
    assert parse_fib_trie(FIB_TRIE) == {"127.0.0.1", "203.0.113.7"}
    assert parse_if_inet6(IF_INET6) == {"::1", "2001:db8::7", "fe80::fc:ff:fe00:1"}
    assert parse_fib_trie("junk\n|-- not-an-address\n/32 host LOCAL\n") == set()


def test_wildcard_listen_address_counts_every_interface_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 7: a gateway on 0.0.0.0 accepted its own eth0 address as a consumer
    of /wsn/broker (only what its host name resolves to counted)."""
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text(IF_INET6)
    monkeypatch.setattr(interfaces, "_FIB_TRIE", tmp_path / "fib_trie")
    monkeypatch.setattr(interfaces, "_IF_INET6", tmp_path / "if_inet6")
    rule = SelfAddressRule("http://gw.example.com:8080", "0.0.0.0", 8080, resolver=NAMES)
    p = policy(rule)
    for address in ("http://203.0.113.7:8080/wsn/broker", "http://[2001:db8::7]:8080/wsn/x"):
        with pytest.raises(AddressRefused, match="this gateway's own endpoint"):
            p.check(address)
    p.check("http://203.0.113.8:8080/wsn/broker")  # another host on the same network
    p.check("http://203.0.113.7:8081/wsn/broker")  # another port


def test_subscribe_and_register_publisher_refuse_the_gateway_itself(
    make_broker: Any,
) -> None:
    b: Broker = make_broker(public_url="http://127.0.0.1:18080", port=18080, resolver=NAMES)
    service = b.service
    assert service is not None
    for address in (service.broker_address, "http://localhost:18080/wsn/broker"):
        with pytest.raises(errors.ConsumerAddressRefused, match="loop"):
            service.subscribe(SubscribeRequest(EndpointReference(address), topic=simple("t:a")))
    with pytest.raises(errors.PublisherRegistrationRejected, match="own endpoint"):
        service.register_publisher(
            RegisterPublisherRequest(
                publisher_reference=EndpointReference(service.broker_address),
                topics=(simple("t:a"),),
                demand=True,
            )
        )
    # one of its live pull points is still a consumer (fed inside the gateway)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.subscribe(
        SubscribeRequest(EndpointReference(service.pull_point_address(pp.id)), topic=simple("t:a"))
    )


# ----------------------------------------------------------------------------- hop marker


def test_loop_guard_stamps_and_drops() -> None:
    guard = LoopGuard("gw-a", max_hops=3)
    assert guard.stamp(()) == ("gw-a",)
    assert guard.stamp(("gw-b",)) == ("gw-b", "gw-a")
    assert guard.stamp(("gw-b", "gw-a")) is None  # came back
    assert guard.stamp(("gw-x", "gw-y", "gw-z")) is None  # max_hops gateways already
    with pytest.raises(ValueError):
        LoopGuard("has space", 3)


def test_via_travels_through_the_middleware_headers() -> None:
    message = NotificationMessage("m1", b"<m/>", topic=Topic("urn:t", ("a",)), via=("gw-a", "gw-b"))
    out = encode(message)
    assert out.headers["wsnmom-via"] == "gw-a gw-b"

    class Received:
        headers = out.headers
        body = out.body
        content_type = out.content_type
        topic = out.topic

    assert decode(Received()).via == ("gw-a", "gw-b")  # type: ignore[arg-type]


def test_notify_that_came_back_is_dropped_but_accepted(make_broker: Any) -> None:
    b: Broker = make_broker(loops__gateway_id="gw-self", loops__max_hops=4)
    service = b.service
    assert service is not None
    service.notify([note("<m>new</m>", simple("t:a"))])
    service.notify(
        [
            InboundNotification(b"<m>back</m>", simple("t:a"), via=("gw-other", "gw-self")),
            InboundNotification(b"<m>ok</m>", simple("t:a"), via=("gw-other",)),
        ]
    )
    current = service.get_current_message(simple("t:a"))
    assert current.payload == b"<m>ok</m>"
    assert current.via == ("gw-other", "gw-self")
