"""Notify and GetCurrentMessage on alias topics (WS-Topics 1.0 §8): the alias is resolved;
one topic -> published on it, several -> MultipleTopicsSpecified, none ->
TopicNotSupported.  The aliases come from a TopicNamespace document configured on the
broker (``topic_namespaces``), read the way ``wsnmom serve`` reads it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from wsnmom.core import errors
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.topic_set import TopicSet

from wsnmom.server import load_topic_set

from .conftest import Broker, RecordingOutbound, concrete, make_settings, note, simple, sub_req

ALIAS_NS = "urn:test:aliases"
NSMAP = {"a": ALIAS_NS}
C = "http://127.0.0.1:9/alias-consumer"
CONCRETE_10 = (
    "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/concreteTopicPath"
)
FULL_13 = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"

#: real{x, y}; one -> real/x; many -> real/* (two topics); loop1 <-> loop2 (resolves to none)
DOCUMENT = f"""<wstop:TopicNamespace xmlns:wstop="http://docs.oasis-open.org/wsn/t-1"
    xmlns:a="{ALIAS_NS}" targetNamespace="{ALIAS_NS}">
  <wstop:Topic name="real" final="true">
    <wstop:Topic name="x"/>
    <wstop:Topic name="y"/>
  </wstop:Topic>
  <wstop:Topic name="one"><wstop:AliasRef Dialect="{CONCRETE_10}">a:real/x</wstop:AliasRef>
  </wstop:Topic>
  <wstop:Topic name="many"><wstop:AliasRef Dialect="{FULL_13}">a:real/*</wstop:AliasRef>
  </wstop:Topic>
  <wstop:Topic name="loop1"><wstop:AliasRef Dialect="{CONCRETE_10}">a:loop2</wstop:AliasRef>
  </wstop:Topic>
  <wstop:Topic name="loop2"><wstop:AliasRef Dialect="{CONCRETE_10}">a:loop1</wstop:AliasRef>
  </wstop:Topic>
</wstop:TopicNamespace>
"""


@pytest.fixture
def aliased(tmp_path: Path, make_broker: Callable[..., Broker]) -> BrokerService:
    doc = tmp_path / "aliases.xml"
    doc.write_text(DOCUMENT, encoding="utf-8")
    settings = make_settings(topic_namespaces=[str(doc)])

    def topic_set() -> TopicSet:
        return load_topic_set(settings)

    broker = make_broker(topic_set, topic_namespaces=[str(doc)])
    assert broker.service is not None
    assert broker.service.topic_set.is_alias(Topic(ALIAS_NS, ("one",)))
    return broker.service


def test_notify_on_alias_publishes_on_the_resolved_topic(
    aliased: BrokerService, outbound: RecordingOutbound
) -> None:
    aliased.subscribe(sub_req(C, topic=concrete("a:real/x", NSMAP)))
    aliased.notify([note("<via-alias/>", simple("a:one", NSMAP))])
    (got,) = outbound.wait_messages(C, 1)
    assert got.message.topic == Topic(ALIAS_NS, ("real", "x"))
    assert got.message.payload == b"<via-alias/>"
    # the current message is kept for the resolved topic, and the alias finds it too
    for name in ("a:real/x", "a:one"):
        current = aliased.get_current_message(concrete(name, NSMAP))
        assert current.payload == b"<via-alias/>"
        assert current.topic == Topic(ALIAS_NS, ("real", "x"))


def test_notify_on_alias_of_several_topics_is_multiple_topics(aliased: BrokerService) -> None:
    with pytest.raises(errors.MultipleTopicsSpecified):
        aliased.notify([note("<x/>", simple("a:many", NSMAP))])
    with pytest.raises(errors.MultipleTopicsSpecified):
        aliased.get_current_message(simple("a:many", NSMAP))


def test_notify_on_alias_resolving_to_nothing_is_topic_not_supported(
    aliased: BrokerService,
) -> None:
    with pytest.raises(errors.TopicNotSupported):
        aliased.notify([note("<x/>", simple("a:loop1", NSMAP))])
    with pytest.raises(errors.TopicNotSupported):
        aliased.get_current_message(simple("a:loop2", NSMAP))


def test_alias_never_becomes_a_publish_topic(aliased: BrokerService) -> None:
    """Nothing is stored under the alias itself: it carries no messages (§8)."""
    aliased.notify([note("<x/>", simple("a:one", NSMAP))])
    assert aliased.adapter.current_message(Topic(ALIAS_NS, ("real", "x"))) is not None
    assert aliased.adapter.current_message(Topic(ALIAS_NS, ("one",))) is None
    assert aliased.store.get_current_message(Topic(ALIAS_NS, ("one",))) is None


def test_a_notify_to_a_pull_point_obeys_the_declared_namespace(aliased: BrokerService) -> None:
    """A Notify sent to a pull point admits no topic, but its topics are the declared
    namespace's: an alias is resolved (held on the topic it stands for), and a child
    the namespace forbids (``real`` is final) is TopicNotSupported, nothing held; the
    sentinel after it is the only other message."""
    pp = aliased.create_pull_point(CreatePullPointRequest())
    aliased.notify_pull_point(pp.id, [note("<via-alias/>", simple("a:one", NSMAP))])
    with pytest.raises(errors.TopicNotSupported, match="final"):
        aliased.notify_pull_point(pp.id, [note("<x/>", concrete("a:real/z", NSMAP))])
    aliased.notify_pull_point(pp.id, [note("<sentinel/>")])
    got = aliased.get_messages(pp.id, None)  # embedded: in the inbox once confirmed
    assert [m.payload for m in got] == [b"<via-alias/>", b"<sentinel/>"]
    assert got[0].topic == Topic(ALIAS_NS, ("real", "x"))
    assert Topic(ALIAS_NS, ("real", "z")) not in aliased.topic_set
