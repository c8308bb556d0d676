"""``wsnmom subscriptions list|show|delete``.

``list`` reads the gateway's admin API (``/wsn/admin/api/subscriptions``: admins, see
``soap_frontend.identity``): WS-N has no operation that lists subscriptions.  ``show``
and ``delete`` use the standard operations (WS-ResourceProperties reads, Unsubscribe), so
they work against any WS-N broker given a subscription's address; with a wsnmom gateway an
id is enough.
"""

from __future__ import annotations

import json
from typing import Any

import click
import requests

from wsnmom.client import ClientError, Subscription
from wsnmom.core.addresses import ResourceKind

from .common import (
    base_url,
    broker_options,
    credentials,
    make_client,
    reporting,
    resource_address,
    tls_options,
)


@click.group("subscriptions")
def subscriptions() -> None:
    """List, show and delete subscriptions."""


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
@broker_options
def list_command(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """List the broker's live subscriptions with their backlog and delivery state (a wsnmom
    gateway: an admin's credentials, or without authentication its own host)."""
    url = base_url(broker) + "/wsn/admin/api/subscriptions"
    given = credentials()
    try:
        with requests.Session() as http:
            if given is not None:
                if given.wsse is not None:
                    raise click.UsageError("the admin API takes --user/--password or --token")
                given.apply(http)
            tls = tls_options()
            resp = http.get(url, timeout=timeout, verify=tls["verify"], cert=tls["cert"])
    except requests.RequestException as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    if resp.status_code == 401:
        raise click.ClickException(
            f"{url} asks for an admin's credentials: give --token or --user/--password"
        )
    if resp.status_code == 403:
        raise click.ClickException(
            f"{url} refused the listing: it answers admins only (without authentication: "
            "clients on the gateway's own host)"
        )
    if resp.status_code != 200 or "json" not in resp.headers.get("Content-Type", ""):
        raise click.ClickException(
            f"{url} answered HTTP {resp.status_code}: listing subscriptions needs a wsnmom "
            "gateway (WS-N has no list operation)"
        )
    data = resp.json()
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
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"{len(rows)} subscription(s)", err=True)


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
