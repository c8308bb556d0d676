"""``wsnmom subscriptions peek``, ``wsnmom pull-points peek`` and ``wsnmom dead-letters
peek``: the first messages of a backlog, a pull point or the dead letters, printed as
``pull`` prints notifications and left where they are (the admin API's ``.../peek``,
:mod:`.admin`; ``core.peek`` says what each middleware allows).

Where the middleware cannot show its waiting messages without consuming them
(RabbitMQ), only those the gateway holds in memory are printed, and stderr says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import click
from lxml import etree

from .admin import admin_call
from .common import broker_options, format_option

__all__ = ["dead_letters_peek", "pull_points_peek", "render_peeked", "subscriptions_peek"]

F = TypeVar("F", bound=Callable[..., Any])

#: messages shown unless ``-n`` says otherwise (the admin API's default too)
DEFAULT_COUNT = 10


def _count_option(func: F) -> F:
    return click.option(
        "-n",
        "--count",
        type=click.IntRange(min=1, max=500),
        default=DEFAULT_COUNT,
        show_default=True,
        help="At most this many (oldest first).",
    )(func)


def _pretty(payload: str) -> str:
    try:
        element = etree.fromstring(payload.encode("utf-8"))
    except etree.XMLSyntaxError:
        return payload
    return etree.tostring(element, pretty_print=True, encoding="unicode").rstrip("\n")


def render_peeked(item: dict[str, Any], fmt: str) -> str:
    """One message of a peek (the admin API's JSON object): ``line`` TOPIC PAYLOAD on one
    line, ``json`` the object on one line, ``xml`` the payload indented."""
    if fmt == "json":
        return json.dumps(item, ensure_ascii=False)
    payload = str(item.get("payload") or "")
    if fmt == "xml":
        return _pretty(payload)
    return f"{item.get('topic') or '-'} {' '.join(payload.split())}"


def _print(data: dict[str, Any], items: list[dict[str, Any]], fmt: str, noun: str) -> None:
    for item in items:
        click.echo(render_peeked(item, fmt))
    click.echo(f"{len(items)} {noun}(s) shown, none consumed", err=True)
    if not data.get("complete", True):
        click.echo(f"only what the gateway holds in memory is shown: {data.get('note')}", err=True)
    elif data.get("note"):
        click.echo(str(data["note"]), err=True)


def _id(text: str) -> str:
    return quote(text.rstrip("/").rsplit("/", 1)[-1], safe="")


@click.command("peek")
@click.argument("subscription", metavar="ID|ADDRESS")
@_count_option
@format_option
@broker_options
def subscriptions_peek(
    subscription: str,
    count: int,
    fmt: str,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Print the first messages of a subscription's backlog without consuming them: those
    the gateway holds for delivery, then those waiting in the middleware (a wsnmom
    gateway's admin API)."""
    path = f"/subscriptions/{_id(subscription)}/peek?count={count}"
    data = admin_call("GET", broker, path, timeout, "the peek")
    _print(data, data["messages"], fmt, "message")


@click.command("peek")
@click.argument("pull_point", metavar="ID|ADDRESS")
@_count_option
@format_option
@broker_options
def pull_points_peek(
    pull_point: str,
    count: int,
    fmt: str,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Print the first messages GetMessages would hand out, without taking them (a wsnmom
    gateway's admin API)."""
    path = f"/pullpoints/{_id(pull_point)}/peek?count={count}"
    data = admin_call("GET", broker, path, timeout, "the peek")
    _print(data, data["messages"], fmt, "message")


def _letter(item: dict[str, Any]) -> dict[str, Any]:
    """A dead letter in the shape of a peeked message (its context kept beside)."""
    return {
        "message_id": item.get("message_id"),
        "timestamp": item.get("time"),
        "topic": item.get("topic"),
        "content_type": item.get("content_type"),
        "payload": item.get("body", ""),
        "payload_base64": item.get("body_base64"),
        "dead_letter": {
            k: item.get(k)
            for k in ("id", "destination", "subscription", "consumer", "reason", "attempts")
        }
        | {"last_error": item.get("last_error")},
    }


@click.command("peek")
@click.option("--destination", "-d", metavar="NAME", help="Only this dead-letter destination.")
@_count_option
@format_option
@broker_options
def dead_letters_peek(
    destination: str | None,
    count: int,
    fmt: str,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Print the first dead letters with their messages (the gateway holds them: nothing
    is consumed; ``replay`` and ``purge`` act on them)."""
    query = {"count": str(count)} | ({"destination": destination} if destination else {})
    data = admin_call("GET", broker, "/dead-letters/peek?" + urlencode(query), timeout, "the peek")
    _print(data, [_letter(d) for d in data["dead_letters"]], fmt, "dead letter")
