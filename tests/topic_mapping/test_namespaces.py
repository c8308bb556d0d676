"""Topic namespace documents (1.3 and 1.0 spellings), TopicSet growth, the TopicSet
resource property document and the XPath dialect over it."""

from __future__ import annotations

import threading

import pytest
from lxml import etree
from wsnmom.topic_mapping import (
    FULL,
    WSTOP_13,
    XPATH,
    InvalidTopicExpression,
    InvalidTopicNamespace,
    Topic,
    TopicNamespace,
    TopicNotSupported,
    TopicSet,
    TopicSetFull,
    load_topic_namespace,
    parse_topic_expression,
)

from .conftest import NS, TNS, TREE_S_XML, paths

URI = "http://example.org/ns13"

DOC_13 = f"""<?xml version="1.0"?>
<wstop:TopicNamespace xmlns:wstop="{WSTOP_13}" xmlns:tns="{URI}"
    xmlns:m="http://example.org/msgs" xmlns:xsd="http://www.w3.org/2001/XMLSchema"
    name="Weather" targetNamespace="{URI}" final="false">
  <wstop:documentation>Weather topics</wstop:documentation>
  <wstop:Topic name="weather" messageTypes="m:Report m:Report">
    <wstop:MessagePattern Dialect="http://www.w3.org/TR/1999/REC-xpath-19991116"
       >boolean(//m:Report)</wstop:MessagePattern>
    <wstop:Topic name="temperature" final="true" messageTypes="xsd:any">
      <wstop:Topic name="celsius"/>
    </wstop:Topic>
  </wstop:Topic>
  <wstop:Topic name="wind" parent="tns:weather"/>
  <wstop:Topic name="gusts" parent="tns:weather/wind" final="1"/>
  <m:extension xmlns:m="http://example.org/ext"/>
</wstop:TopicNamespace>"""


def test_load_13_document() -> None:
    ns = load_topic_namespace(DOC_13.encode())
    assert ns.target_namespace == URI
    assert ns.name == "Weather"
    assert not ns.final
    assert [t.path for t in ns.topics()] == [
        ("weather",),
        ("weather", "temperature"),
        ("weather", "temperature", "celsius"),
        ("weather", "wind"),
        ("weather", "wind", "gusts"),
    ]
    weather = ns.find(["weather"])
    assert weather is not None
    assert weather.message_types == (("http://example.org/msgs", "Report"),)
    assert weather.message_pattern is not None
    assert weather.message_pattern.text == "boolean(//m:Report)"
    temperature = ns.find(["weather", "temperature"])
    assert temperature is not None and temperature.final
    assert temperature.message_types is None  # xsd:any
    gusts = ns.find(["weather", "wind", "gusts"])
    assert gusts is not None and gusts.final
    assert ns.find(["weather", "nope"]) is None


def test_load_10_document_both_spellings(tree_s: TopicNamespace) -> None:
    assert tree_s.target_namespace == TNS
    assert tree_s.name == "TopicSpaceExample1"
    t2 = tree_s.find(["t1", "t2"])
    assert t2 is not None
    assert t2.message_types == (
        ("http://example.org/anotherNamespace", "m1"),
        (TNS, "m2"),
    )
    aliases = tree_s.aliases()
    assert list(aliases) == [Topic(TNS, ("t4", "t6"))]
    assert aliases[Topic(TNS, ("t4", "t6"))].patterns[0].as_topic() == Topic(TNS, ("t1", "t3"))


def test_load_from_element_and_str() -> None:
    el = etree.fromstring(TREE_S_XML.encode())
    assert load_topic_namespace(el).topics() == load_topic_namespace(TREE_S_XML).topics()


def _doc13(body: str, attrs: str = f'targetNamespace="{URI}"') -> str:
    return (
        f'<wstop:TopicNamespace xmlns:wstop="{WSTOP_13}" xmlns:tns="{URI}" {attrs}>'
        f"{body}</wstop:TopicNamespace>"
    )


W10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics"
C10 = W10 + "/TopicExpression/concreteTopicPath"


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (_doc13('<wstop:Topic name="a"/><wstop:Topic name="a"/>'), "duplicate root"),
        (
            _doc13(
                '<wstop:Topic name="a"><wstop:Topic name="b"/><wstop:Topic name="b"/></wstop:Topic>'
            ),
            "duplicate child",
        ),
        (_doc13('<wstop:Topic name="a"/>', attrs=""), "targetNamespace"),
        (_doc13('<wstop:Topic name="1a"/>'), "NCName"),
        (_doc13("<wstop:Topic/>"), "name attribute"),
        (_doc13('<wstop:Topic name="a" final="yes"/>'), "xsd:boolean"),
        (_doc13('<wstop:Topic name="a" messageTypes="zz:x"/>'), "not declared"),
        (_doc13('<wstop:Topic name="b" parent="tns:nope"/>'), "parent"),
        (_doc13('<wstop:Topic name="b" parent="other:a" xmlns:other="urn:o"/>'), "target"),
        ("<not-xml", "not XML"),
        (f'<wstop:TopicSet xmlns:wstop="{WSTOP_13}"/>', "TopicNamespace"),
        (
            f'<w:TopicSpace xmlns:w="{W10}" xmlns:tns="{URI}" targetNamespace="{URI}">'
            f'<w:Topic name="a"/><w:Topic name="b"><w:AliasRef dialect="{C10}">tns:a</w:AliasRef>'
            '<w:Topic name="c"/></w:Topic></w:TopicSpace>',
            "alias topic cannot have child",
        ),
        (
            f'<w:TopicSpace xmlns:w="{W10}" targetNamespace="{URI}">'
            f'<w:Topic name="b"><w:AliasRef dialect="{C10}">tns:a/*</w:AliasRef></w:Topic>'
            "</w:TopicSpace>",
            "invalid AliasRef",
        ),
        (
            f'<w:TopicSpace xmlns:w="{W10}" targetNamespace="{URI}">'
            '<w:Topic name="b"><w:AliasRef dialect="urn:nope">x</w:AliasRef></w:Topic>'
            "</w:TopicSpace>",
            "invalid AliasRef",
        ),
    ],
)
def test_invalid_documents(doc: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicNamespace, match=fragment):
        load_topic_namespace(doc)


def test_parent_attribute_may_reuse_a_root_name_below_it() -> None:
    ns = load_topic_namespace(_doc13('<wstop:Topic name="a"/><wstop:Topic name="a" parent="a"/>'))
    assert [t.path for t in ns.topics()] == [("a",), ("a", "a")]
    with pytest.raises(InvalidTopicNamespace, match="duplicate child"):
        load_topic_namespace(
            _doc13(
                '<wstop:Topic name="a"><wstop:Topic name="b"/></wstop:Topic>'
                '<wstop:Topic name="b" parent="tns:a"/>'
            )
        )


def test_programmatic_namespace() -> None:
    ns = TopicNamespace(URI)
    ns.define(["a", "b"], final=True)
    assert [t.path for t in ns.topics()] == [("a",), ("a", "b")]
    ts = TopicSet([ns])
    assert ts.permits(Topic(URI, ("a", "c")))
    assert not ts.permits(Topic(URI, ("a", "b", "c")))
    with pytest.raises(InvalidTopicNamespace):
        ns.define(["a", "1"])


# -- TopicSet ----------------------------------------------------------------------------------


def test_ad_hoc_namespace_grows_freely() -> None:
    ts = TopicSet()
    assert not ts.fixed
    t = Topic("urn:adhoc", ("x", "y", "z"))
    assert ts.permits(t)
    ts.admit(t)
    ts.admit(t)
    assert ts.topics() == [t]
    assert len(ts) == 1
    assert Topic("urn:adhoc", ("x", "y")) not in ts


def test_declared_namespace_requires_declared_root(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    assert len(ts) == 6
    assert not ts.permits(Topic(TNS, ("t9",)))
    assert ts.permits(Topic(TNS, ("t1", "t2", "new")))
    ts.admit(Topic(TNS, ("t1", "t2", "new", "deeper")))
    assert Topic(TNS, ("t1", "t2", "new", "deeper")) in ts
    with pytest.raises(TopicNotSupported, match="not defined"):
        ts.admit(Topic(TNS, ("t9",)))


def test_fixed_set_does_not_grow(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s], fixed=True)
    with pytest.raises(TopicNotSupported, match="fixed"):
        ts.admit(Topic(TNS, ("t1", "new")))
    with pytest.raises(TopicNotSupported, match="fixed"):
        ts.admit(Topic("urn:adhoc", ("x",)))
    ts.admit(Topic(TNS, ("t1",)))  # members are fine


def test_check_name_applies_the_namespace_rules_only(tree_s: TopicNamespace) -> None:
    """``check_name`` (a topic only carried: a Notify to a pull point): a fixed set's
    non-member, or a new topic past the growth limit, passes and is not added; a root
    the declared namespace does not define is refused."""
    ts = TopicSet([tree_s], fixed=True)
    grown, size = ts.grown, len(ts)
    ts.check_name(Topic(TNS, ("t1", "new")))
    ts.check_name(Topic("urn:adhoc", ("x",)))
    with pytest.raises(TopicNotSupported, match="not defined"):
        ts.check_name(Topic(TNS, ("t9",)))
    assert (ts.grown, len(ts)) == (grown, size)
    assert Topic("urn:adhoc", ("x",)) not in ts


def test_duplicate_namespace_rejected(tree_s: TopicNamespace) -> None:
    with pytest.raises(InvalidTopicNamespace):
        TopicSet([tree_s, load_topic_namespace(TREE_S_XML)])


def test_validate_returns_resolved_expression(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    expr = parse_topic_expression("tns:t4/t6 | tns:t1/t2", FULL, NS)
    out = ts.validate(expr)
    assert out.text == expr.text and out.dialect == expr.dialect
    assert paths(p.as_topic() for p in out.patterns) == {"t1/t3", "t1/t2"}
    assert ts.is_alias(Topic(TNS, ("t4", "t6")))
    assert not ts.is_alias(Topic(TNS, ("t4",)))


def test_to_element(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s], topics=[Topic(TNS, ("t1", "t2")), Topic(TNS, ("t4",))])
    ts.admit(Topic("urn:adhoc", ("x",)))
    el = ts.to_element()
    assert el.tag == f"{{{WSTOP_13}}}TopicSet"
    topic_attr = f"{{{WSTOP_13}}}topic"
    roots = {etree.QName(c).text: c for c in el}
    assert set(roots) == {f"{{{TNS}}}t1", f"{{{TNS}}}t4", "{urn:adhoc}x"}
    t1 = roots[f"{{{TNS}}}t1"]
    assert t1.get(topic_attr) is None  # only an ancestor, not a member
    (t2,) = list(t1)
    assert t2.tag == f"{{{TNS}}}t2" and t2.get(topic_attr) == "true"
    assert roots[f"{{{TNS}}}t4"].get(topic_attr) == "true"
    # serialises with declared prefixes, and re-parses to the same shape
    again = etree.fromstring(etree.tostring(el))
    marked = again.xpath("//*[@wstop:topic='true']", namespaces={"wstop": WSTOP_13})
    assert isinstance(marked, list) and len(marked) == 3


def test_concurrent_admit_and_read() -> None:
    ts = TopicSet()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(300):
                ts.admit(Topic("urn:c", (f"w{n}", f"t{i}")))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(20):
                ts.to_element()
                ts.topics()
                ts.permits(Topic("urn:c", ("a",)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ts) == 1200


# -- XPath dialect ----------------------------------------------------------------------------

WSTOP_NS = {**NS, "wstop": WSTOP_13}


def test_xpath_over_topic_set(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    expr = parse_topic_expression("tns:t1/*", XPATH, WSTOP_NS, topic_set=ts)
    assert expr.static and expr.dialect == XPATH
    assert paths(p.as_topic() for p in expr.patterns) == {"t1/t2", "t1/t3"}
    # static: a topic grown later is not selected
    ts.admit(Topic(TNS, ("t1", "t7")))
    assert not expr.matches(Topic(TNS, ("t1", "t7")))
    expr2 = parse_topic_expression("tns:t1/*", XPATH, WSTOP_NS, topic_set=ts)
    assert expr2.matches(Topic(TNS, ("t1", "t7")))


def test_xpath_selecting_alias_resolves_on_validate(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    expr = parse_topic_expression("//tns:t6", XPATH, WSTOP_NS, topic_set=ts)
    assert paths(ts.select(ts.validate(expr))) == {"t1/t3"}


def test_xpath_plain_path_needs_no_topic_set() -> None:
    expr = parse_topic_expression("tns:t1/t3", XPATH, NS)
    assert expr.static
    assert expr.patterns[0].as_topic() == Topic(TNS, ("t1", "t3"))


def test_xpath_general_expression_without_topic_set() -> None:
    with pytest.raises(TopicNotSupported):
        parse_topic_expression("//tns:t1", XPATH, NS)


@pytest.mark.parametrize("text", ["count(//*)", '"a"="a"', "//@wstop:topic", "///", "foo:x//y", ""])
def test_xpath_invalid(tree_s: TopicNamespace, text: str) -> None:
    ts = TopicSet([tree_s])
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression(text, XPATH, WSTOP_NS, topic_set=ts)


def test_admit_refuses_growth_beyond_its_limit_but_members_and_taken_in_topics_pass() -> None:
    declared = TopicNamespace("urn:declared")
    declared.define(("root",))
    topic_set = TopicSet([declared])
    assert topic_set.grown == 0  # declared topics are not growth
    a, b, c = (Topic("urn:adhoc", (n,)) for n in "abc")
    assert topic_set.admit(a, limit=2) is True
    assert topic_set.take_in([b]) == [b]  # another instance's: taken in whatever the bound
    with pytest.raises(TopicSetFull) as refused:
        topic_set.admit(c, limit=2)
    assert refused.value.limit == 2 and isinstance(refused.value, TopicNotSupported)
    assert topic_set.admit(a, limit=2) is False  # a member is no growth
    assert topic_set.admit(Topic("urn:declared", ("root",)), limit=0) is False
    assert topic_set.admit(Topic("urn:declared", ("root", "grown")), limit=3) is True
    assert topic_set.admit(c) is True  # no limit
    assert topic_set.grown == 4 and c in topic_set


def test_admit_all_adds_every_topic_or_none_and_check_adds_nothing() -> None:
    """``admit_all`` is one request's admission: past the bound with all its new topics,
    none is added (the refusal names the first new one); ``check`` answers as ``admit``
    would after ``ahead`` other new topics, without adding."""
    closed = TopicNamespace("urn:closed")
    closed.define(("root",))
    topic_set = TopicSet([closed])
    a, b, c = (Topic("urn:adhoc", (n,)) for n in "abc")
    assert topic_set.admit(a) is True
    version = topic_set.version
    with pytest.raises(TopicSetFull) as refused:
        topic_set.admit_all([a, b, c], limit=2)
    assert refused.value.topic == b and refused.value.limit == 2
    assert b not in topic_set and c not in topic_set and topic_set.grown == 1
    with pytest.raises(TopicNotSupported):  # an undeclared root of a declared namespace
        topic_set.admit_all([b, Topic("urn:closed", ("other",))])
    assert b not in topic_set and topic_set.version == version
    assert topic_set.check(a, limit=1) is False  # a member
    assert topic_set.check(b, limit=2) is True and b not in topic_set
    with pytest.raises(TopicSetFull):
        topic_set.check(c, limit=2, ahead=1)
    assert topic_set.admit_all([a, b, c, b], limit=3) == [b, c]
    assert topic_set.grown == 3 and topic_set.version > version
