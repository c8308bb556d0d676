"""Subscription filters: compilation at Subscribe time and evaluation per message.

Decisions (rule ids as in docs/conformance.md; NCIA §2.3.4):

* Filter children combine with **AND** (FLT-02).  A subscription without TopicExpression
  receives every notification, topicless ones included; one with a TopicExpression never
  receives topicless notifications (BRK-16).
* TopicExpression: Simple, Concrete, Full and XPath dialects via ``wsnmom.topic_mapping``;
  the expression is validated against the broker's TopicSet (aliases resolved, §8); the
  single topic of Notify / GetCurrentMessage is resolved the same way (``concrete_topic``).
  topic_mapping errors map to the same-named WS-N faults.  The reserved wsnmom namespaces
  cannot be subscribed to.
* MessageContent: XPath 1.0 (dialect ``http://www.w3.org/TR/1999/REC-xpath-19991116``; a
  missing Dialect is read as XPath 1.0).  Compiled at Subscribe time with lxml, so syntax
  errors, undeclared prefixes and unknown functions fault with
  InvalidMessageContentExpressionFault (MC-06 d); any other dialect faults the same way
  (MC-05).  Prefixes resolve against the in-scope namespaces of ``wsnt:MessageContent``
  (MC-06 a).  The context node is the payload element, parsed into its own document, so
  relative (``ncex:Producer``) and absolute (``/npex:NotifyContent``) paths both work
  (MC-06 b).  The result is converted with XPath 1.0 ``boolean()`` rules (MC-06 c): a
  non-boolean expression such as ``gibberish`` is accepted and selects a (normally empty)
  node-set, so it never matches unless the payload has such a child.  An evaluation error
  at delivery time counts as "does not match".
* ProducerProperties: not supported.  The broker is not a WS-Resource whose properties
  vary per notification, so every ProducerProperties filter is refused with
  InvalidProducerPropertiesExpressionFault (PPF-04; WS-Nu vector "unsupported").
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.codec import is_reserved, safe_parse
from wsnmom.core.filter_sandbox import ContentEvaluator, FilterBudgetExceeded
from wsnmom.core.filter_worker import xpath_boolean
from wsnmom.core.model import ExpressionSource, NotificationMessage
from wsnmom.core.per_thread import PerThread
from wsnmom.core.xpath_guard import FilterRules, XPathRefused, check_expression
from wsnmom.topic_mapping import errors as tm_errors
from wsnmom.topic_mapping.dialects import (
    XPATH,
    canonical_dialect,
    parse_topic_expression,
    require_concrete_topic,
)
from wsnmom.topic_mapping.model import DEEP, PathPattern, Segment, Topic, TopicExpression
from wsnmom.topic_mapping.topic_set import TopicSet

log = logging.getLogger(__name__)

XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"
MESSAGE_CONTENT_DIALECTS = (XPATH10,)


@contextmanager
def topic_errors(*, unknown_dialect: type[errors.WsnError] | None = None) -> Iterator[None]:
    """Translate ``topic_mapping`` errors into WS-N errors.

    ``unknown_dialect`` overrides the error for an unknown dialect (RegisterPublisher has
    no TopicExpressionDialectUnknownFault and uses InvalidTopicExpressionFault).
    """
    try:
        yield
    except tm_errors.TopicExpressionDialectUnknown as exc:
        cls = unknown_dialect or errors.TopicExpressionDialectUnknown
        raise cls(str(exc)) from exc
    except tm_errors.MultipleTopicsSpecified as exc:
        raise errors.MultipleTopicsSpecified(str(exc)) from exc
    except tm_errors.TopicNotSupported as exc:
        raise errors.TopicNotSupported(str(exc)) from exc
    except tm_errors.InvalidTopicExpression as exc:
        raise errors.InvalidTopicExpression(str(exc)) from exc
    except tm_errors.TopicError as exc:
        raise errors.InvalidTopicExpression(str(exc)) from exc


def _check_reserved(expr: TopicExpression) -> None:
    for pattern in expr.patterns:
        if is_reserved(pattern.namespace):
            raise errors.TopicNotSupported(
                f"topic namespace {pattern.namespace!r} is reserved by the broker"
            )


def compile_topic_filter(source: ExpressionSource, topic_set: TopicSet) -> TopicExpression:
    """Parse and validate a subscription's TopicExpression (wildcards allowed)."""
    with topic_errors():
        expr = parse_topic_expression(
            source.text, source.dialect, source.namespaces, topic_set=topic_set
        )
        _check_reserved(expr)
        return topic_set.validate(expr)


def concrete_topic(
    source: ExpressionSource,
    topic_set: TopicSet,
    *,
    unknown_dialect: type[errors.WsnError] | None = None,
) -> tuple[Topic, str]:
    """The single topic named by ``source`` (Notify, GetCurrentMessage, SubscriptionEnd)
    and the canonical dialect URI it was written in.

    A declared alias topic is resolved through the topic set (WS-Topics 1.0 §8): an alias
    resolving to exactly one concrete topic stands for that topic; one resolving to a
    wildcard or to several topics is MultipleTopicsSpecified; one resolving to nothing (a
    cycle) or outside a fixed set is TopicNotSupported.  Callers still check the returned
    topic against the set (``admit`` / ``permits``).

    Successful parses of the Simple, Concrete and Full dialects are memoised (a bounded
    LRU, see :func:`_concrete_key`): a Notify repeats the same expression for each of its
    messages.  Alias resolution and the XPath dialect depend on the topic set and are
    evaluated on every call.
    """
    with topic_errors(unknown_dialect=unknown_dialect):
        key = _concrete_key(source)
        hit = _CONCRETE_CACHE.get(key) if key is not None else None
        if hit is None:
            expr = parse_topic_expression(
                source.text, source.dialect, source.namespaces, topic_set=topic_set
            )
            _check_reserved(expr)
            topic = require_concrete_topic(expr)  # a wildcard or union: refused as such
            if key is not None:
                _CONCRETE_CACHE.put(key, (expr, topic))
        else:
            expr, topic = hit
        # aliases depend on the topic set (which can change): never memoised
        if topic_set.is_alias(topic):  # cheap check first: this is the Notify hot path
            topic = require_concrete_topic(topic_set.validate(expr))
        return topic, expr.dialect


class _LruCache:
    """A small thread-safe LRU map (the memo of :func:`concrete_topic`)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[object, tuple[TopicExpression, Topic]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object) -> tuple[TopicExpression, Topic] | None:
        """The cached value (now the most recently used), or None."""
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: object, value: tuple[TopicExpression, Topic]) -> None:
        """Store ``value``, evicting the least recently used entry beyond ``maxsize``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


#: parsed concrete topic expressions of Notify / GetCurrentMessage, keyed by
#: :func:`_concrete_key`; only successful parses are kept
_CONCRETE_CACHE = _LruCache(1024)


def _concrete_key(source: ExpressionSource) -> tuple[object, ...] | None:
    """The memo key of ``source``: dialect, text and the bindings of every prefix the text
    may use plus the default namespace; None for expressions that are not memoised (the
    XPath dialect, whose result is evaluated over the topic set, and unknown dialects).

    Parsing the Simple/Concrete/Full dialects depends on nothing else, so equal keys give
    equal expressions; bindings of prefixes the text does not mention (the rest of the
    envelope's namespaces) do not split the cache.
    """
    dialect = source.dialect
    if dialect is not None:
        try:
            if canonical_dialect(dialect) == XPATH:
                return None
        except tm_errors.TopicError:
            return None
    text = source.text
    ns: Mapping[str | None, str] = source.namespaces
    used = tuple(
        sorted((p, uri) for p, uri in ns.items() if p and uri is not None and f"{p}:" in text)
    )
    return (dialect, text, ns.get(None), ns.get(""), used)


class MessageContentFilter:
    """A compiled MessageContent XPath 1.0 expression.

    ``rules`` (the ``[filters]`` settings) say what the expression may use; it is checked
    (:func:`wsnmom.core.xpath_guard.check_expression`) before lxml compiles it.  Unless
    the EXSLT regular-expression functions are enabled, the expression is also probed
    here, in the calling thread, on a one-element document: with only the XPath 1.0
    function library that evaluation is bounded by the expression's size.  With them
    enabled the probe is the evaluator's (:func:`probe`): a regular expression over a
    literal string can backtrack for ever.

    Evaluation on messages is the evaluator's job (:mod:`wsnmom.core.filter_sandbox`);
    :meth:`matches` evaluates in the calling thread, without any budget.
    """

    __slots__ = ("_xpaths", "exslt_regex", "namespace_items", "text")

    def __init__(self, source: ExpressionSource, rules: FilterRules | None = None) -> None:
        rules = rules or FilterRules()
        dialect = source.dialect or XPATH10
        if dialect not in MESSAGE_CONTENT_DIALECTS:
            raise errors.InvalidMessageContentExpression(
                f"MessageContent dialect {dialect!r} is not supported; supported: {XPATH10}"
            )
        text = source.text.strip()
        namespaces = {p: uri for p, uri in source.namespaces.items() if p and uri}
        try:
            check_expression(text, namespaces, rules)
        except XPathRefused as exc:
            raise errors.InvalidMessageContentExpression(
                f"MessageContent expression {_shorten(text)!r} refused: {exc}"
            ) from exc
        regex = rules.exslt_regex

        def compile_xpath() -> etree.XPath:
            return etree.XPath(text, namespaces=namespaces, smart_strings=False, regexp=regex)

        try:
            first = compile_xpath()
            if not regex:
                # lxml reports undeclared prefixes and unknown functions only when
                # evaluating: probe once so they fault at Subscribe time (MC-06 d)
                first(etree.fromstring(b"<probe/>"))
        except (etree.XPathSyntaxError, etree.XPathEvalError) as exc:
            raise errors.InvalidMessageContentExpression(
                f"invalid XPath 1.0 MessageContent expression {_shorten(text)!r}: {exc}"
            ) from exc
        self.text = text
        self.namespace_items = tuple(sorted(namespaces.items()))
        self.exslt_regex = regex
        # a compiled XPath locks its callers: each evaluating thread gets its own copy
        self._xpaths = PerThread(compile_xpath, first)

    def compiled(self) -> etree.XPath:
        """This thread's compiled copy."""
        return self._xpaths.get()

    def matches_element(self, element: etree._Element) -> bool:
        """Evaluate over ``element`` (the payload root) with XPath ``boolean()`` rules, in
        the calling thread."""
        try:
            result = self._xpaths.get()(element)
        except etree.XPathError as exc:
            log.debug("MessageContent %r failed on a message: %s", self.text, exc)
            return False
        return xpath_boolean(result)

    def matches(self, payload: bytes) -> bool:
        """Evaluate over a serialised payload element, in the calling thread."""
        try:
            element = safe_parse(payload)
        except etree.XMLSyntaxError:
            return False
        return self.matches_element(element)


def probe(content: MessageContentFilter, evaluator: ContentEvaluator) -> None:
    """Evaluate ``content`` once on a one-element document with ``evaluator`` when the
    EXSLT regular-expression functions are enabled (otherwise it was probed when
    compiled): an expression that cannot be evaluated or exceeds its budget even there is
    refused with InvalidMessageContentExpressionFault."""
    if not content.exslt_regex:
        return
    try:
        (verdict,) = evaluator.evaluate(content, [b"<probe/>"])
    except FilterBudgetExceeded as exc:
        raise errors.InvalidMessageContentExpression(
            f"MessageContent expression {_shorten(content.text)!r} refused: {exc.reason} "
            "(on a one-element message)"
        ) from exc
    if isinstance(verdict, str):
        raise errors.InvalidMessageContentExpression(
            f"invalid XPath 1.0 MessageContent expression {_shorten(content.text)!r}: {verdict}"
        )


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def check_producer_properties(source: ExpressionSource) -> None:
    """ProducerProperties filters are not supported (see the module docstring)."""
    raise errors.InvalidProducerPropertiesExpression(
        f"ProducerProperties filters are not supported by this broker "
        f"(dialect {source.dialect!r}, expression {source.text.strip()!r})"
    )


@dataclass(frozen=True, slots=True)
class CompiledFilter:
    """Everything a subscription filters on; ``matches`` is the residual check in core."""

    topic: TopicExpression | None = None
    content: MessageContentFilter | None = None

    @property
    def native_patterns(self) -> tuple[PathPattern, ...] | None:
        """Patterns for ``SubscriptionSpec``: None (everything) without a topic filter."""
        return None if self.topic is None else self.topic.patterns

    def matches_topic(self, message: NotificationMessage) -> bool:
        """True when the topic filter accepts ``message`` (the MessageContent filter is
        evaluated by a ``filter_sandbox`` evaluator, off the calling thread)."""
        return self.topic is None or (
            message.topic is not None and self.topic.matches(message.topic)
        )


def patterns_overlap(a: PathPattern, b: PathPattern) -> bool:
    """Whether some concrete topic matches both patterns (demand evaluation)."""
    if a.namespace != b.namespace:
        return False
    return _segments_overlap(a.segments, b.segments)


def _segments_overlap(a: tuple[Segment, ...], b: tuple[Segment, ...]) -> bool:
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        sa = a[i] if i < len(a) else None
        sb = b[j] if j < len(b) else None
        if sa is DEEP:
            stack.append((i + 1, j))  # DEEP absorbs nothing
            if sb is not None and sb is not DEEP:
                stack.append((i, j + 1))  # DEEP absorbs the level b consumes
        if sb is DEEP:
            stack.append((i, j + 1))
            if sa is not None and sa is not DEEP:
                stack.append((i + 1, j))
        if sa is not None and sb is not None and sa is not DEEP and sb is not DEEP:
            if isinstance(sa, str) and isinstance(sb, str):
                if sa == sb:
                    stack.append((i + 1, j + 1))
            else:
                stack.append((i + 1, j + 1))
    return False


def expressions_overlap(a: TopicExpression | None, b: TopicExpression | None) -> bool:
    """Whether two topic filters can select a common topic (None selects everything)."""
    if a is None or b is None:
        return True
    return any(patterns_overlap(p, q) for p in a.patterns for q in b.patterns)
