"""The subscription sessions' MQTT 5 codec and state machine (adapters/mqtt/sub_codec.py,
sub_protocol.SessionProtocol): pure, no broker, no thread.

Arriving packets are built with paho's public ``Properties.pack`` (hypothesis) or written
by hand from the MQTT 5.0 standard; the packets the session sends are read back with
paho's public ``Properties.unpack`` or compared with hand-written bytes."""

from __future__ import annotations

import pytest

pytest.importorskip("paho.mqtt")

from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from wsnmom.adapters.mqtt.reason_codes import reason_name
from wsnmom.adapters.mqtt.sub_codec import (
    Connack,
    Disconnect,
    Pingresp,
    Publish,
    SubAck,
    Violation,
    decode,
    encode_connect,
    encode_disconnect,
    encode_puback,
    encode_subscribe,
    encode_unsubscribe,
    split,
)
from wsnmom.adapters.mqtt.sub_protocol import SessionProtocol


def _vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def _s(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _vbi(len(body)) + body


def _one(data: bytes) -> object:
    packets, used = split(data)
    assert used == len(data) and len(packets) == 1
    return decode(*packets[0])


# MQTT strings: no U+0000, no surrogates (UTF-8 cannot carry them)
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_topic = _text.filter(lambda t: t and "+" not in t and "#" not in t and len(t.encode()) < 500)


@settings(max_examples=200, deadline=None)
@given(
    topic=_topic,
    payload=st.binary(max_size=300),
    pid=st.integers(1, 0xFFFF),
    dup=st.booleans(),
    retain=st.booleans(),
    pairs=st.lists(st.tuples(_text, _text), max_size=12),
    content_type=st.none() | _text,
    extras=st.booleans(),
)
def test_a_publish_packed_by_paho_decodes_to_its_fields(
    topic: str,
    payload: bytes,
    pid: int,
    dup: bool,
    retain: bool,
    pairs: list[tuple[str, str]],
    content_type: str | None,
    extras: bool,
) -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if pairs:
        props.UserProperty = pairs
    if content_type is not None:
        props.ContentType = content_type
    if extras:  # checked and dropped
        props.PayloadFormatIndicator = 1
        props.MessageExpiryInterval = 3600
        props.ResponseTopic = "r/t"
        props.CorrelationData = b"\x00\x01"
        props.SubscriptionIdentifier = 200
    flags = (0x08 if dup else 0) | 0x02 | (0x01 if retain else 0)
    body = _s(topic) + pid.to_bytes(2, "big") + props.pack() + payload  # type: ignore[no-untyped-call]
    got = _one(_frame(0x30 | flags, body))
    assert got == Publish(topic, payload, 1, dup, retain, pid, tuple(pairs), content_type)


def test_a_qos0_publish_has_no_packet_identifier() -> None:
    got = _one(_frame(0x30, _s("a/b") + b"\x00" + b"body"))
    assert got == Publish("a/b", b"body", 0, False, False, 0, (), None)


@settings(max_examples=100, deadline=None)
@given(
    messages=st.lists(st.tuples(_topic, st.binary(max_size=200)), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 4000), max_size=6),
)
def test_split_finds_the_same_packets_however_the_bytes_arrive(
    messages: list[tuple[str, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(
        _frame(0x32, _s(t) + (i + 1).to_bytes(2, "big") + b"\x00" + p)
        for i, (t, p) in enumerate(messages)
    )
    buffer = bytearray()
    found: list[object] = []
    at = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        buffer += stream[at:cut]
        at = max(at, cut)
        packets, used = split(buffer)
        del buffer[:used]
        found.extend(decode(*p) for p in packets)
    assert not buffer
    assert [(p.topic, p.payload, p.packet_id) for p in found] == [  # type: ignore[attr-defined]
        (t, p, i + 1) for i, (t, p) in enumerate(messages)
    ]


def test_connack_with_paho_packed_properties() -> None:
    props = Properties(PacketTypes.CONNACK)  # type: ignore[no-untyped-call]
    props.ServerKeepAlive = 7
    props.ReceiveMaximum = 20
    props.TopicAliasMaximum = 10
    props.ReasonString = "ok"
    props.UserProperty = [("k", "v")]
    props.MaximumPacketSize = 1 << 20
    props.SharedSubscriptionAvailable = 1
    got = _one(_frame(0x20, b"\x01\x00" + props.pack()))  # type: ignore[no-untyped-call]
    assert got == Connack(True, 0, 7, "ok")
    # MQTT 5: a CONNACK may leave its properties out altogether? no: but a refusal with
    # an empty property length is common
    assert _one(b"\x20\x03\x00\x87\x00") == Connack(False, 0x87, None, None)


def test_acknowledgements_pingresp_and_disconnect_from_the_standard() -> None:
    assert _one(b"\x90\x05\x00\x07\x00\x01\x87") == SubAck(7, (0x01, 0x87), False)
    assert _one(b"\xb0\x04\x00\x07\x00\x11") == SubAck(7, (0x11,), True)
    assert _one(b"\xd0\x00") == Pingresp()
    assert _one(b"\xe0\x00") == Disconnect(0, None)
    assert _one(b"\xe0\x01\x8e") == Disconnect(0x8E, None)
    assert _one(b"\xe0\x07\x8e\x05\x1f\x00\x02hi") == Disconnect(0x8E, "hi")


@pytest.mark.parametrize(
    ("first", "body", "reason"),
    [
        (0x36, b"\x00\x01a\x00\x01\x00", 0x81),  # QoS 3
        (0x34, b"\x00\x01a\x00\x01\x00", 0x82),  # QoS 2: never granted
        (0x38, b"\x00\x01a\x00", 0x81),  # QoS 0 with DUP
        (0x32, b"\x00\x01a\x00\x00\x00", 0x81),  # packet identifier 0
        (0x32, b"\x00\x02\xc3\x28\x00\x01\x00", 0x81),  # topic not UTF-8
        (0x32, b"\x00\x01\x00\x00\x01\x00", 0x81),  # topic with U+0000
        (0x32, b"\x00\x01#\x00\x01\x00", 0x82),  # topic with a wildcard
        (0x32, b"\x00\x00\x00\x01\x03\x23\x00\x01", 0x94),  # topic alias, none allowed
        (0x32, b"\x00\x00\x00\x01\x00", 0x82),  # empty topic, no alias
        (0x32, b"\x00\x01a\x00\x01\x05\x11\x00\x00\x00\x00", 0x81),  # CONNECT property
        (0x32, b"\x00\x01a\x00\x01\x03\x7f\x00\x00", 0x81),  # unknown property
        (0x32, b"\x00\x01a\x00\x01\x05\x03\x00\x00\x03\x00", 0x81),  # Content Type cut
        (0x32, b"\x00\x01a\x00\x01\x06\x03\x00\x00\x03\x00\x00", 0x82),  # twice
        (0x32, b"\x00\x01a\x00\x01\x02\x0b\x00", 0x82),  # Subscription Identifier 0
        (0x32, b"\x00\x01a\x00\x01\x05", 0x81),  # properties past the packet
        (0x32, b"\x00\x05abc", 0x81),  # topic past the packet
        (0x21, b"\x00\x00", 0x81),  # CONNACK reserved flags
        (0x20, b"\x02\x00", 0x81),  # CONNACK reserved acknowledge flags
        (0x20, b"\x01\x87", 0x82),  # refusal with session present
        (0x20, b"\x00", 0x81),  # CONNACK too short
        (0x90, b"\x00\x01\x00", 0x82),  # SUBACK without reason codes
        (0xD0, b"\x00", 0x81),  # PINGRESP with a body
        (0x10, b"", 0x81),  # CONNECT from a server
        (0x82, b"", 0x81),  # SUBSCRIBE from a server
        (0x00, b"", 0x81),  # reserved packet type
        (0x40, b"\x00\x01", 0x82),  # PUBACK: this client publishes nothing
        (0x62, b"\x00\x01", 0x82),  # PUBREL: no QoS 2 here
        (0xF0, b"", 0x82),  # AUTH: no extended authentication asked
        (0xE0, b"\x00\x05\x11", 0x81),  # DISCONNECT properties past the packet
    ],
)
def test_malformed_and_unexpected_packets_carry_their_reason_code(
    first: int, body: bytes, reason: int
) -> None:
    with pytest.raises(Violation) as raised:
        _one(_frame(first, body))
    assert raised.value.reason == reason


def test_a_remaining_length_of_five_bytes_is_malformed() -> None:
    with pytest.raises(Violation) as raised:
        split(b"\x30\xff\xff\xff\xff\x01")
    assert raised.value.reason == 0x81
    assert split(b"\x30\xff\xff") == ([], 0)  # not complete yet: wait for more


def test_connect_fields_and_properties_read_back_with_paho() -> None:
    packet = encode_connect(
        "wsnmom-s-0123",
        clean_start=False,
        keepalive=30,
        session_expiry=0xFFFFFFFF,
        receive_maximum=64,
        username="user",
        password="pw",
    )
    packets, used = split(packet)
    assert used == len(packet) and packets[0][0] == 0x10
    body = packets[0][1]
    assert body[:7] == b"\x00\x04MQTT\x05"
    assert body[7] == 0x80 | 0x40  # user name, password; clean start false, no will
    assert body[8:10] == (30).to_bytes(2, "big")
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    _, length = props.unpack(body[10:])  # type: ignore[no-untyped-call]
    assert props.SessionExpiryInterval == 0xFFFFFFFF and props.ReceiveMaximum == 64
    assert body[10 + length :] == _s("wsnmom-s-0123") + _s("user") + _s("pw")
    clean = split(
        encode_connect("c", clean_start=True, keepalive=5, session_expiry=0, receive_maximum=1)
    )[0][0][1]
    assert clean[7] == 0x02  # clean start, no credentials
    with pytest.raises(ValueError):
        encode_connect("c", clean_start=True, keepalive=5, session_expiry=0, receive_maximum=0)


def test_the_packets_sent_match_the_standard() -> None:
    assert encode_subscribe(10, ["a/+", "$share/g/b"], 0x21) == (
        b"\x82\x16\x00\x0a\x00" + _s("a/+") + b"\x21" + _s("$share/g/b") + b"\x21"
    )
    assert encode_unsubscribe(11, ["a/#"]) == b"\xa2\x08\x00\x0b\x00" + _s("a/#")
    assert encode_puback(0x1234) == b"\x40\x02\x12\x34"
    assert encode_disconnect() == b"\xe0\x00"
    assert encode_disconnect(0x81) == b"\xe0\x02\x81\x00"
    assert encode_disconnect(0, 0) == b"\xe0\x07\x00\x05\x11\x00\x00\x00\x00"
    props = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
    props.unpack(encode_disconnect(0, 0)[3:])  # type: ignore[no-untyped-call]
    assert props.SessionExpiryInterval == 0


@pytest.mark.parametrize("code", [0x00, 0x80, 0x81, 0x82, 0x86, 0x87, 0x8A, 0x8E, 0x94, 0x97])
def test_reason_names_are_the_standards(code: int) -> None:
    packet = (
        PacketTypes.DISCONNECT if code in (0x81, 0x82, 0x8E, 0x94, 0x97) else PacketTypes.CONNACK
    )
    # the standard's names; paho's differ in capitals only ("Topic alias invalid")
    paho = str(ReasonCode(packet, identifier=code))  # type: ignore[no-untyped-call]
    assert reason_name(code).lower() == f"{paho} (0x{code:02X})".lower()


# -- the state machine -----------------------------------------------------------------------


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    return split(data)[0]


def test_the_protocol_wants_the_connack_first_and_once() -> None:
    proto = SessionProtocol(30, 0.0)
    with pytest.raises(Violation) as raised:
        proto.receive(_packets(b"\xd0\x00"))
    assert raised.value.reason == 0x82
    proto = SessionProtocol(30, 0.0)
    proto.receive(_packets(b"\x20\x03\x00\x00\x00"))
    assert proto.state == "open"
    with pytest.raises(Violation):
        proto.receive(_packets(b"\x20\x03\x00\x00\x00"))
    refused = SessionProtocol(30, 0.0)
    refused.receive(_packets(b"\x20\x03\x00\x87\x00"))
    assert refused.state == "closed"


def test_acknowledgements_must_match_what_was_asked() -> None:
    proto = SessionProtocol(30, 0.0)
    proto.receive(_packets(b"\x20\x03\x00\x00\x00"))
    pid = proto.subscribe(["a", "b"], 0x21)
    with pytest.raises(Violation):  # one reason code for two filters
        proto.receive(_packets(_frame(0x90, pid.to_bytes(2, "big") + b"\x00\x01")))
    proto = SessionProtocol(30, 0.0)
    proto.receive(_packets(b"\x20\x03\x00\x00\x00"))
    pid = proto.subscribe(["a", "b"], 0x21)
    got = proto.receive(_packets(_frame(0x90, pid.to_bytes(2, "big") + b"\x00\x01\x87")))
    assert got == [SubAck(pid, (0x01, 0x87), False)]
    with pytest.raises(Violation):  # the same packet identifier again: nothing asked
        proto.receive(_packets(_frame(0x90, pid.to_bytes(2, "big") + b"\x00\x01\x87")))
    proto = SessionProtocol(30, 0.0)
    proto.receive(_packets(b"\x20\x03\x00\x00\x00"))
    pid = proto.unsubscribe(["a"])
    with pytest.raises(Violation):  # a SUBACK for an UNSUBSCRIBE
        proto.receive(_packets(_frame(0x90, pid.to_bytes(2, "big") + b"\x00\x00")))


def test_keep_alive_pings_when_idle_and_gives_up_without_an_answer() -> None:
    proto = SessionProtocol(10, 0.0)
    proto.receive(_packets(b"\x20\x06\x00\x00\x03\x13\x00\x04"))  # Server Keep Alive 4
    proto.out.clear()
    assert proto.due(3.9) is None and not proto.out
    assert proto.due(4.0) is None and bytes(proto.out) == b"\xc0\x00"
    proto.out.clear()
    proto.sent(4.0)
    assert proto.due(7.9) is None and not proto.out  # a PINGREQ is out: no second one
    proto.receive(_packets(b"\xd0\x00"))
    assert proto.due(8.0) is None and bytes(proto.out) == b"\xc0\x00"
    assert proto.due(11.9) is None
    assert proto.due(12.0) is not None  # no PINGRESP within the keep-alive
    with pytest.raises(Violation):  # a PINGRESP nobody asked for
        fresh = SessionProtocol(10, 0.0)
        fresh.receive(_packets(b"\x20\x03\x00\x00\x00"))
        fresh.receive(_packets(b"\xd0\x00"))


def test_packet_identifiers_skip_those_in_use() -> None:
    proto = SessionProtocol(10, 0.0)
    first = proto.subscribe(["a"], 0x21)
    ids = {proto.unsubscribe(["a"]) for _ in range(0xFFFE)}
    assert first not in ids and len(ids) == 0xFFFE
    with pytest.raises(Exception, match="packet identifier"):
        proto.subscribe(["a"], 0x21)
