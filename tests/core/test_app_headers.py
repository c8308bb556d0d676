"""Application headers (``core.app_headers``): the rules for what a client may attach,
what is taken from the middleware, and the codec carrying them both ways."""

from __future__ import annotations

import pytest
from wsnmom.core.adapter import StoredMessage
from wsnmom.core.app_headers import (
    MAX_HEADERS,
    MAX_TOTAL,
    MAX_VALUE,
    HeaderRefused,
    from_middleware,
    validated,
    with_trace,
)
from wsnmom.core.codec import decode, encode
from wsnmom.core.model import NotificationMessage
from wsnmom.topic_mapping.model import Topic

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_valid_headers_keep_their_order_and_case() -> None:
    pairs = [("traceparent", TRACEPARENT), ("Tenant.Id", "a-1"), ("k_2", "")]
    assert validated(pairs) == tuple(pairs)


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("", "v", "is not"),
        ("bad name", "v", "is not"),
        ("-lead", "v", "is not"),
        ("n" * 65, "v", "is not"),
        ("wsnmom-message-id", "v", "reserved"),
        ("WSNMOM-Via", "v", "reserved"),
        ("x-death", "v", "reserved"),
        ("Content-Type", "text/plain", "reserved"),
        ("k", "v" * (MAX_VALUE + 1), "longer"),
        ("k", "line\nbreak", "printable"),
        ("k", "caf\u00e9", "printable"),
    ],
)
def test_a_broken_rule_is_refused_with_its_reason(name: str, value: str, words: str) -> None:
    with pytest.raises(HeaderRefused, match=words):
        validated([(name, value)])


def test_duplicates_count_and_size_are_bounded() -> None:
    with pytest.raises(HeaderRefused, match="more than once"):
        validated([("k", "1"), ("K", "2")])
    with pytest.raises(HeaderRefused, match=f"at most {MAX_HEADERS}"):
        validated([(f"k{i}", "v") for i in range(MAX_HEADERS + 1)])
    with pytest.raises(HeaderRefused, match=f"at most {MAX_TOTAL}"):
        validated([(f"k{i}", "v" * 1000) for i in range(9)])


def test_from_the_middleware_only_application_headers_are_taken_and_nothing_raises() -> None:
    headers: dict[str, object] = {
        "wsnmom-message-id": "m1",
        "x-delivery-count": 2,
        "x-death": "[...]",
        "content-type": "application/json",
        "traceparent": TRACEPARENT,
        "bad name": "v",
        "count": 7,  # not a string: a native producer's typed AMQP header
        "tenant": "t1",
    }
    assert from_middleware(headers) == (("traceparent", TRACEPARENT), ("tenant", "t1"))
    many = {f"k{i}": "v" for i in range(MAX_HEADERS + 5)}
    assert len(from_middleware(many)) == MAX_HEADERS


def test_a_messages_own_trace_context_wins_over_the_requests() -> None:
    own = (("traceparent", "own"),)
    trace = (("traceparent", TRACEPARENT), ("tracestate", "v=1"))
    assert with_trace(own, trace) == (("traceparent", "own"), ("tracestate", "v=1"))
    assert with_trace((), trace) == trace
    assert with_trace(own, ()) is own


def test_the_codec_carries_them_through_the_middleware_under_their_own_names() -> None:
    topic = Topic("urn:t", ("a",))
    headers = (("traceparent", TRACEPARENT), ("tenant", "t1"))
    message = NotificationMessage(message_id="m1", payload=b"<a/>", topic=topic, headers=headers)
    out = encode(message)
    assert out.headers["traceparent"] == TRACEPARENT and out.headers["tenant"] == "t1"
    assert out.headers["wsnmom-message-id"] == "m1"
    back = decode(StoredMessage(topic=topic, body=out.body, headers=dict(out.headers)))
    assert back.headers == headers
    # a message without headers encodes as before
    plain = encode(NotificationMessage(message_id="m2", payload=b"<a/>", topic=topic))
    assert not {"traceparent", "tenant"} & set(plain.headers)
