"""wsnmom's decoder of arriving MQTT 5 QoS 1 PUBLISH packets (adapters/mqtt/inbound_wire.py)
against paho's own: pure, no broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt
from paho.mqtt import _packet
from paho.mqtt.client import MalformedPacket
from wsnmom.adapters.mqtt import inbound_wire
from wsnmom.adapters.mqtt.inbound_wire import Unknown, decode_qos1
from wsnmom.adapters.mqtt.link import Link

QOS1 = 0x32


def _text(s: str) -> bytes:
    raw = s.encode()
    return len(raw).to_bytes(2, "big") + raw


def _vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def _packet_of(topic: str, mid: int, fields: bytes, body: bytes) -> bytearray:
    return bytearray(_text(topic) + mid.to_bytes(2, "big") + _vbi(len(fields)) + fields + body)


def _same(header: int, packet: bytearray) -> None:
    try:
        stock = _packet.decode_publish(header, bytes(packet), mqtt.MQTTv5)
    except MalformedPacket:  # refused by paho (a NUL in a string): left to paho
        with pytest.raises(Unknown):
            decode_qos1(header, packet)
        return
    mine = decode_qos1(header, packet)
    assert isinstance(mine.properties, inbound_wire.InboundProperties)
    assert mine.properties.json() == stock.properties.json()
    assert str(mine.properties) == str(stock.properties)
    assert (mine.topic, mine.mid, mine.dup, mine.retain, mine.payload) == (
        stock.topic.decode(),
        stock.mid,
        stock.dup,
        stock.retain,
        bytes(stock.payload),
    )


_strings = st.text(max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=30),
    mid=st.integers(1, 65535),
    pairs=st.lists(st.tuples(_strings, _strings), max_size=12),
    content_type=_strings,
    text=st.booleans(),
    sub_ids=st.lists(st.integers(1, 268_435_455), max_size=3),
    expiry=st.none() | st.integers(0, 2**32 - 1),
    body=st.binary(max_size=300),
    flags=st.sampled_from([0, 0x08, 0x01, 0x09]),
)
def test_decodes_as_paho_does(
    topic: str,
    mid: int,
    pairs: list[tuple[str, str]],
    content_type: str,
    text: bool,
    sub_ids: list[int],
    expiry: int | None,
    body: bytes,
    flags: int,
) -> None:
    fields = b"\x01\x01" if text else b""
    if content_type:
        fields += b"\x03" + _text(content_type)
    fields += b"".join(b"\x26" + _text(k) + _text(v) for k, v in pairs)
    if expiry is not None:
        fields += b"\x02" + expiry.to_bytes(4, "big")
    fields += b"".join(b"\x0b" + _vbi(i) for i in sub_ids)
    _same(QOS1 | flags, _packet_of(topic, mid, fields, body))


def test_a_property_it_does_not_know_is_left_to_paho() -> None:
    # Topic Alias is known; Maximum QoS (36) is not a PUBLISH property at all
    packet = _packet_of("t", 1, b"\x24\x01", b"x")
    with pytest.raises(Unknown):
        decode_qos1(QOS1, packet)
    # a Correlation Data and a Response Topic are decoded, as paho does
    _same(QOS1, _packet_of("t", 2, b"\x09" + _text("c") + b"\x08" + _text("r/t"), b"x"))


@pytest.mark.parametrize(
    "fields",
    [
        b"\x26\x00\x05ab",  # a user property cut short
        b"\x03\x00\x02\xff\xfe",  # a content type that is not UTF-8
        b"\x01\x01\x01\x01",  # Payload Format Indicator twice
        b"\x0b\x80\x80\x80\x80\x01",  # a variable byte integer of five bytes
    ],
)
def test_malformed_properties_are_left_to_paho(fields: bytes) -> None:
    with pytest.raises(Unknown):
        decode_qos1(QOS1, _packet_of("t", 1, fields, b"x"))


def test_every_link_uses_the_decoder_with_the_installed_paho() -> None:
    """The import check passed with the paho the project installs: links decode QoS 1
    PUBLISH packets themselves (a paho that changed its internals falls back to its own
    decoder, and this test says so)."""
    assert inbound_wire.CLIENT_CLASS is inbound_wire.Client
    from wsnmom.adapters.mqtt.config import parse_settings

    link = Link(parse_settings("mqtt://127.0.0.1:1"), "wsnmom-test", persistent=False, label="t")
    assert isinstance(link.client, inbound_wire.Client)
