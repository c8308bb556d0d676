"""Per-Notify work in core (docs/performance.md, the 100-message ingress): one timestamp and
one draw of message ids per Notify (``new_message_ids``), each topic expression resolved
once while consecutive messages repeat it, each producer/topic pair checked against the
registrations once, and ``encode`` building the shared headers once per Notify.  The
results must be what per-message work gave."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import pickle
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from wsnmom.core import codec, errors
from wsnmom.core import inbound as inbound_module
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    HEADER_PRODUCER_REFERENCE,
    HEADER_PUBLISHED_AT,
    HEADER_TOPIC_DIALECT,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
)
from wsnmom.core.codec import HEADER_SUBSCRIPTION_REFERENCE, NO_TOPIC, decode, encode
from wsnmom.core.model import (
    EndpointReference,
    InboundNotification,
    NotificationMessage,
    RegisterPublisherRequest,
    new_message_ids,
)
from wsnmom.core.service import BrokerService
from wsnmom.core.store_documents import epr_to_json
from wsnmom.topic_mapping.model import Topic

from .conftest import NS, RecordingOutbound, note, simple, sub_req, wait_idle

C = "http://127.0.0.1:9/consumer"
P = "http://127.0.0.1:9/publisher"
T1 = Topic(NS, ("a",))
T2 = Topic(NS, ("b", "c"))
AT = datetime(2030, 1, 1, tzinfo=UTC)


# --- message ids ----------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 100, 1024, 1025, 3000])
def test_message_ids_are_distinct_32_hex_digits(count: int) -> None:
    ids = new_message_ids(count)
    assert len(ids) == count == len(set(ids))
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)


def test_message_ids_of_two_batches_differ_in_their_random_part() -> None:
    a, b = new_message_ids(3), new_message_ids(3)
    assert {i[:24] for i in a} != {i[:24] for i in b}
    assert not set(a) & set(b)


# --- encode -----------------------------------------------------------------------------------
def _reference_headers(m: NotificationMessage) -> dict[str, str]:
    """What ``encode`` put into the headers before it shared their common part."""
    topic = m.topic or NO_TOPIC
    headers = {
        HEADER_MESSAGE_ID: m.message_id,
        HEADER_TOPIC_NAMESPACE: topic.namespace,
        HEADER_TOPIC_PATH: "/".join(topic.path),
    }
    if m.topic_dialect:
        headers[HEADER_TOPIC_DIALECT] = m.topic_dialect
    for name, epr in (
        (HEADER_PRODUCER_REFERENCE, m.producer_reference),
        (HEADER_SUBSCRIPTION_REFERENCE, m.subscription_reference),
    ):
        if epr is not None:
            headers[name] = json.dumps(epr_to_json(epr), separators=(",", ":"))
    if m.published_at is not None:
        headers[HEADER_PUBLISHED_AT] = m.published_at.isoformat()
    return headers


PRODUCER = EndpointReference(P, (b"<r:k xmlns:r='urn:r'>1</r:k>",), b"<m/>")
MESSAGES = [
    NotificationMessage("m1", b"<a/>", T1, "urn:dialect", PRODUCER, published_at=AT),
    NotificationMessage("m2", b"<b/>", T1, "urn:dialect", PRODUCER, published_at=AT),
    NotificationMessage("m3", b"<c/>", T1, "urn:dialect", None, published_at=AT),
    NotificationMessage("m4", b"<d/>", T2, None, PRODUCER, published_at=AT),
    NotificationMessage("m5", b"<e/>", None, None, None),
    NotificationMessage(
        "m6",
        b"<f/>",
        Topic(NS, ("a",)),  # equal to T1, another object
        "urn:dialect",
        EndpointReference(P, (b"<r:k xmlns:r='urn:r'>1</r:k>",), b"<m/>"),
        published_at=datetime(2030, 1, 1, tzinfo=UTC),
        subscription_reference=EndpointReference("http://x/s"),
    ),
    NotificationMessage("m7", b"<g/>", T1, "urn:dialect", PRODUCER, published_at=AT),
]


def test_encode_headers_equal_per_message_headers_in_any_sequence() -> None:
    for sequence in (MESSAGES, MESSAGES[::-1], MESSAGES * 2):
        for m in sequence:
            out = encode(m)
            assert out.headers == _reference_headers(m)
            assert list(out.headers) == list(_reference_headers(m))  # same order too
            assert out.message_id == m.message_id
            assert out.body == m.payload
            assert out.topic == (m.topic or NO_TOPIC)


def test_encoded_headers_are_not_shared_between_messages() -> None:
    first, second = encode(MESSAGES[0]), encode(MESSAGES[1])
    assert first.headers is not second.headers
    first.headers[HEADER_TOPIC_PATH] = "changed"  # type: ignore[index]
    assert encode(MESSAGES[1]).headers[HEADER_TOPIC_PATH] == "a"


def test_encode_route_and_decode_round_trip() -> None:
    inbox = codec.pull_point_inbox("abc")
    for m in MESSAGES:
        out = encode(m, route=inbox)
        assert out.topic == inbox
        assert out.headers == _reference_headers(m)


def test_decode_of_encode_gives_the_message() -> None:
    class _Stored:
        def __init__(self, m: NotificationMessage) -> None:
            out = encode(m)
            self.topic, self.body, self.headers = out.topic, out.body, dict(out.headers)
            self.content_type = out.content_type

    for m in MESSAGES:
        assert decode(_Stored(m)) == m  # type: ignore[arg-type]


# --- Inbound.prepare ---------------------------------------------------------------------
@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = inbound_module.concrete_topic

    def counting(source: Any, *args: Any, **kw: Any) -> Any:
        calls.append(source.text)
        return real(source, *args, **kw)

    monkeypatch.setattr(inbound_module, "concrete_topic", counting)
    return calls


def test_one_notify_one_timestamp_distinct_ids_topics_resolved_once(
    service: BrokerService, resolutions: list[str]
) -> None:
    shared = simple("t:a")
    items = [note(f"<x>{i}</x>", shared) for i in range(5)]
    items += [note("<y/>", simple("t:b")), note("<z/>", simple("t:a")), note("<n/>")]
    out = service.inbound.prepare(items, registration_check=True)
    assert resolutions == ["t:a", "t:b", "t:a"]  # one per run of equal expressions
    assert [m.payload for m in out] == [i.payload for i in items]
    assert [m.topic for m in out] == [T1] * 5 + [Topic(NS, ("b",)), T1, None]
    assert len({m.message_id for m in out}) == len(items)
    assert len({m.published_at for m in out}) == 1
    assert out[0].published_at == service.now()
    assert all(m.topic_dialect == shared.dialect for m in out[:7])
    assert out[7].topic_dialect is None


def test_invalid_topic_after_valid_ones_refuses_the_whole_notify(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    service.subscribe(sub_req(C))
    items = [note("<ok/>", simple("t:a"))] * 3 + [note("<bad/>", simple("t:a/*"))]
    with pytest.raises(errors.WsnError):
        service.notify(items)
    service.notify([note("<after/>", simple("t:a"))])
    wait_idle(service)
    assert outbound.payloads_to(C) == [b"<after/>"]


def test_registration_checked_once_per_producer_and_topic(
    make_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    service: BrokerService = make_broker(requires_registration=True).service
    service.register_publisher(
        RegisterPublisherRequest(EndpointReference(P), topics=(simple("t:a"),))
    )
    checks: list[tuple[str | None, Topic | None]] = []
    real = service.inbound.check_registered

    def counting(producer: EndpointReference | None, topic: Topic | None) -> None:
        checks.append((producer.address if producer else None, topic))
        real(producer, topic)

    monkeypatch.setattr(service.inbound, "check_registered", counting)
    service.notify([note(f"<x>{i}</x>", simple("t:a"), producer=P) for i in range(10)])
    assert checks == [(P, T1)]
    checks.clear()
    items = [note("<x/>", simple("t:a"), producer=P)] * 3 + [
        note("<y/>", simple("t:b"), producer=P)
    ]
    with pytest.raises(errors.PublisherRegistrationRejected):
        service.notify(items)
    assert checks == [(P, T1), (P, Topic(NS, ("b",)))]


def test_published_messages_carry_the_batch_fields(
    service: BrokerService, outbound: RecordingOutbound
) -> None:
    service.subscribe(sub_req(C))
    producer = EndpointReference(P)
    items = [InboundNotification(f"<x>{i}</x>".encode(), simple("t:a"), producer) for i in range(3)]
    service.notify(items)
    got = outbound.wait_messages(C, 3)
    assert [d.message.payload for d in got] == [i.payload for i in items]
    assert len({d.message.message_id for d in got}) == 3
    assert {d.message.published_at for d in got} == {service.now()}
    assert {d.message.producer_reference for d in got} == {producer}
    assert all(d.message.topic == T1 for d in got)


# --- the records' direct __init__ ----------------------------------------------------------
@pytest.mark.parametrize("cls", [NotificationMessage, InboundNotification])
def test_direct_init_has_the_dataclass_parameters(cls: type) -> None:
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]


def test_direct_init_records_behave_as_dataclasses() -> None:
    m = NotificationMessage("id", b"<x/>", T1, "urn:d", PRODUCER, published_at=AT)
    assert m == NotificationMessage(
        message_id="id",
        payload=b"<x/>",
        topic=T1,
        topic_dialect="urn:d",
        producer_reference=PRODUCER,
        content_type="application/xml",
        published_at=AT,
        subscription_reference=None,
    )
    assert hash(m) == hash(dataclasses.replace(m))
    assert dataclasses.replace(m, payload=b"<y/>").payload == b"<y/>"
    assert pickle.loads(pickle.dumps(m)) == m
    assert copy.copy(m) == m
    assert "message_id='id'" in repr(m)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.payload = b"other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        NotificationMessage("id")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        NotificationMessage("id", b"", unknown=1)  # type: ignore[call-arg]
    n = InboundNotification(b"<x/>")
    assert (n.topic, n.producer_reference, n.subscription_reference) == (None, None, None)
    assert NotificationMessage.__init__.__qualname__ == "NotificationMessage.__init__"
