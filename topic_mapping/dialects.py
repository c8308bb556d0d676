"""TopicExpression dialects: parsing an expression in any supported dialect.

:func:`parse_topic_expression` normalises the Dialect URI and hands the text to the parser
of its dialect: the path dialects (Simple, Concrete, Full, ONVIF's ConcreteSet) in
:mod:`.path_dialects`, the XPath dialect in :mod:`.xpath_dialect`.  The dialect URIs and
helpers are re-exported here, where callers have always found them.

The XPath dialect's module (and elementpath under it) is imported by the first XPath
expression parsed, not with this module: most processes never parse one, and the
command line starts faster without it.
"""

from __future__ import annotations

from collections.abc import Mapping

from lxml import etree

from .errors import MultipleTopicsSpecified
from .model import PathPattern, Topic, TopicDocument, TopicExpression
from .path_dialects import (
    CONCRETE,
    DIALECT_ALIASES,
    FULL,
    NCNAME_PATTERN,
    NCNAME_RE,
    ONVIF_CONCRETE_SET,
    SIMPLE,
    SUPPORTED_DIALECTS,
    XPATH,
    canonical_dialect,
    element_text,
    is_ncname,
    is_single_qname,
    parse_path_dialect,
)

__all__ = [
    "CONCRETE",
    "DIALECT_ALIASES",
    "FULL",
    "NCNAME_PATTERN",
    "NCNAME_RE",
    "ONVIF_CONCRETE_SET",
    "SIMPLE",
    "SUPPORTED_DIALECTS",
    "XPATH",
    "canonical_dialect",
    "element_text",
    "is_ncname",
    "parse_path_dialect",
    "parse_topic_expression",
    "parse_topic_expression_element",
    "require_concrete_topic",
]


def parse_topic_expression(
    text: str,
    dialect: str | None,
    namespaces: Mapping[str | None, str],
    *,
    topic_set: TopicDocument | None = None,
) -> TopicExpression:
    """Parse a TopicExpression in ``dialect`` (any URI of ``SUPPORTED_DIALECTS``).

    ``namespaces`` maps prefixes to namespace URIs as in scope on the carrying element;
    the ``None`` (or ``""``) key is the default namespace.  Leading and trailing whitespace
    is ignored (the expressions are ``xsd:token`` values).

    When ``dialect`` is None (no Dialect attribute): a text that is a single QName is parsed
    as Simple, anything else as Full.  Both readings agree on a single QName, so this only
    decides which dialect URI the result reports.

    The result's ``dialect`` is the canonical URI (``SIMPLE``, ``CONCRETE``, ``FULL``,
    ``XPATH`` or ``ONVIF_CONCRETE_SET``).  The XPath dialect is evaluated over ``topic_set`` (see
    :func:`wsnmom.topic_mapping.xpath_dialect.parse_xpath`).

    Raises TopicExpressionDialectUnknown for an unknown URI, InvalidTopicExpression (the
    message names the position and offending text) for a malformed expression, and
    TopicNotSupported for a general XPath expression when no topic set is given.
    """
    text = text.strip()
    if dialect is None:
        canonical = SIMPLE if is_single_qname(text) else FULL
    else:
        canonical = canonical_dialect(dialect)
    if canonical == XPATH:
        from .xpath_dialect import parse_xpath

        return parse_xpath(text, namespaces, topic_set=topic_set)
    patterns = parse_path_dialect(text, canonical, namespaces)
    return TopicExpression(canonical, text, _dedupe(patterns))


def _dedupe(patterns: tuple[PathPattern, ...]) -> tuple[PathPattern, ...]:
    return tuple(dict.fromkeys(patterns))


def parse_topic_expression_element(
    element: etree._Element, *, topic_set: TopicDocument | None = None
) -> TopicExpression:
    """Parse a ``wsnt:TopicExpression`` / ``wsnt:Topic`` (or ``AliasRef``) element.

    The dialect comes from the ``Dialect`` attribute (1.3) or ``dialect`` (1.0); the text is
    the element's character content; prefixes resolve against the element's in-scope
    namespace declarations.
    """
    dialect = element.get("Dialect")
    if dialect is None:
        dialect = element.get("dialect")
    text = element_text(element)
    nsmap: dict[str | None, str] = dict(element.nsmap)
    return parse_topic_expression(text, dialect, nsmap, topic_set=topic_set)


def require_concrete_topic(expr: TopicExpression) -> Topic:
    """The single topic a concrete expression names (Notify, GetCurrentMessage).

    Raises MultipleTopicsSpecified when the expression has a wildcard, a union of
    different topics, or selects nothing.
    """
    if not expr.is_concrete:
        raise MultipleTopicsSpecified(
            f"TopicExpression {expr.text!r} does not name exactly one topic"
        )
    return expr.patterns[0].as_topic()
