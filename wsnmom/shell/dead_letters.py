"""``wsnmom dead-letters list|show|replay|purge``: a wsnmom gateway's dead letters
(``/wsn/admin/api/dead-letters``, :mod:`.admin`; admins only)."""

from __future__ import annotations

import json
from urllib.parse import quote, urlencode

import click

from .admin import admin_call, print_table
from .common import broker_options


@click.group("dead-letters")
def dead_letters() -> None:
    """List, show, replay and purge the messages the gateway gave up on."""


def _id(text: str) -> str:
    return quote(text.strip(), safe="")


@dead_letters.command("list")
@click.option("--destination", "-d", metavar="NAME", help="Only this dead-letter destination.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@broker_options
def list_command(
    destination: str | None,
    as_json: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """List the dead letters the gateway holds, oldest first."""
    query = urlencode({"destination": destination}) if destination else ""
    data = admin_call(
        "GET", broker, "/dead-letters" + ("?" + query if query else ""), timeout, "the listing"
    )
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rows = [
        (
            d["id"],
            d["time"],
            d["reason"],
            d["attempts"],
            d["subscription"],
            d["topic"] or "-",
            (d["last_error"] or "-")[:60],
        )
        for d in data["dead_letters"]
    ]
    header = ("ID", "TIME", "REASON", "ATTEMPTS", "SUBSCRIPTION", "TOPIC", "LAST ERROR")
    print_table(header, rows, "dead letter")


@dead_letters.command("show")
@click.argument("letter_id", metavar="ID")
@broker_options
def show_command(
    letter_id: str, broker: str, ns_pairs: tuple[str, ...], soap11: bool, timeout: float
) -> None:
    """Show one dead letter, its context and its message (JSON)."""
    data = admin_call("GET", broker, f"/dead-letters/{_id(letter_id)}", timeout, "the dead letter")
    click.echo(json.dumps(data, indent=2))


@dead_letters.command("replay")
@click.argument("letter_ids", metavar="ID...", nargs=-1, required=True)
@click.option(
    "--to",
    "consumer",
    metavar="ADDRESS",
    help="Deliver to this consumer address (default: the original subscription).",
)
@broker_options
def replay_command(
    letter_ids: tuple[str, ...],
    consumer: str | None,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Re-deliver dead letters; each one delivered is removed."""
    body = {"consumer": consumer} if consumer else None
    for letter_id in letter_ids:
        path = f"/dead-letters/{_id(letter_id)}/replay"
        data = admin_call("POST", broker, path, timeout, "the replay", body)
        click.echo(f"replayed {letter_id} to {data.get('delivered_to')}")


@dead_letters.command("purge")
@click.argument("letter_ids", metavar="[ID...]", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every dead letter held.")
@click.option("--destination", "-d", metavar="NAME", help="With --all: only this destination.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@broker_options
def purge_command(
    letter_ids: tuple[str, ...],
    everything: bool,
    destination: str | None,
    yes: bool,
    broker: str,
    ns_pairs: tuple[str, ...],
    soap11: bool,
    timeout: float,
) -> None:
    """Remove dead letters for good: the ones named, or ``--all``."""
    if bool(letter_ids) == everything:
        raise click.UsageError("name dead letters or give --all (not both)")
    if not yes:
        what = "every dead letter" if everything else f"{len(letter_ids)} dead letter(s)"
        click.confirm(f"remove {what} for good?", abort=True, err=True)
    if everything:
        body = {"destination": destination} if destination else None
        data = admin_call("POST", broker, "/dead-letters/purge", timeout, "the purge", body)
        click.echo(f"purged {data.get('purged')} dead letter(s)")
        return
    for letter_id in letter_ids:
        path = f"/dead-letters/{_id(letter_id)}/purge"
        data = admin_call("POST", broker, path, timeout, "the purge")
        click.echo(f"purged {letter_id}: {data.get('purged')}")
