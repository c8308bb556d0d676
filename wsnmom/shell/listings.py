"""``wsnmom pull-points list|show|purge``, ``wsnmom registrations list`` and ``wsnmom
topics list``: a wsnmom gateway's resources with their counts and rates, from its admin
API (:mod:`.admin`).  ``--json`` prints the API's answer."""

from __future__ import annotations

import json
from typing import Any

import click

from .admin import admin_call, print_table, purge_each
from .common import broker_options

__all__ = ["pull_points", "registrations", "topics_list_command"]


def _count(value: object) -> str:
    return "?" if value is None else str(value)


def _expression(topic: dict[str, Any]) -> str:
    """A topic expression of the API in Clark notation (prefixes replaced by their URI)."""
    text = str(topic["text"])
    for prefix, uri in topic.get("namespaces", {}).items():
        text = text.replace(f"{prefix}:", "{" + uri + "}")
    return text


def _json_or(data: Any, as_json: bool) -> bool:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    return as_json


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")


@click.group("pull-points")
def pull_points() -> None:
    """List, show and purge the gateway's pull points (a wsnmom gateway's admin API)."""


@pull_points.command("list")
@json_option
@broker_options
def pull_points_list(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """Every live pull point with the messages waiting in it and what feeds it."""
    data = admin_call("GET", broker, "/pullpoints", timeout, "the listing")
    if _json_or(data, as_json):
        return
    rows = [
        (
            p["id"],
            _count(p.get("waiting")),
            len(p.get("feeding", [])),
            p.get("name") or "-",
            p.get("terminates") or "never",
        )
        for p in data["pull_points"]
    ]
    print_table(("ID", "WAITING", "FEEDING", "NAME", "ENDS"), rows, "pull point")


@pull_points.command("show")
@click.argument("pull_point", metavar="ID|ADDRESS")
@json_option
@broker_options
def pull_points_show(
    pull_point: str,
    as_json: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """One pull point: address, messages waiting, the subscriptions feeding it."""
    pid = pull_point.rstrip("/").rsplit("/", 1)[-1]
    data = admin_call("GET", broker, f"/pullpoints/{pid}", timeout, "the pull point")
    if _json_or(data, as_json):
        return
    for key in ("id", "address", "name", "waiting", "created", "terminates"):
        value = data.get(key)
        if key == "terminates" and value is None:
            value = "never"
        if value is not None:
            click.echo(f"{key + ':':12} {value}")
    for sid in data.get("feeding", []):
        click.echo(f"{'fed by:':12} {sid}")


@pull_points.command("purge")
@click.argument("pull_point_ids", metavar="ID...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_options
def pull_points_purge(
    pull_point_ids: tuple[str, ...],
    yes: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Drop every message waiting in these pull points."""
    waiting = f"in {len(pull_point_ids)} pull point(s)"
    purge_each(broker, pull_point_ids, "pullpoints", waiting, yes, timeout)


@click.group("registrations")
def registrations() -> None:
    """The gateway's publisher registrations (a wsnmom gateway's admin API)."""


@registrations.command("list")
@json_option
@broker_options
def registrations_list(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """Every live publisher registration: publisher, topics, demand."""
    data = admin_call("GET", broker, "/registrations", timeout, "the listing")
    if _json_or(data, as_json):
        return
    rows = []
    for r in data["registrations"]:
        demand = "no"
        if r.get("demand"):
            demand = "paused" if r.get("demand_paused") else "yes"
        topics = " ".join(_expression(t) for t in r.get("topics", [])) or "(any)"
        rows.append(
            (r["id"], r.get("publisher") or "-", topics, demand, r.get("terminates") or "never")
        )
    print_table(("ID", "PUBLISHER", "TOPICS", "DEMAND", "ENDS"), rows, "registration")


@click.command("list")
@json_option
@broker_options
def topics_list_command(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """The topics a wsnmom gateway published on since it started: messages and rate
    (messages per second over the last 10 s), with their namespace."""
    data = admin_call("GET", broker, "/topics", timeout, "the listing")
    if _json_or(data, as_json):
        return
    rows = [
        (t["topic"], t["messages"], f"{t['rate']:g}/s", t.get("last") or "-")
        for t in data["topics"]
    ]
    print_table(("TOPIC", "MESSAGES", "RATE", "LAST"), rows, "topic")
