"""Configuration precedence, the SQLite store, the middleware codec, the policy document."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lxml import etree
from wsnmom.core.adapter import HEADER_TOPIC_NAMESPACE, HEADER_TOPIC_PATH, StoredMessage
from wsnmom.core.codec import NO_TOPIC, WSNMOM_NS, decode, encode, pull_point_inbox
from wsnmom.core.config import ConfigError, load_settings, parse_duration
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
    SubscriptionState,
)
from wsnmom.core.policy import build_policy
from wsnmom.core.store import StoreError
from wsnmom.core.store_sqlite import SCHEMA_VERSION, SqliteStore
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.model import Topic


def test_config_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "wsnmom.toml"
    cfg.write_text(
        'port = 7000\nhost = "0.0.0.0"\n[retry]\nmax_attempts = 4\ninitial_delay = "PT2S"\n'
        '[outbound]\ndeny = ["10.0.0.0/8"]\n[limits]\nmax_messages = "none"\n'
    )
    env = {"WSNMOM_PORT": "7100", "WSNMOM_RETRY__GIVE_UP": "keep", "WSNMOM_OTHER": "x"}
    warnings: list[str] = []
    s = load_settings(
        cfg, environ=env, overrides={"port": 7200, "store_url": None}, warn=warnings.append
    )
    assert warnings == ["WSNMOM_OTHER: not a wsnmom setting, ignored"]
    assert s.port == 7200  # CLI > env > file
    assert s.host == "0.0.0.0"
    assert s.retry.max_attempts == 4
    assert s.retry.initial_delay == timedelta(seconds=2)
    assert s.retry.give_up == "keep"
    assert s.outbound.deny == ["10.0.0.0/8"]
    assert s.limits.max_messages is None
    assert s.base_url == "http://0.0.0.0:7200"
    s = load_settings(
        None, environ={"WSNMOM_CONFIG": str(cfg), "WSNMOM_TERMINATION__DEFAULT": "90"}
    )
    assert s.port == 7000
    assert s.termination.default == timedelta(seconds=90)
    assert load_settings(None, environ={"HOME": "/h"}).adapter_url == (
        "embedded:///h/.local/share/wsnmom"
    )
    with pytest.raises(ConfigError):
        load_settings(None, environ={"WSNMOM_RETRY__GIVE_UP": "maybe"})
    with pytest.raises(ConfigError):
        load_settings(None, environ={"WSNMOM_PORT": "eighty"})
    assert parse_duration("P1DT1S") == timedelta(days=1, seconds=1)


def test_store_round_trip(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/s/store.db")
    assert isinstance(store, SqliteStore) and store.schema_version == SCHEMA_VERSION
    now = datetime(2030, 1, 1, tzinfo=UTC)
    sub = Subscription(
        id="s1",
        consumer=EndpointReference("http://c", (b"<p xmlns='urn:x'>1</p>",), b"<m/>"),
        creation_time=now,
        termination_time=None,
        topic=ExpressionSource("d", "t:a", {None: "urn:default", "t": "urn:t"}),
        filter_xml=b"<f/>",
        use_raw=True,
        state=SubscriptionState.PAUSED,
        pull_point_id="pp",
    )
    store.put_subscription(sub)
    assert store.get_subscription("s1") == sub
    store.put_pull_point(PullPoint("pp", now, now + timedelta(1), "q"))
    assert store.find_pull_point("q") == PullPoint("pp", now, now + timedelta(1), "q")
    reg = PublisherRegistration("r", now, None, None, (sub.topic,), demand=False)  # type: ignore[arg-type]
    store.put_registration(reg)
    assert store.list_registrations() == [reg]
    msg = NotificationMessage("m", b"<x/>", Topic("urn:t", ("a", "b")), published_at=now)
    store.put_current_message(msg)
    assert store.get_current_message(Topic("urn:t", ("a", "b"))) == msg
    assert store.get_current_message(Topic("urn:t", ("a",))) is None
    assert store.delete_subscription("s1") and not store.delete_subscription("s1")
    store.close()
    reopened = open_store(f"sqlite:///{tmp_path}/s/store.db")
    assert reopened.get_pull_point("pp") is not None
    assert reopened.ping()
    reopened.close()
    with pytest.raises(StoreError, match="supported: sqlite, postgresql"):
        open_store("mysql://127.0.0.1/y")


def test_codec_round_trip_and_native_wrapping() -> None:
    msg = NotificationMessage(
        "id1",
        b'<a xmlns="urn:x">1</a>',
        Topic("urn:t", ("a", "b")),
        topic_dialect="urn:dialect",
        producer_reference=EndpointReference("http://p", (b"<r/>",)),
        published_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    out = encode(msg)
    assert out.topic == Topic("urn:t", ("a", "b"))
    stored = StoredMessage(out.topic, out.body, out.headers, out.content_type)
    assert decode(stored) == msg
    # topicless: reserved topic on the wire, no topic after decoding
    bare = encode(NotificationMessage("id2", b"<b/>"))
    assert bare.topic == NO_TOPIC
    assert decode(StoredMessage(bare.topic, bare.body, bare.headers)).topic is None
    # a pull point inbox keeps the original topic in the headers
    routed = encode(msg, route=pull_point_inbox("abc"))
    assert routed.topic == pull_point_inbox("abc")
    assert routed.headers[HEADER_TOPIC_NAMESPACE] == "urn:t"
    assert routed.headers[HEADER_TOPIC_PATH] == "a/b"
    assert decode(StoredMessage(routed.topic, routed.body, routed.headers)).topic == msg.topic
    # native messages: JSON text and binary are wrapped
    native = decode(StoredMessage(Topic("urn:t", ("n",)), b'{"a": 1}', {}, "application/json"))
    el = etree.fromstring(native.payload)
    assert el.tag == f"{{{WSNMOM_NS}}}NativeMessage"
    assert el.get("contentType") == "application/json" and el.get("encoding") == "text"
    assert el.text == '{"a": 1}'
    assert native.topic == Topic("urn:t", ("n",))
    binary = decode(
        StoredMessage(Topic("urn:t", ("n",)), b"\x00\xff", {}, "application/octet-stream")
    )
    el = etree.fromstring(binary.payload)
    assert el.get("encoding") == "base64" and base64.b64decode(el.text or "") == b"\x00\xff"
    # "XML" that does not parse is wrapped as text
    broken = decode(StoredMessage(Topic("urn:t", ("n",)), b"<oops", {}, "application/xml"))
    assert etree.fromstring(broken.payload).text == "<oops"


def test_policy_document() -> None:
    from wsnmom.core.config import Settings

    p = build_policy(Settings(), message_content_dialects=("x",))
    d = p.as_dict()
    assert d["filter_combination"] == "AND"
    assert d["get_messages_order"].startswith("FIFO")
    assert d["default_termination_time"] == "PT3600S"
    assert d["retry"]["give_up"] in ("keep", "end")
    assert d["accumulation"]["overflow"] == "drop_oldest"
    assert d["requires_registration"] is False
