"""Filter semantics: WS-Nu topic/filter vectors (peer-implementations §4.4), AND
combination, filter faults (docs/conformance.md), ServiceMix MessageContent attribute filters."""

from __future__ import annotations

import pytest
from wsnmom.core import errors
from wsnmom.core.filters import XPATH10, MessageContentFilter, patterns_overlap
from wsnmom.core.model import ExpressionSource, InboundNotification
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, SIMPLE, XPATH
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern

from tests.support.waiting import wait_until

from .conftest import RecordingOutbound, note, sub_req, wait_idle

TEST = "http://test.com"
TEST2 = "http://test2.com"
TEST3 = "http://test3.com"
WSTOP = "http://docs.oasis-open.org/wsn/t-1"
NS: dict[str | None, str] = {
    None: TEST,
    "test": TEST,
    "test2": TEST2,
    "test3": TEST3,
    "wstop": WSTOP,
}


def te(dialect: str, text: str) -> ExpressionSource:
    return ExpressionSource(dialect, text, NS)


def mc(text: str, dialect: str = XPATH10) -> ExpressionSource:
    return ExpressionSource(dialect, text, NS)


def twelve() -> list[InboundNotification]:
    """The 12-message Notify of WS-Nu's filter_test_large_notify.xml."""
    hello = "<hello>World</hello>"
    return [
        note(hello),
        note(hello, te(SIMPLE, "test:root1")),
        note(hello, te(SIMPLE, "test:root2")),
        note(hello, te(CONCRETE, "test:root1/ask")),
        note(hello, te(CONCRETE, "test:root2/test:reply")),
        note(hello, te(FULL, "test:root1/ask")),
        note(hello, te(FULL, "test:root2/test:reply")),
        note(hello, te(XPATH, "test:root1/ask")),
        note(hello, te(XPATH, "test:root2/test:reply")),
        note(f'<test2:hello xmlns:test2="{TEST2}">World</test2:hello>'),
        note(f'<hello>World<test3:hello xmlns:test3="{TEST3}">test:World</test3:hello></hello>'),
        note('<hello final="true">World</hello>'),
    ]


VECTORS: list[tuple[str, dict[str, ExpressionSource], int]] = [
    ("simple root1", {"topic": te(SIMPLE, "test:root1")}, 1),
    ("simple root2", {"topic": te(SIMPLE, "test:root2")}, 1),
    ("simple root3", {"topic": te(SIMPLE, "test:root3")}, 0),
    ("concrete root1/ask", {"topic": te(CONCRETE, "test:root1/ask")}, 3),
    ("concrete root2/reply", {"topic": te(CONCRETE, "test:root2/test:reply")}, 3),
    ("concrete root3", {"topic": te(CONCRETE, "test:root3")}, 0),
    ("full //*", {"topic": te(FULL, "//*")}, 8),
    ("full //ask//.", {"topic": te(FULL, "//ask//.")}, 3),
    ("full //non-existent//*", {"topic": te(FULL, "//non-existent//*")}, 0),
    ("xpath all topics", {"topic": te(XPATH, '//*[@wstop:topic="true"]')}, 8),
    ("xpath under root2", {"topic": te(XPATH, '//test:root2//*[@wstop:topic="true"]')}, 3),
    ("xpath none", {"topic": te(XPATH, '//*[@wstop:topic="false"]')}, 0),
    ("mc a=a", {"message_content": mc('"a"="a"')}, 12),
    ("mc b=a", {"message_content": mc('"b"="a"')}, 0),
    ("mc test3", {"message_content": mc("(count(//test3:*)>0)")}, 1),
    ("mc test2", {"message_content": mc("(count(//test2:hello)!=0)")}, 1),
    ("mc gibberish", {"message_content": mc("gibberish")}, 0),
    # AND of a topic and a content filter
    ("and", {"topic": te(FULL, "//*"), "message_content": mc("@final='true'")}, 0),
    ("and2", {"topic": te(SIMPLE, "test:root1"), "message_content": mc('"a"="a"')}, 1),
    ("no filter", {}, 12),
]


def test_wsnu_vectors(service: BrokerService, outbound: RecordingOutbound) -> None:
    service.notify(twelve())  # topics become members of the (ad hoc) topic set first
    addresses = {}
    for i, (name, kw, _) in enumerate(VECTORS):
        address = f"http://127.0.0.1:9/c{i}"
        addresses[name] = address
        service.subscribe(sub_req(address, **kw))
    service.notify(twelve())
    expected = {name: n for name, _, n in VECTORS}

    def got() -> dict[str, int]:
        return {name: len(outbound.messages_to(addresses[name])) for name, _, _ in VECTORS}

    # the filter processes are shared by the whole test process: a first evaluation may
    # wait for a process that an earlier test's costly filter still holds
    wait_until(lambda: got() == expected, 30, what=f"the vectors' deliveries (now {got()})")
    wait_idle(service)
    assert got() == expected


def test_and_of_topic_and_content(service: BrokerService, outbound: RecordingOutbound) -> None:
    c = "http://127.0.0.1:9/and"
    service.subscribe(
        sub_req(c, topic=te(SIMPLE, "test:root1"), message_content=mc("@final='true'"))
    )
    service.notify(
        [
            note('<hello final="true">1</hello>', te(SIMPLE, "test:root1")),
            note('<hello final="false">2</hello>', te(SIMPLE, "test:root1")),
            note('<hello final="true">3</hello>', te(SIMPLE, "test:root2")),
            note('<hello final="true">4</hello>'),
        ]
    )
    wanted = [b'<hello final="true">1</hello>']
    wait_until(lambda: outbound.payloads_to(c) == wanted, 30, what="the one matching message")
    wait_idle(service)
    assert outbound.payloads_to(c) == wanted


@pytest.mark.parametrize(
    ("kw", "fault"),
    [
        ({"producer_properties": mc("fn:true()")}, errors.InvalidProducerPropertiesExpression),
        (
            {"topic": ExpressionSource("http://not.accepted/dialect.html", "test:root1", NS)},
            errors.TopicExpressionDialectUnknown,
        ),
        ({"topic": te(SIMPLE, "test:root1/ask")}, errors.InvalidTopicExpression),
        (
            {"message_content": mc("true()", "http://not.accepted/dialect.html")},
            errors.InvalidMessageContentExpression,
        ),
        ({"message_content": mc("/a[")}, errors.InvalidMessageContentExpression),
        ({"message_content": mc("undeclared:x")}, errors.InvalidMessageContentExpression),
        (
            {"topic": ExpressionSource(SIMPLE, "r:x", {"r": "urn:wsnmom:no-topic"})},
            errors.TopicNotSupported,
        ),
    ],
)
def test_filter_faults(
    service: BrokerService, kw: dict[str, ExpressionSource], fault: type
) -> None:
    with pytest.raises(fault):
        service.subscribe(sub_req(**kw))
    assert service.registry.subscriptions == {}


def test_message_content_context_is_payload_document() -> None:
    f = MessageContentFilter(mc('boolean(test:Producer="15")'))
    assert f.matches(
        f'<test:N xmlns:test="{TEST}"><test:Producer>15</test:Producer></test:N>'.encode()
    )
    absolute = MessageContentFilter(mc("/test:N/test:Producer = 15"))
    assert absolute.matches(
        f'<test:N xmlns:test="{TEST}"><test:Producer>15</test:Producer></test:N>'.encode()
    )
    assert not absolute.matches(b"<other/>")
    # an OKSE-style node-set expression converts with boolean()
    nodes = MessageContentFilter(mc('/message[text()="derp"]'))
    assert nodes.matches(b"<message>derp</message>")
    assert not nodes.matches(b"<message>nope</message>")


def test_patterns_overlap() -> None:
    ns = TEST
    assert patterns_overlap(PathPattern(ns, ("a", "b")), PathPattern(ns, (DEEP, "b")))
    assert patterns_overlap(PathPattern(ns, ("a", ANY)), PathPattern(ns, ("a", "c")))
    assert not patterns_overlap(PathPattern(ns, ("a", ANY)), PathPattern(ns, ("a",)))
    assert patterns_overlap(PathPattern(ns, ("a", DEEP)), PathPattern(ns, ("a",)))
    assert not patterns_overlap(PathPattern(ns, ("a",)), PathPattern("urn:x", ("a",)))
    assert not patterns_overlap(PathPattern(ns, ("a", "b")), PathPattern(ns, ("a", "c")))
    assert patterns_overlap(PathPattern(ns, (DEEP, "x", DEEP)), PathPattern(ns, ("q", ANY, "r")))
