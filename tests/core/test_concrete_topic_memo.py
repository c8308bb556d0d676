"""F3 (docs/performance.md): ``concrete_topic`` memoises parsed Simple/Concrete/Full
expressions (keyed by dialect, text and the bindings the text can use); results that depend
on the topic set (aliases, the XPath dialect) are never taken from the memo."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from wsnmom.core import errors, filters
from wsnmom.core.filters import concrete_topic
from wsnmom.core.model import ExpressionSource
from wsnmom.topic_mapping.dialects import CONCRETE, SIMPLE, XPATH
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.namespaces import load_topic_namespace
from wsnmom.topic_mapping.topic_set import TopicSet

NS1 = "urn:test:one"
NS2 = "urn:test:two"


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    filters._CONCRETE_CACHE.clear()
    yield
    filters._CONCRETE_CACHE.clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = filters.parse_topic_expression

    def counting(*args: object, **kw: object) -> object:
        calls.append(str(args[0]))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(filters, "parse_topic_expression", counting)
    return calls


def src(text: str, ns: dict[str | None, str], dialect: str | None = SIMPLE) -> ExpressionSource:
    return ExpressionSource(dialect, text, ns)


def test_repeated_expression_parsed_once(parses: list[str]) -> None:
    ts = TopicSet(fixed=False)
    for _ in range(100):
        topic, dialect = concrete_topic(src("t:a", {"t": NS1, "soap": "urn:x"}), ts)
        assert topic == Topic(NS1, ("a",))
        assert dialect == SIMPLE
    # unrelated bindings of the envelope do not split the memo
    concrete_topic(src("t:a", {"t": NS1, "other": "urn:y"}), ts)
    assert parses == ["t:a"]


def test_binding_is_part_of_the_key() -> None:
    ts = TopicSet(fixed=False)
    assert concrete_topic(src("t:a", {"t": NS1}), ts)[0] == Topic(NS1, ("a",))
    assert concrete_topic(src("t:a", {"t": NS2}), ts)[0] == Topic(NS2, ("a",))
    with pytest.raises(errors.InvalidTopicExpression):  # no longer declared
        concrete_topic(src("t:a", {"u": NS1}), ts)
    # the default namespace counts too (Concrete dialect, unprefixed root)
    d1 = concrete_topic(src("a/b", {None: NS1}, CONCRETE), ts)[0]
    d2 = concrete_topic(src("a/b", {None: NS2}, CONCRETE), ts)[0]
    assert (d1.namespace, d2.namespace) == (NS1, NS2)


def test_dialect_is_part_of_the_key() -> None:
    ts = TopicSet(fixed=False)
    assert concrete_topic(src("t:a", {"t": NS1}, None), ts)[1] == SIMPLE
    assert concrete_topic(src("t:a", {"t": NS1}, CONCRETE), ts)[1] == CONCRETE
    with pytest.raises(errors.TopicExpressionDialectUnknown):
        concrete_topic(src("t:a", {"t": NS1}, "urn:unknown"), ts)


def test_faults_are_not_memoised(parses: list[str]) -> None:
    ts = TopicSet(fixed=False)
    for _ in range(2):
        with pytest.raises(errors.MultipleTopicsSpecified):
            concrete_topic(
                src("t:a/*", {"t": NS1}, "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"),
                ts,
            )
    assert len(parses) == 2
    assert len(filters._CONCRETE_CACHE) == 0


def test_xpath_dialect_not_memoised(parses: list[str]) -> None:
    """XPath expressions are evaluated over the topic set: parsed every time."""
    ts = TopicSet(fixed=False)
    ts.admit(Topic(NS1, ("a",)))
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(concrete_topic(src("/t:a", {"t": NS1}, XPATH), ts))
        except errors.WsnError as exc:
            outcomes.append(type(exc))
    assert outcomes[0] == outcomes[1]
    assert len(parses) == 2
    assert len(filters._CONCRETE_CACHE) == 0


def test_alias_declared_after_memoising_is_resolved() -> None:
    """The memo holds the parse only; alias resolution asks the topic set every time."""
    ts = TopicSet(fixed=False)
    assert concrete_topic(src("a:one", {"a": NS1}), ts)[0] == Topic(NS1, ("one",))
    ts.add_namespace(
        load_topic_namespace(
            f"""<wstop:TopicNamespace xmlns:wstop="http://docs.oasis-open.org/wsn/t-1"
                xmlns:a="{NS1}" targetNamespace="{NS1}">
              <wstop:Topic name="real"><wstop:Topic name="x"/></wstop:Topic>
              <wstop:Topic name="one"><wstop:AliasRef
                Dialect="{CONCRETE}">a:real/x</wstop:AliasRef></wstop:Topic>
            </wstop:TopicNamespace>"""
        )
    )
    assert concrete_topic(src("a:one", {"a": NS1}), ts)[0] == Topic(NS1, ("real", "x"))


def test_memo_is_bounded() -> None:
    ts = TopicSet(fixed=False)
    for i in range(filters._CONCRETE_CACHE.maxsize + 50):
        concrete_topic(src(f"t:a{i}", {"t": NS1}), ts)
    assert len(filters._CONCRETE_CACHE) == filters._CONCRETE_CACHE.maxsize
