"""``wsnmom cluster status``: the instances of a cluster of gateways on one store, from
any one instance's admin API (:mod:`.admin`): id, address, version, last heartbeat, the
shards each delivers and how long its leases last (docs/scale-out.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from .admin import admin_call, print_table
from .common import broker_options

__all__ = ["cluster"]


def _age(value: object) -> str:
    return "-" if value is None else f"{float(str(value)):.1f}s"


def _shards(shards: list[int]) -> str:
    """``0-3,7,9-10``: consecutive shard numbers as ranges."""
    if not shards:
        return "-"
    parts: list[str] = []
    start = prev = shards[0]
    for shard in [*shards[1:], None]:
        if shard is not None and shard == prev + 1:
            prev = shard
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if shard is not None:
            start = prev = shard
    return ",".join(parts)


@click.group("cluster")
def cluster() -> None:
    """The gateways sharing one store (a wsnmom gateway's admin API)."""


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@broker_options
def cluster_status(
    as_json: bool, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """Every instance on the store: heartbeat age, shards held, lease left; then what the
    instance asked has done (leadership, renewals, failovers, the store's round trip)."""
    data: dict[str, Any] = admin_call("GET", broker, "/cluster", timeout, "the cluster's state")
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if data.get("error"):
        click.echo(f"warning: {data['error']}", err=True)
    rows = [
        (
            ("* " if i.get("this") else "") + str(i["id"]),
            i.get("address") or "-",
            i.get("version") or "-",
            _age(i.get("heartbeat_age")),
            len(i.get("shards", [])),
            _shards(list(i.get("shards", []))),
            _age(i.get("lease_left")),
        )
        for i in data.get("instances", [])
    ]
    print_table(
        ("INSTANCE", "ADDRESS", "VERSION", "HEARTBEAT", "OWNS", "SHARDS", "LEASE LEFT"),
        rows,
        "instance",
    )
    c = data["counts"]
    mode = "shared store" if data["shared"] else "single instance (SQLite store)"
    click.echo(
        f"{data['instance']}: {mode}, {len(data['held'])} of {data['shards']} shards, "
        f"{'leader' if data['leader'] else 'not the leader'}; renewals {c['renewals']}, "
        f"heartbeat failures {c['heartbeat_failures']}, shards taken {c['taken']}, "
        f"failovers {c['failovers']}, released {c['released']}, expired {c['expired']}, "
        f"store round trip {_age(c['store_seconds'])}, "
        f"longest follow {_age(c.get('follow_longest'))}, "
        f"follows failing {c.get('follow_failing', 0)}"
    )
