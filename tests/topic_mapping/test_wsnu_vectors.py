"""WS-Nu topic filter vectors (the WS-Nu project's filter tests), topic rows only.

A Notify with 12 NotificationMessages; #2-#9 carry a topic in the Simple, Concrete, Full or
XPath dialect, the others have none.  Each filter is parsed as a subscription would be and
the messages whose topic it selects are counted.  Message-content rows belong to core.

Note on the unprefixed Full filters (``//*``, ``//ask//.``): our rule resolves unprefixed
roots in the in-scope default namespace and rejects them when none is declared, so the
filters are carried in an element whose default namespace is ``http://test.com``.
"""

from __future__ import annotations

import pytest
from lxml import etree
from wsnmom.topic_mapping import (
    CONCRETE,
    FULL,
    SIMPLE,
    XPATH,
    InvalidTopicExpression,
    Topic,
    TopicExpressionDialectUnknown,
    TopicSet,
    parse_topic_expression,
    parse_topic_expression_element,
    require_concrete_topic,
)

WSNT = "http://docs.oasis-open.org/wsn/b-2"
TEST = "http://test.com"
DECLS = (
    f'xmlns:wsnt="{WSNT}" xmlns:test="{TEST}" xmlns:test2="http://test2.com" '
    'xmlns:test3="http://test3.com" xmlns:wstop="http://docs.oasis-open.org/wsn/t-1"'
)

# (topic dialect, topic text) per message; None = message without a topic.
MESSAGES: list[tuple[str, str] | None] = [
    None,  # 1 <hello>World</hello>
    (SIMPLE, "test:root1"),  # 2
    (SIMPLE, "test:root2"),  # 3
    (CONCRETE, "test:root1/ask"),  # 4
    (CONCRETE, "test:root2/test:reply"),  # 5
    (FULL, "test:root1/ask"),  # 6
    (FULL, "test:root2/test:reply"),  # 7
    (XPATH, "test:root1/ask"),  # 8
    (XPATH, "test:root2/test:reply"),  # 9
    None,  # 10 <test2:hello>World</test2:hello>
    None,  # 11 <hello>World<test3:hello>test:World</test3:hello></hello>
    None,  # 12 <hello final="true">World</hello>
]


def _notify_topics() -> list[Topic | None]:
    """Parse the message topics from wsnt:Topic elements of a Notify, as the frontend does."""
    parts = []
    for item in MESSAGES:
        topic = "" if item is None else f'<wsnt:Topic Dialect="{item[0]}">{item[1]}</wsnt:Topic>'
        parts.append(f"<wsnt:NotificationMessage>{topic}</wsnt:NotificationMessage>")
    notify = etree.fromstring(f"<wsnt:Notify {DECLS}>{''.join(parts)}</wsnt:Notify>")
    out: list[Topic | None] = []
    for msg in notify:
        el = msg.find(f"{{{WSNT}}}Topic")
        if el is None:
            out.append(None)
        else:
            out.append(require_concrete_topic(parse_topic_expression_element(el)))
    return out


@pytest.fixture
def topics() -> list[Topic | None]:
    return _notify_topics()


@pytest.fixture
def topic_set(topics: list[Topic | None]) -> TopicSet:
    ts = TopicSet()  # no declared namespaces: every topic is ad hoc
    for t in topics:
        if t is not None:
            ts.admit(t)
    return ts


def test_message_topics(topics: list[Topic | None]) -> None:
    ask = Topic(TEST, ("root1", "ask"))
    reply = Topic(TEST, ("root2", "reply"))
    assert topics == [
        None,
        Topic(TEST, ("root1",)),
        Topic(TEST, ("root2",)),
        ask,
        reply,
        ask,
        reply,
        ask,
        reply,
        None,
        None,
        None,
    ]


def _filter(dialect: str, text: str) -> etree._Element:
    return etree.fromstring(
        f'<wsnt:TopicExpression {DECLS} xmlns="{TEST}" Dialect="{dialect}">{text}'
        "</wsnt:TopicExpression>"
    )


@pytest.mark.parametrize(
    ("dialect", "text", "expected"),
    [
        (SIMPLE, "test:root1", 1),
        (SIMPLE, "test:root2", 1),
        (SIMPLE, "test:root3", 0),
        (CONCRETE, "test:root1/ask", 3),
        (CONCRETE, "test:root2/test:reply", 3),
        (CONCRETE, "test:root3", 0),
        (FULL, "//*", 8),
        (FULL, "//ask//.", 3),
        (FULL, "//non-existent//*", 0),
        (XPATH, '//*[@wstop:topic="true"]', 8),
        (XPATH, '//test:root2//*[@wstop:topic="true"]', 3),
        (XPATH, '//*[@wstop:topic="false"]', 0),
    ],
)
def test_filter_counts(
    topics: list[Topic | None], topic_set: TopicSet, dialect: str, text: str, expected: int
) -> None:
    expr = parse_topic_expression_element(_filter(dialect, text), topic_set=topic_set)
    expr = topic_set.validate(expr)
    delivered = [i + 1 for i, t in enumerate(topics) if t is not None and expr.matches(t)]
    assert len(delivered) == expected, delivered


def test_xpath_descendants_of_root2(topic_set: TopicSet) -> None:
    expr = parse_topic_expression(
        '//test:root2//*[@wstop:topic="true"]',
        XPATH,
        {"test": TEST, "wstop": "http://docs.oasis-open.org/wsn/t-1"},
        topic_set=topic_set,
    )
    assert expr.static
    assert [p.as_topic() for p in expr.patterns] == [Topic(TEST, ("root2", "reply"))]


def test_unknown_dialect(topic_set: TopicSet) -> None:
    el = _filter("http://not.accepted/dialect.html", "test:root1")
    with pytest.raises(TopicExpressionDialectUnknown):
        parse_topic_expression_element(el, topic_set=topic_set)


def test_simple_with_a_path(topic_set: TopicSet) -> None:
    el = _filter(SIMPLE, "test:root1/ask")
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression_element(el, topic_set=topic_set)


def test_unprefixed_full_filter_needs_a_default_namespace() -> None:
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression("//*", FULL, {"test": TEST})
