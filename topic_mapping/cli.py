"""``wsnmom topics``: translate topic expressions and check topic namespace documents.

wsnmom topics translate 'p:a//c' --ns p=urn:x --to mqtt --root urn:x=org/wsn
wsnmom topics check my-namespace.xml
"""

from __future__ import annotations

from pathlib import Path

import click

from .dialects import CONCRETE, FULL, ONVIF_CONCRETE_SET, SIMPLE, XPATH, parse_topic_expression
from .errors import TopicError
from .namespaces import load_topic_namespace
from .syntax import BUILTIN_SYNTAXES
from .translate import NamespaceRoots, translate

_DIALECT_NAMES = {
    "simple": SIMPLE,
    "concrete": CONCRETE,
    "full": FULL,
    "xpath": XPATH,
    "concreteset": ONVIF_CONCRETE_SET,
}


def _pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not rest:
            raise click.BadParameter(f"expected {what}, got {value!r}")
        out[key] = rest
    return out


@click.group("topics")
def topics() -> None:
    """WS-Topics expressions and namespaces: translation to native patterns, validation."""


@topics.command("translate")
@click.argument("expression")
@click.option(
    "--dialect",
    "-d",
    default="full",
    show_default=True,
    help="simple, concrete, full, xpath or a dialect URI",
)
@click.option("--ns", "ns_pairs", multiple=True, metavar="PREFIX=URI", help="namespace prefix")
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Choice(sorted(BUILTIN_SYNTAXES)),
    help="target middleware syntax",
)
@click.option(
    "--root",
    "root_pairs",
    multiple=True,
    metavar="URI=ROOT",
    help="native root of a namespace (exchange, MQTT or Kafka prefix)",
)
def translate_command(
    expression: str,
    dialect: str,
    ns_pairs: tuple[str, ...],
    target: str,
    root_pairs: tuple[str, ...],
) -> None:
    """Print the native pattern(s) for EXPRESSION, whether they are exact, and the
    residual in-process filter otherwise."""
    namespaces: dict[str | None, str] = {k: v for k, v in _pairs(ns_pairs, "PREFIX=URI").items()}
    syntax = BUILTIN_SYNTAXES[target]
    try:
        roots = NamespaceRoots.for_syntax(_pairs(root_pairs, "URI=ROOT"), syntax)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--root") from exc
    try:
        expr = parse_topic_expression(
            expression, _DIALECT_NAMES.get(dialect.lower(), dialect), namespaces
        )
        result = translate(expr, syntax, roots)
    except TopicError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    root_label = "exchange" if not syntax.root_in_name else "root"
    for p in result.patterns:
        flag = "" if p.exact else "  (wider than the expression)"
        click.echo(f"pattern: {p.pattern}  [{root_label}: {p.root or '-'}]{flag}")
    click.echo(f"exact: {'yes' if result.exact else 'no'}")
    click.echo(f"residual: {result.residual.describe() if result.residual else 'none'}")


@topics.command("check")
@click.argument("namespace_doc", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_command(namespace_doc: Path) -> None:
    """Validate the WS-Topics TopicNamespace (or 1.0 TopicSpace) document NAMESPACE_DOC."""
    try:
        ns = load_topic_namespace(namespace_doc.read_bytes())
    except TopicError as exc:
        raise click.ClickException(f"{namespace_doc}: invalid: {exc}") from exc
    count = len(ns.topics())
    click.echo(f"{namespace_doc}: valid: {ns.target_namespace} ({count} topics)")
