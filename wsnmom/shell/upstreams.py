"""``wsnmom upstream add|list|remove``: the remote producers a wsnmom gateway relays into
its middleware (``/wsn/admin/api/upstreams``, :mod:`.admin`; admins only;
docs/federation.md)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import click

from .admin import admin_call, print_table
from .common import broker_options


@click.group("upstream")
def upstream() -> None:
    """Add, list and remove the remote producers the gateway relays (upstreams)."""


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        prefix, sep, uri = value.partition("=")
        if not sep or not prefix or not uri:
            raise click.BadParameter(f"expected PREFIX=URI, got {value!r}", param_hint=option)
        pairs[prefix] = uri
    return pairs


@upstream.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--topic", "-t", metavar="EXPR", help="Topic expression (default: every topic).")
@click.option(
    "--dialect",
    default="concrete",
    show_default=True,
    help="simple, concrete, full, concrete_set (ONVIF) or a dialect URI.",
)
@click.option(
    "--topic-ns", "topic_ns", multiple=True, metavar="PREFIX=URI", help="A prefix of --topic."
)
@click.option("--content", metavar="XPATH", help="MessageContent filter, at the producer.")
@click.option(
    "--content-ns", "content_ns", multiple=True, metavar="PREFIX=URI", help="Of --content."
)
@click.option("--namespace", metavar="URI", help="Namespace the relayed topics appear under.")
@click.option("--remote-user", help="User name at the producer (HTTP Basic, or --remote-wsse).")
@click.option(
    "--remote-password",
    envvar="WSNMOM_UPSTREAM_PASSWORD",
    help="Its password (also $WSNMOM_UPSTREAM_PASSWORD).",
)
@click.option(
    "--remote-token",
    envvar="WSNMOM_UPSTREAM_TOKEN",
    help="A bearer token at the producer (also $WSNMOM_UPSTREAM_TOKEN).",
)
@click.option(
    "--remote-wsse",
    type=click.Choice(["digest", "text"]),
    help="Send the remote user and password as a WS-Security UsernameToken.",
)
@click.option(
    "--mode",
    type=click.Choice(["push", "pull", "onvif-pull"]),
    help="push (the producer sends Notify), pull (WS-N CreatePullPoint/GetMessages at the "
    "producer) or onvif-pull (URL is an ONVIF device's event service: "
    "CreatePullPointSubscription/PullMessages).  Default: push.",
)
@click.option(
    "--pull",
    is_flag=True,
    help="Pull mode: take from a pull point at the producer (it cannot reach the gateway).",
)
@click.option("--lifetime", metavar="DURATION", help="Lifetime asked (PT10M, or seconds).")
@broker_options
def add_command(
    name: str,
    url: str,
    topic: str | None,
    dialect: str,
    topic_ns: tuple[str, ...],
    content: str | None,
    content_ns: tuple[str, ...],
    namespace: str | None,
    remote_user: str | None,
    remote_password: str | None,
    remote_token: str | None,
    remote_wsse: str | None,
    mode: str | None,
    pull: bool,
    lifetime: str | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Relay the producer at URL into the middleware, as upstream NAME (kept in the
    gateway's store; the gateway subscribes there at once).  --user/--password/--token
    are the gateway admin's credentials; --remote-* are the producer's."""
    if pull and mode not in (None, "pull"):
        raise click.BadParameter(f"--pull contradicts --mode {mode}", param_hint="--pull")
    mode = mode or ("pull" if pull else "push")
    body: dict[str, Any] = {"name": name, "url": url, "dialect": dialect, "mode": mode}
    optional: dict[str, Any] = {
        "topic": topic,
        "namespaces": _pairs(topic_ns, "--topic-ns") or None,
        "message_content": content,
        "message_content_namespaces": _pairs(content_ns, "--content-ns") or None,
        "namespace": namespace,
        "user": remote_user,
        "password": remote_password,
        "token": remote_token,
        "wsse": remote_wsse,
        "lifetime": lifetime,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    admin_call("POST", broker, "/upstreams", timeout, "adding the upstream", body)
    click.echo(f"added upstream {name}")


@upstream.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@broker_options
def list_command(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """List the upstreams, their state and what they relayed."""
    data = admin_call("GET", broker, "/upstreams", timeout, "the listing")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rows = [
        (
            u["name"],
            u["state"],
            u["mode"],
            u["url"],
            u["topic"] or "-",
            u["relayed"],
            u["subscribes"],
            u["expires"] or "-",
            (u["error"] or "-")[:60],
        )
        for u in data["upstreams"]
    ]
    header = (
        "NAME",
        "STATE",
        "MODE",
        "URL",
        "TOPIC",
        "RELAYED",
        "SUBSCRIBES",
        "EXPIRES",
        "LAST ERROR",
    )
    print_table(header, rows, "upstream")


@upstream.command("remove")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@broker_options
def remove_command(
    names: tuple[str, ...], broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """End the subscription at each upstream named and forget it."""
    for name in names:
        path = f"/upstreams/{quote(name, safe='')}/remove"
        admin_call("POST", broker, path, timeout, "removing the upstream")
        click.echo(f"removed upstream {name}")
