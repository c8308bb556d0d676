"""Columns from and to notification payloads.

``with_xpath(df, {"valve": "string(@id)", "state": "p:state"}, namespaces={"p": ...})``
adds one string column per XPath 1.0 expression, evaluated over each row's ``payload``
element (the context node, as for a MessageContent filter): namespace-aware, in Python
with lxml.  For payloads without namespaces Spark's own
``from_xml(payload, schema)`` parses a whole payload into a struct.

``xml_element(...)`` builds a payload column for the ``wsn_notify`` sink from other
columns, with Spark SQL expressions only (no Python per row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["with_xpath", "xml_element", "xpath_text"]


def xpath_text(result: Any) -> str | None:
    """An XPath 1.0 result as a string: a node-set gives its first node's string value
    (None when empty), a boolean ``true``/``false``, a number without a needless ``.0``."""
    if isinstance(result, list):
        if not result:
            return None
        first = result[0]
        if isinstance(first, str | bytes):
            return first.decode() if isinstance(first, bytes) else str(first)
        if hasattr(first, "itertext"):
            return "".join(first.itertext())
        return str(first)
    if isinstance(result, bool):
        return "true" if result else "false"
    if isinstance(result, float):
        return str(int(result)) if result.is_integer() else repr(result)
    return str(result)


def with_xpath(
    frame: DataFrame,
    columns: Mapping[str, str],
    namespaces: Mapping[str, str] | None = None,
    *,
    payload: str = "payload",
) -> DataFrame:
    """``frame`` with one more string column per ``name: XPath`` (null when the payload
    does not parse or the node-set is empty).  Invalid XPath raises at once.  A Python UDF
    (lxml; no pandas needed)."""
    from lxml import etree
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    ns = dict(namespaces or {})
    exprs = dict(columns)
    for name, text in exprs.items():
        try:
            etree.XPath(text, namespaces=ns)
        except etree.XPathSyntaxError as exc:
            raise ValueError(f"column {name}: invalid XPath {text!r}: {exc}") from exc
    result = StructType([StructField(name, StringType(), True) for name in exprs])
    compiled: dict[str, Any] = {}

    def evaluate(text: str | bytes | None) -> tuple[str | None, ...]:
        from wsnmom.core.codec import safe_parse

        if not compiled:
            for name, source in exprs.items():
                compiled[name] = etree.XPath(source, namespaces=ns, smart_strings=False)
        root = None
        if text is not None:
            try:
                root = safe_parse(text.encode() if isinstance(text, str) else bytes(text))
            except etree.XMLSyntaxError:
                root = None
        values: list[str | None] = []
        for xpath in compiled.values():
            try:
                values.append(None if root is None else xpath_text(xpath(root)))
            except etree.XPathError:
                values.append(None)
        return tuple(values)

    column = "__wsnmom_xpath"
    # a lambda: Spark reads a function's type hints as a request for a pandas UDF
    udf = F.udf(lambda text: evaluate(text), result, useArrow=False)
    return frame.withColumn(column, udf(F.col(payload))).select(
        *[F.col(f"`{c}`") for c in frame.columns],
        *[F.col(f"{column}.`{n}`").alias(n) for n in exprs],
    )


def _escaped(column: Column) -> Column:
    from pyspark.sql import functions as F

    text = column.cast("string")
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):
        text = F.regexp_replace(text, char, entity)
    return text


def xml_element(tag: str, namespace: str, fields: Mapping[str, Column | str]) -> Column:
    """A string column ``<ns:tag xmlns:ns="namespace"><ns:field>value</ns:field>…</ns:tag>``
    (values escaped; a null value leaves its element empty) for the sink's ``payload``."""
    from pyspark.sql import functions as F

    parts: list[Column] = [F.lit(f'<ns:{tag} xmlns:ns="{_attr(namespace)}">')]
    for name, value in fields.items():
        column = F.col(value) if isinstance(value, str) else value
        parts += [
            F.lit(f"<ns:{name}>"),
            F.coalesce(_escaped(column), F.lit("")),
            F.lit(f"</ns:{name}>"),
        ]
    parts.append(F.lit(f"</ns:{tag}>"))
    return F.concat(*parts)


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
