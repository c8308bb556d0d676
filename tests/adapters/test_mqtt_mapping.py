"""The MQTT adapter's topic mapping, settings and MQTT 5 property encoding: pure, no
broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.config import parse_settings
from wsnmom.adapters.mqtt.mapping import UNMAPPED_NAMESPACE, MqttMapping
from wsnmom.core.adapter import (
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterError,
)
from wsnmom.core.redaction import redact_url
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Topic
from wsnmom.topic_mapping.translate import FALLBACK_NAMESPACE, derived_root

NS = "urn:example:plant"


def test_configured_prefix_and_escaped_levels() -> None:
    m = MqttMapping({NS: "factory/floor1"})
    assert m.name(Topic(NS, ("line_x0020_2", "temp"))) == "factory/floor1/line 2/temp"
    assert m.topic("factory/floor1/line 2/temp") == Topic(NS, ("line_x0020_2", "temp"))
    assert m.topic("factory/floor1/2024") == Topic(NS, ("_x0032_024",))


def test_derived_roots_map_back_once_known_or_named_by_headers() -> None:
    other = "urn:example:other"
    m = MqttMapping({})
    name = f"{derived_root(other)}/a/b"
    # a process that never saw the namespace reads it as a native topic...
    assert m.topic(name).namespace == FALLBACK_NAMESPACE
    # ...unless the message's headers name a topic that maps to exactly this name
    fresh = MqttMapping({})
    headers = {HEADER_TOPIC_NAMESPACE: other, HEADER_TOPIC_PATH: "a/b"}
    assert fresh.topic(name, headers) == Topic(other, ("a", "b"))
    # headers naming another topic of that namespace settle the root, not the path
    other_path = MqttMapping({})
    elsewhere = {HEADER_TOPIC_NAMESPACE: other, HEADER_TOPIC_PATH: "x"}
    assert other_path.topic(name, elsewhere) == Topic(other, ("a", "b"))
    # and headers naming a namespace whose root is not this one change nothing
    unrelated = MqttMapping({})
    wrong = {HEADER_TOPIC_NAMESPACE: "urn:example:third", HEADER_TOPIC_PATH: "a/b"}
    assert unrelated.topic(name, wrong).namespace == FALLBACK_NAMESPACE
    # once the namespace is used, earlier fallback answers are forgotten
    m.register(other)
    assert m.topic(name) == Topic(other, ("a", "b"))


def test_filters_for_patterns() -> None:
    m = MqttMapping({NS: "p"})
    assert m.filters(None) == {"#"}
    assert m.filters([PathPattern(NS, ("a", ANY))]) == {"p/a/+"}
    assert m.filters([PathPattern(NS, ("a", DEEP))]) == {"p/a/#"}
    # mid-path '//' is widened (the queue store applies the exact patterns)
    assert m.filters([PathPattern(NS, ("a", DEEP, "c"))]) == {"p/a/+/#"}
    # a union keeps only what is not covered
    assert m.filters([PathPattern(NS, ("a", "b")), PathPattern(NS, ("a", DEEP))]) == {"p/a/#"}
    # internal namespaces never reach the broker
    assert m.filters([PathPattern("urn:wsnmom:internal:pull-point", ("p1",))]) == frozenset()


def test_topic_prefix_holds_every_topic_of_the_gateway() -> None:
    m = MqttMapping({NS: "p"}, topic_prefix="gw1")
    assert m.name(Topic(NS, ("a",))) == "gw1/p/a"
    assert m.filters(None) == {"gw1/#"}
    assert m.filters([PathPattern(NS, (ANY,))]) == {"gw1/p/+"}
    assert m.topic("gw1/p/a") == Topic(NS, ("a",))
    assert m.topic("gw1/elsewhere/x") == Topic(FALLBACK_NAMESPACE, ("elsewhere", "x"))
    assert m.topic("outside/p/a").namespace == UNMAPPED_NAMESPACE


def test_names_that_cannot_be_written() -> None:
    m = MqttMapping({})
    with pytest.raises(NameNotRepresentable):
        m.name(Topic(NS, ("x" * 70_000,)))
    assert m.topic("").namespace == UNMAPPED_NAMESPACE


def test_settings_from_url_and_options() -> None:
    s = parse_settings(
        "mqtts://user:s%40cret@broker.example?protocol=3.1.1&keepalive=15",
        {"namespaces": {NS: "/plant/"}, "retain": "false", "data_dir": "/tmp/x"},
    )
    assert (s.host, s.port, s.tls, s.username, s.password) == (
        "broker.example",
        8883,
        True,
        "user",
        "s@cret",
    )
    assert s.protocol == "3.1.1" and not s.v5 and s.keepalive == 15 and not s.retain
    assert s.namespaces == {NS: "plant"} and s.queue_dir == "/tmp/x/mqtt"
    # the gateway's one redaction helper hides both places an MQTT URL carries a password
    assert redact_url("mqtt://u:secret@h:1883") == "mqtt://u:***@h:1883"
    assert redact_url("mqtts://h:8883?username=u&password=secret") == (
        "mqtts://h:8883?username=u&password=***"
    )
    assert "secret" not in repr(s)


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("mqtt://h", {"protocol": "4"}, "protocol"),
        ("mqtt://h", {"frobnicate": 1}, "unknown"),
        ("mqtt://h", {"namespaces": {NS: "a/+/b"}}, "not a topic prefix"),
        ("mqtt://h", {"topic_prefix": "$SYS"}, "reserved"),
        ("mqtt://h", {"receive_maximum": 0}, "receive_maximum"),
        ("mqtt://h/path", {}, "no path"),
        ("amqp://h", {}, "not an MQTT URL"),
    ],
)
def test_bad_settings_are_refused(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_settings(url, options)


def test_adapter_needs_a_data_directory_and_says_so() -> None:
    with pytest.raises(AdapterError, match="data_dir"):
        MqttAdapter("mqtt://127.0.0.1:1", {})
    with pytest.raises(AdapterError, match=r"MQTT adapter option adapter_options\.protocol = '9'"):
        MqttAdapter("mqtt://127.0.0.1:1", {"data_dir": "/tmp", "protocol": "9"})


def test_capabilities_follow_the_protocol(tmp_path: object) -> None:
    v5 = MqttAdapter("mqtt://127.0.0.1:1", {"data_dir": str(tmp_path)})
    v3 = MqttAdapter("mqtt://127.0.0.1:1", {"data_dir": str(tmp_path), "protocol": "3.1.1"})
    assert v5.capabilities.native_headers and not v3.capabilities.native_headers
    assert v5.capabilities.shape == "session" and v5.capabilities.native_pull
    assert MqttAdapter.capabilities.native_headers  # the class keeps its own


@given(
    st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=8),
    st.sampled_from(["", "application/xml", "application/json; charset=utf-8", "image/png"]),
    st.booleans(),
)
@settings(max_examples=100, deadline=None)
def test_packed_properties_are_the_bytes_paho_would_send(
    pairs: list[tuple[str, str]], content_type: str, text: bool
) -> None:
    from wsnmom.adapters.mqtt import wire

    assert wire._packed(pairs, content_type, text).pack() == (
        wire._stock(pairs, content_type, text).pack()
    )


def test_dead_letter_destinations_are_broker_topics_on_mqtt5_only() -> None:
    dead = "urn:wsnmom:internal:dead-letters"
    m = MqttMapping({NS: "p"}, topic_prefix="gw1", dead_letters=True)
    assert m.on_broker(dead) and not m.on_broker("urn:wsnmom:internal:pull-point")
    assert m.name(Topic(dead, ("default",))) == "gw1/wsnmom/dead-letters/default"
    assert m.filters([PathPattern(dead, ("d1",))]) == {"gw1/wsnmom/dead-letters/d1"}
    assert m.filters([PathPattern(dead, (ANY,))]) == {"gw1/wsnmom/dead-letters/#"}
    assert m.topic("gw1/wsnmom/dead-letters/d1") == Topic(dead, ("d1",))
    # what cannot name a destination is nobody's
    assert m.topic("gw1/wsnmom/dead-letters/a/b").namespace == UNMAPPED_NAMESPACE
    with pytest.raises(NameNotRepresentable):
        m.name(Topic(dead, ("a", "b")))
    # MQTT 3.1.1 (no user properties for the context): internal, as every internal topic
    m = MqttMapping({NS: "p"}, topic_prefix="gw1")
    assert not m.on_broker(dead) and not m.is_dead_letter(Topic(dead, ("d1",)))
    assert m.filters([PathPattern(dead, ("d1",))]) == frozenset()
    assert m.topic("gw1/wsnmom/dead-letters/d1").namespace != dead
