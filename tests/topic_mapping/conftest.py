"""Shared fixtures for the topic_mapping tests: TREE-S, the example topic space of WS-Topics
1.0 §4, and TREE-X, the same space grown with deeper and repeated names (t1/t3/t7/t3)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from wsnmom.topic_mapping import Topic, TopicExpression, TopicNamespace, load_topic_namespace

TNS = "http://example.org/topicSpace/example1"
NS: dict[str | None, str] = {"tns": TNS, "xyz": "http://example.org/anotherNamespace"}

#: TREE-S as printed in WS-Topics 1.0 §4 (lower-case 1.0 spellings, AliasRef on t6).
TREE_S_XML = """<?xml version="1.0" encoding="UTF-8"?>
<wstop:topicSpace name="TopicSpaceExample1"
   targetNamespace="http://example.org/topicSpace/example1"
   xmlns:tns="http://example.org/topicSpace/example1"
   xmlns:xyz="http://example.org/anotherNamespace"
   xmlns:wstop="http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics" >
   <wstop:topic name="t1">
      <wstop:topic name="t2" messageTypes="xyz:m1 tns:m2"/>
      <wstop:topic name="t3" messageTypes="xyz:m3"/>
   </wstop:topic>
   <wstop:topic name="t4">
      <wstop:topic name="t5" messageTypes="tns:m3"/>
      <wstop:topic name="t6">
         <wstop:AliasRef
  dialect="http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/concreteTopicPath"
>
            tns:t1/t3
         </wstop:AliasRef>
      </wstop:topic>
   </wstop:topic>
</wstop:topicSpace>
"""

#: TREE-X: t1{t2{t3,t9}, t3{t7{t3}}}, t4{t5, t6 -> alias tns:t1/t3}; 10 topics.
TREE_X_XML = """<wstop:TopicSpace targetNamespace="http://example.org/topicSpace/example1"
   xmlns:tns="http://example.org/topicSpace/example1"
   xmlns:wstop="http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics">
  <wstop:Topic name="t1">
    <wstop:Topic name="t2"><wstop:Topic name="t3"/><wstop:Topic name="t9"/></wstop:Topic>
    <wstop:Topic name="t3">
      <wstop:Topic name="t7"><wstop:Topic name="t3"/></wstop:Topic>
    </wstop:Topic>
  </wstop:Topic>
  <wstop:Topic name="t4">
    <wstop:Topic name="t5"/>
    <wstop:Topic name="t6">
      <wstop:AliasRef
  dialect="http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/concreteTopicPath"
      >tns:t1/t3</wstop:AliasRef>
    </wstop:Topic>
  </wstop:Topic>
</wstop:TopicSpace>
"""


def paths(topics: Iterable[Topic]) -> set[str]:
    """Topics of TNS rendered as 'a/b/c' (namespace checked)."""
    out = set()
    for t in topics:
        assert t.namespace == TNS
        out.add("/".join(t.path))
    return out


def select(expr: TopicExpression, topics: Iterable[Topic]) -> set[str]:
    """The topics of ``topics`` that ``expr`` selects, as 'a/b/c' strings."""
    return paths(t for t in topics if expr.matches(t))


@pytest.fixture
def tree_s() -> TopicNamespace:
    return load_topic_namespace(TREE_S_XML)


@pytest.fixture
def tree_x() -> TopicNamespace:
    return load_topic_namespace(TREE_X_XML)
