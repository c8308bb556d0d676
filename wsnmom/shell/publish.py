"""``wsnmom notify``: publish notifications from the shell.

The payload comes from the argument, a file or stdin; with ``--lines`` every non-empty line
is one notification (sent in batches, with progress on stderr).  A payload that is one XML
element is sent as it is; anything else is wrapped as the gateway wraps native messages
(``wsnmom:NativeMessage``, ``--content-type``; without it the type native ingress gives a
body without one: ``application/json`` for JSON, ``text/plain`` for other text,
``application/octet-stream`` for bytes that are not UTF-8).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import click
from lxml import etree

from wsnmom.adapters.native import sniff_content_type
from wsnmom.core.addresses import ResourceKind
from wsnmom.core.app_headers import HeaderRefused, validated

from .common import (
    broker_options,
    dialect_option,
    make_client,
    progress,
    progress_done,
    reporting,
    resource_address,
    topic_expression,
)

if TYPE_CHECKING:
    from wsnmom.client import TopicExpression


def _payload(data: bytes, content_type: str | None) -> etree._Element:
    from wsnmom.client.model import payload_element, text_payload

    if content_type is None or content_type.endswith("xml"):
        try:
            return payload_element(data)
        except ValueError:
            if content_type is not None:
                raise
    if data.endswith(b"\n"):  # the newline a file or `echo` ends with is not content
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    # without --content-type, the type the gateway gives a native message without one
    return text_payload(data, content_type or sniff_content_type(data))


def _headers(pairs: tuple[str, ...]) -> dict[str, str] | None:
    """``--header NAME=VALUE`` options as application headers (checked as the gateway
    checks them, so a mistake is a usage error, not a fault)."""
    if not pairs:
        return None
    parsed: list[tuple[str, str]] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--header")
        parsed.append((name.strip(), value))
    try:
        return dict(validated(parsed))
    except HeaderRefused as exc:
        raise click.BadParameter(str(exc), param_hint="--header") from None


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield line


@click.command("notify")
@click.argument("topic")
@click.argument("payload", required=False)
@click.option(
    "-f",
    "--file",
    "source",
    type=click.File("rb"),
    help="Read the payload from FILE ('-': stdin). Without PAYLOAD or --file, stdin is read.",
)
@click.option("-l", "--lines", is_flag=True, help="One notification per non-empty input line.")
@click.option(
    "--content-type",
    help="Content type of a non-XML payload (default text/plain; an XML type sends the "
    "payload as XML and refuses anything else).",
)
@click.option("--producer", metavar="URL", help="ProducerReference address to send.")
@click.option(
    "-H",
    "--header",
    "header_pairs",
    metavar="NAME=VALUE",
    multiple=True,
    help="An application header for every notification sent (repeatable); consumers get "
    "it, native ones as a middleware header.",
)
@click.option(
    "--to",
    metavar="ADDRESS|ID",
    help="Send the Notify to a pull point (address or id) or another consumer instead of "
    "the broker.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Notifications per Notify request with --lines.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress or summary on stderr.")
@dialect_option
@broker_options
def notify_command(
    topic: str,
    payload: str | None,
    source: IO[bytes] | None,
    lines: bool,
    content_type: str | None,
    producer: str | None,
    header_pairs: tuple[str, ...],
    to: str | None,
    batch: int,
    quiet: bool,
    dialect: str | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Publish a notification on TOPIC.

    \b
    wsnmom notify --ns t=urn:example t:sensors/room1 '<temp>21.5</temp>'
    wsnmom notify '{urn:example}sensors/room1' 'plain text is wrapped'
    wsnmom notify --ns t=urn:example t:log --lines -f events.txt
    wsnmom notify -H traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 \\
        '{urn:example}sensors/room1' '<temp>21.5</temp>'
    """
    from wsnmom.client import ClientError, Message

    headers = _headers(header_pairs)
    if payload is not None and source is not None:
        raise click.UsageError("give the payload as an argument or with --file, not both")
    if payload is None and source is None:
        if sys.stdin.isatty():
            raise click.UsageError("no payload: give PAYLOAD, --file FILE or pipe it in")
        source = sys.stdin.buffer
    with reporting(), make_client(broker, ns_pairs, soap11, timeout) as client:
        expr: TopicExpression | None = topic_expression(topic, dialect, client.namespaces)
        target = resource_address(broker, ResourceKind.PULL_POINT, to) if to else None
        if source is None:
            assert payload is not None
            chunks: Iterator[bytes] = iter([payload.encode("utf-8")])
        elif lines:
            chunks = _lines(source)
        else:
            chunks = iter([source.read()])
        messages = (Message(_payload(c, content_type), expr, producer, headers) for c in chunks)
        started = time.monotonic()
        done = [0]

        def report(sent: int) -> None:
            done[0] = sent
            if not quiet and lines:
                progress(f"sent {sent} notification(s)")

        try:
            sent = client.notify_many(messages, to=target, batch_size=batch, progress=report)
        except ValueError as exc:
            if "no messages" in str(exc):
                raise click.UsageError("the input holds no notification") from exc
            raise
        except ClientError:
            if lines and not quiet:
                progress_done()
            click.echo(f"{done[0]} notification(s) were sent before the error", err=True)
            raise
        if lines and not quiet:
            progress_done()
        if not quiet:
            elapsed = max(time.monotonic() - started, 1e-6)
            rate = f", {sent / elapsed:.0f}/s" if sent > 1 else ""
            click.echo(f"sent {sent} notification(s) in {elapsed:.2f}s{rate}", err=True)
