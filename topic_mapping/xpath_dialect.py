"""The XPath 1.0 TopicExpression dialect (``http://www.w3.org/TR/1999/REC-xpath-19991116``).

The expression is evaluated with elementpath's XPath 1.0 parser over the broker's
``wstop:TopicSet`` document (:meth:`TopicSet.to_element`, as elementpath's node tree:
:func:`topic_document`, which ``TopicSet.xpath_document`` builds once per version of the
set, so a request does not pay for a document of every topic): the context node is the
``wstop:TopicSet`` element, every topic is an element in its topic namespace nested under
its parent topic, and topics of the set carry ``wstop:topic="true"``.  Each selected element
becomes one concrete pattern; the result is ``static`` (topics added later are not
selected, unlike the path dialects which are matched dynamically).

Rules (decisions):

* An expression that is a plain path of name steps (``p:a/b/p:c``, the Concrete grammar)
  names that topic directly, with unprefixed child steps in the root's namespace, without
  evaluating it.  This is how peers publish with the XPath dialect (WS-Nu sends
  ``test:root1/ask``), and it needs no topic set.  Strict XPath 1.0 would put ``ask`` in
  no namespace and select nothing.
* Any other expression needs a topic set.  Without one, TopicNotSupported is raised
  (there are no topics the expression could select), not InvalidTopicExpression.
* An XPath syntax error, an undeclared prefix, or a result that is not a node-set of topic
  elements (a number, string or boolean) is an InvalidTopicExpression.
* An empty node-set is a valid (empty) selection; TopicSet.validate decides whether that
  is acceptable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import elementpath
from lxml import etree

from .errors import InvalidTopicExpression, TopicNotSupported
from .model import PathPattern, Topic, TopicDocument, TopicExpression
from .path_dialects import CONCRETE, NCNAME_PATTERN, XPATH, parse_path_dialect

if TYPE_CHECKING:
    from .model import XPathDocument

__all__ = ["element_topic", "parse_xpath", "topic_document"]

_QN = f"(?:{NCNAME_PATTERN}:)?{NCNAME_PATTERN}"
_PLAIN_PATH_RE = re.compile(f"{_QN}(?:/{_QN})*")


def topic_document(element: etree._Element) -> XPathDocument:
    """``element`` (a ``wstop:TopicSet`` document) as the node tree :func:`parse_xpath`
    selects in: building it visits every element, so a caller holding a topic set keeps
    it while the set does not change (it is only read)."""
    return elementpath.get_node_tree(element)


def element_topic(element: etree._Element) -> Topic | None:
    """The topic an element of a TopicSet document stands for (None for the root)."""
    path: list[str] = []
    node: etree._Element | None = element
    namespace = ""
    while node is not None and node.getparent() is not None:
        qname = etree.QName(node)
        path.append(qname.localname)
        namespace = qname.namespace or ""
        node = node.getparent()
    if not path:
        return None
    path.reverse()
    return Topic(namespace, tuple(path))


def parse_xpath(
    text: str, namespaces: Mapping[str | None, str], *, topic_set: TopicDocument | None = None
) -> TopicExpression:
    """Parse/evaluate an XPath-dialect TopicExpression (see the module docstring)."""
    text = text.strip()
    bindings = tuple(
        sorted((p or "", uri) for p, uri in namespaces.items() if uri and p is not None)
    )
    if _PLAIN_PATH_RE.fullmatch(text):
        plain = parse_path_dialect(text, CONCRETE, namespaces)
        return TopicExpression(XPATH, text, plain, bindings, static=True)
    if not text:
        raise InvalidTopicExpression("invalid XPath TopicExpression: empty expression")
    if topic_set is None:
        raise TopicNotSupported(
            f"XPath TopicExpression {text!r} can only be evaluated over a topic set, "
            "and none is configured"
        )
    document = topic_set.xpath_document()
    ns = {p: uri for p, uri in bindings if p}
    try:
        result = elementpath.select(document, text, ns, parser=elementpath.XPath1Parser)
    except (elementpath.ElementPathError, SyntaxError, TypeError, ValueError) as exc:
        raise InvalidTopicExpression(f"invalid XPath TopicExpression {text!r}: {exc}") from exc
    if not isinstance(result, list):
        raise InvalidTopicExpression(
            f"XPath TopicExpression {text!r} evaluates to {type(result).__name__}, "
            "not a node-set of topics"
        )
    patterns: dict[PathPattern, None] = {}
    for item in result:
        if not isinstance(item, etree._Element):
            raise InvalidTopicExpression(
                f"XPath TopicExpression {text!r} selects {item!r}, which is not a topic element"
            )
        topic = element_topic(item)
        if topic is not None:
            patterns[PathPattern(topic.namespace, topic.path)] = None
    return TopicExpression(XPATH, text, tuple(patterns), bindings, static=True)
