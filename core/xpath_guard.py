"""What a MessageContent XPath filter may contain: checked at Subscribe time, before it is
compiled or evaluated.

A filter comes from a stranger and is evaluated against every message its subscription
sees, so anything that can make one evaluation unbounded is refused here rather than
discovered while delivering:

* **functions**: only the XPath 1.0 core function library.  lxml also offers the EXSLT
  extension functions to any expression that binds their namespaces, and some of them
  are unbounded in time or memory (``str:padding(1e9, 'x')`` allocates a gigabyte, the
  regular-expression functions backtrack exponentially: ``re:test(., '^(a+)+$')``).  The
  EXSLT regular-expression functions (``re:test``, ``re:match``, ``re:replace``) are
  allowed only when the operator enables them (``filters.exslt_regex``); every other
  extension function is refused.
* **variables**: there are none to refer to, so ``$x`` is refused.
* **size**: at most ``filters.max_expression_length`` characters and
  ``filters.max_nesting`` levels of parentheses and predicates.

What a check cannot see -- the cost of an allowed expression on a large message -- is
bounded while evaluating (:mod:`wsnmom.core.filter_sandbox`).

The lexer follows XPath 1.0 §3.7 (lexical structure): a name followed by ``(`` is a
function call unless it is one of the node types ``comment``, ``text``,
``processing-instruction`` and ``node``; a name followed by ``::`` is an axis.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CORE_FUNCTIONS",
    "EXSLT_REGEX",
    "REGEX_FUNCTIONS",
    "FilterRules",
    "XPathRefused",
    "check_expression",
]

#: the XPath 1.0 function library (§4)
CORE_FUNCTIONS = frozenset(
    {
        "last",
        "position",
        "count",
        "id",
        "local-name",
        "namespace-uri",
        "name",
        "string",
        "concat",
        "starts-with",
        "contains",
        "substring-before",
        "substring-after",
        "substring",
        "string-length",
        "normalize-space",
        "translate",
        "boolean",
        "not",
        "true",
        "false",
        "lang",
        "number",
        "sum",
        "floor",
        "ceiling",
        "round",
    }
)
NODE_TYPES = frozenset({"comment", "text", "processing-instruction", "node"})
#: the EXSLT regular-expressions namespace and its functions (lxml implements them with
#: Python's ``re``)
EXSLT_REGEX = "http://exslt.org/regular-expressions"
REGEX_FUNCTIONS = frozenset({"test", "match", "replace"})


class XPathRefused(ValueError):
    """The expression may not be used as a filter (the message says why)."""


@dataclass(frozen=True, slots=True)
class FilterRules:
    """What a MessageContent expression may use (from the ``[filters]`` settings)."""

    exslt_regex: bool = False
    max_expression_length: int = 2048
    max_nesting: int = 16


# XPath 1.0 tokens (§3.7); NCName is approximated by the Unicode word characters plus the
# NameChar punctuation, which is what matters for finding names and their prefixes
_NCNAME = r"[^\W\d][\w.\-\u00b7\u0300-\u036f\u203f-\u2040]*"
_TOKEN = re.compile(
    rf"""
    (?P<space>\s+)
  | (?P<literal>"[^"]*"|'[^']*')
  | (?P<number>\d+(?:\.\d*)?|\.\d+)
  | (?P<variable>\$(?:{_NCNAME}:)?{_NCNAME})
  | (?P<qname>(?:{_NCNAME}:)?(?:{_NCNAME}|\*)|\*)
  | (?P<symbol>::|\.\.|//|!=|<=|>=|[()\[\].@,|+\-=<>/*:])
    """,
    re.VERBOSE | re.UNICODE,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] in "\"'":
                raise XPathRefused(f"unterminated string literal at position {pos}")
            raise XPathRefused(f"unexpected character {text[pos]!r} at position {pos}")
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def check_expression(text: str, namespaces: Mapping[str, str], rules: FilterRules) -> None:
    """Raise :class:`XPathRefused` when ``text`` uses anything ``rules`` do not allow.

    ``namespaces`` are the prefix bindings the expression is compiled with; a prefixed
    function whose prefix is unbound is left to the compiler (it faults the same way).
    """
    if len(text) > rules.max_expression_length:
        raise XPathRefused(
            f"the expression is {len(text)} characters long; at most "
            f"{rules.max_expression_length} are accepted (filters.max_expression_length)"
        )
    tokens = _tokens(text)
    depth = 0
    after_operand_start = True  # no token yet: a name is an operand
    for i, (kind, value) in enumerate(tokens):
        operator = not after_operand_start and (
            (kind == "qname" and value in _OPERATOR_NAMES | {"*"})
            or (kind == "symbol" and value in _OPERATORS)
        )
        if kind == "symbol" and value in "([":
            depth += 1
            if depth > rules.max_nesting:
                raise XPathRefused(
                    f"parentheses and predicates nest deeper than {rules.max_nesting} "
                    "levels (filters.max_nesting)"
                )
        elif kind == "symbol" and value in ")]":
            depth = max(0, depth - 1)
        elif kind == "variable":
            raise XPathRefused(f"variable reference {value} (filters have no variables)")
        elif kind == "qname" and not operator and "*" not in value:
            following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
            previous = tokens[i - 1][1] if i else ""
            if following == "(" and previous not in ("::", "@"):
                _check_function(value, namespaces, rules)
        # XPath 1.0 §3.7: after these a name is an operand and "*" a name test
        after_operand_start = operator or (kind == "symbol" and value in _OPERAND_FOLLOWS)


#: symbols that are operators (``*`` and the operator names are decided by position)
_OPERATORS = frozenset({"/", "//", "|", "+", "-", "=", "!=", "<", "<=", ">", ">="})
#: symbols after which the next token starts an operand
_OPERAND_FOLLOWS = frozenset({"@", "::", "(", "[", ","}) | _OPERATORS
_OPERATOR_NAMES = frozenset({"and", "or", "mod", "div"})


def _check_function(name: str, namespaces: Mapping[str, str], rules: FilterRules) -> None:
    prefix, _, local = name.rpartition(":")
    if not prefix:
        if local in NODE_TYPES or local in CORE_FUNCTIONS:
            return
        raise XPathRefused(
            f"function {local}() is not an XPath 1.0 function (only the XPath 1.0 "
            "function library is available to filters)"
        )
    uri = namespaces.get(prefix)
    if uri is None:
        return  # the compiler refuses the unbound prefix
    if uri == EXSLT_REGEX and local in REGEX_FUNCTIONS:
        if rules.exslt_regex:
            return
        raise XPathRefused(
            f"the EXSLT regular-expression function {name}() is disabled on this broker "
            "(its evaluation time is unbounded; an operator can enable it with "
            "filters.exslt_regex)"
        )
    raise XPathRefused(
        f"extension function {name}() ({{{uri}}}{local}) is not available to filters "
        "(only the XPath 1.0 function library"
        + (" and the EXSLT regular-expression functions" if rules.exslt_regex else "")
        + ")"
    )
