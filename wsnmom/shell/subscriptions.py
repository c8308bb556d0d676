"""``wsnmom subscriptions list|show|delete|pause|resume|purge``.

``list`` and ``purge`` use the gateway's admin API (``/wsn/admin/api/subscriptions``:
admins, see ``soap_frontend.identity``; :mod:`.admin`): WS-N has no operation that lists
subscriptions or drops their messages.  ``show``, ``delete``, ``pause`` and ``resume`` use
the standard operations (WS-ResourceProperties reads, Unsubscribe, Pause/ResumeSubscription),
so they work against any WS-N broker given a subscription's address; with a wsnmom gateway
an id is enough.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import click

from wsnmom.core.addresses import ResourceKind

from .admin import admin_call, print_table, purge_each
from .common import (
    broker_options,
    make_client,
    reporting,
    resource_address,
)

if TYPE_CHECKING:
    from wsnmom.client import Subscription


@click.group("subscriptions")
def subscriptions() -> None:
    """List, show, pause, resume, purge and delete subscriptions."""


def _topic_text(topic: dict[str, Any] | None) -> str:
    if not topic:
        return "(all)"
    text = str(topic["text"])
    for prefix, uri in topic.get("namespaces", {}).items():
        text = text.replace(f"{prefix}:", "{" + uri + "}")
    return text


def _count(value: object) -> str:
    return "?" if value is None else str(value)


@subscriptions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@click.option(
    "--search",
    "-s",
    metavar="WORDS",
    help="Only those whose id, consumer, topic or state contain every word (case-insensitive).",
)
@click.option(
    "--sort",
    type=click.Choice(
        [
            "created",
            "id",
            "consumer",
            "topic",
            "state",
            "backlog",
            "failures",
            "delivered",
            "terminates",
        ]
    ),
    default="created",
    show_default=True,
    help="Order of the list.",
)
@click.option("--desc", is_flag=True, help="Descending order.")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Skip this many.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many.")
@broker_options
def list_command(
    as_json: bool,
    search: str | None,
    sort: str,
    desc: bool,
    offset: int,
    limit: int | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """List the broker's live subscriptions with their backlog and delivery state (a wsnmom
    gateway: an admin's credentials, or without authentication its own host); searched,
    sorted and paged by the gateway."""
    query = {"q": search or "", "sort": sort, "order": "desc" if desc else "asc"}
    query.update(offset=str(offset), limit=str(limit) if limit else "")
    path = "/subscriptions?" + urlencode({k: v for k, v in query.items() if v})
    data = admin_call("GET", broker, path, timeout, "the listing")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rows = []
    for s in data["subscriptions"]:
        delivery = s.get("delivery") or {}
        failing = bool(delivery.get("failures"))
        rows.append(
            (
                s["id"],
                "failing" if failing else s["state"],
                s["consumer"] if not s.get("pull_point") else f"pull point {s['pull_point']}",
                _topic_text(s.get("topic")),
                _count(s.get("backlog")),
                _count(delivery.get("delivered")) if delivery else "-",
                _count(delivery.get("failures")) if delivery else "-",
                s.get("terminates") or "never",
            )
        )
    header = ("ID", "STATE", "CONSUMER", "TOPIC", "BACKLOG", "DELIVERED", "FAILURES", "ENDS")
    print_table(header, rows, "subscription")
    if len(rows) < data["count"]:
        click.echo(f"{data['count']} match, from {offset + 1} to {offset + len(rows)}", err=True)


@subscriptions.command("show")
@click.argument("subscription", metavar="ID|ADDRESS")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@broker_options
def show_command(
    subscription: str,
    as_json: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Show one subscription's properties (WS-ResourceProperties)."""
    address = resource_address(broker, ResourceKind.SUBSCRIPTION, subscription)
    with reporting(), make_client(broker, ns_pairs, soap11, timeout) as client:
        props = client.subscription(address).properties()
    consumer = props.consumer_reference
    fields: dict[str, Any] = {
        "address": address,
        "consumer": consumer.address if consumer is not None else None,
        "topic": str(props.topic) if props.topic is not None else None,
        "dialect": props.topic.effective_dialect if props.topic is not None else None,
        "message_content": props.message_content,
        "state": None if props.paused is None else ("paused" if props.paused else "active"),
        "use_raw": props.use_raw,
        "created": props.creation_time.isoformat() if props.creation_time else None,
        "terminates": props.termination_time.isoformat() if props.termination_time else None,
    }
    if as_json:
        click.echo(json.dumps(fields, indent=2))
        return
    for key, value in fields.items():
        if value is not None:
            click.echo(f"{key + ':':17} {value}")


@subscriptions.command("delete")
@click.argument("subscriptions_", metavar="ID|ADDRESS...", nargs=-1, required=True)
@broker_options
def delete_command(
    subscriptions_: tuple[str, ...],
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Unsubscribe one or more subscriptions."""
    from wsnmom.client import ClientError

    failed = 0
    with make_client(broker, ns_pairs, soap11, timeout) as client:
        for item in subscriptions_:
            sub: Subscription = client.subscription(
                resource_address(broker, ResourceKind.SUBSCRIPTION, item)
            )
            try:
                sub.unsubscribe()
            except ClientError as exc:
                failed += 1
                click.echo(f"{item}: {exc}", err=True)
            else:
                click.echo(f"deleted {sub.address}")
    click.echo(f"deleted {len(subscriptions_) - failed} of {len(subscriptions_)}", err=True)
    if failed:
        raise SystemExit(1)


def _each(
    items: tuple[str, ...],
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
    action: str,
) -> None:
    """Pause or resume each subscription; exit status 1 when any was refused."""
    from wsnmom.client import ClientError

    failed = 0
    with make_client(broker, ns_pairs, soap11, timeout) as client:
        for item in items:
            sub = client.subscription(resource_address(broker, ResourceKind.SUBSCRIPTION, item))
            try:
                sub.pause() if action == "paused" else sub.resume()
            except ClientError as exc:
                failed += 1
                click.echo(f"{item}: {exc}", err=True)
            else:
                click.echo(f"{action} {sub.address}")
    if failed:
        raise SystemExit(1)


@subscriptions.command("pause")
@click.argument("subscriptions_", metavar="ID|ADDRESS...", nargs=-1, required=True)
@broker_options
def pause_command(
    subscriptions_: tuple[str, ...],
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Pause subscriptions (PauseSubscription): their messages accumulate until resumed."""
    _each(subscriptions_, broker, ns_pairs, soap11, timeout, "paused")


@subscriptions.command("resume")
@click.argument("subscriptions_", metavar="ID|ADDRESS...", nargs=-1, required=True)
@broker_options
def resume_command(
    subscriptions_: tuple[str, ...],
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Resume subscriptions (ResumeSubscription): what accumulated is delivered in order."""
    _each(subscriptions_, broker, ns_pairs, soap11, timeout, "resumed")


@subscriptions.command("purge")
@click.argument("subscription_ids", metavar="ID...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_options
def purge_command(
    subscription_ids: tuple[str, ...],
    yes: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Drop every message waiting for these subscriptions (a wsnmom gateway's admin API)."""
    waiting = f"for {len(subscription_ids)} subscription(s)"
    purge_each(broker, subscription_ids, "subscriptions", waiting, yes, timeout)
