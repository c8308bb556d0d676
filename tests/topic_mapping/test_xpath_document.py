"""The XPath dialect's topic document, built once per version of the topic set
(``TopicSet.xpath_document``): XPath TopicExpressions select in it without building a
document of every topic per request, and see every topic admitted since."""

from __future__ import annotations

import threading

import pytest
from wsnmom.topic_mapping import Topic, TopicSet, parse_topic_expression
from wsnmom.topic_mapping.dialects import XPATH
from wsnmom.topic_mapping.model import PathPattern

NS = "urn:xpath-doc"
PREFIXES: dict[str | None, str] = {"p": NS}


def _select(topic_set: TopicSet, text: str) -> tuple[PathPattern, ...]:
    return parse_topic_expression(text, XPATH, PREFIXES, topic_set=topic_set).patterns


def test_the_document_is_built_once_per_version_and_sees_new_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five XPath parses over an unchanged set build one document (before: one each);
    a topic admitted after makes the next parse build it again and select that topic."""
    topic_set = TopicSet()
    for i in range(20):
        topic_set.admit(Topic(NS, ("a", f"t{i}")))
    builds: list[int] = []
    to_element = TopicSet.to_element

    def counting(self: TopicSet, *args: object, **kw: object) -> object:
        builds.append(1)
        return to_element(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(TopicSet, "to_element", counting)
    for _ in range(5):
        assert _select(topic_set, "p:a/*[last()]") == (PathPattern(NS, ("a", "t9")),)
    assert len(builds) == 1
    assert _select(topic_set, "//p:new") == ()
    topic_set.admit(Topic(NS, ("a", "new")))
    assert _select(topic_set, "//p:new") == (PathPattern(NS, ("a", "new")),)
    assert _select(topic_set, "p:a/*[last()]") == (PathPattern(NS, ("a", "t9")),)
    assert len(builds) == 2
    assert topic_set.xpath_document() is topic_set.xpath_document()


def test_threads_selecting_in_the_shared_document_get_what_one_thread_gets() -> None:
    """The document is shared: eight threads selecting in it at once (positions, axes,
    predicates) get the answers one thread got."""
    topic_set = TopicSet()
    for i in range(400):
        topic_set.admit(Topic(NS, (f"a{i // 40}", f"t{i}")))
    texts = [f"p:a{i % 10}/*[{i % 7 + 1}]" for i in range(30)] + [
        "p:a3/*[last()]",
        "p:a1/following-sibling::*[1]/*[2]",
        "p:a2/p:t85/parent::*/*[1]",
        "//p:t123",
    ]
    expected = {text: _select(topic_set, text) for text in texts}
    # members in sorted order: t100 comes before t80
    assert expected["p:a2/p:t85/parent::*/*[1]"] == (PathPattern(NS, ("a2", "t100")),)
    wrong: list[str] = []

    def select() -> None:
        for _ in range(10):
            wrong.extend(t for t in texts if _select(topic_set, t) != expected[t])

    threads = [threading.Thread(target=select) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
