"""``wsnmom store``: look at a store and move one gateway's store into another.

``wsnmom store migrate --from sqlite:///... --to postgresql://...`` copies every
subscription, pull point, publisher registration, current message, upstream, intent (a
durable subscription whose record was never stored, ``core.orphans``) and recorded topic
(the topic set a cluster shares, ``core.topic_share``) from one store to
another, as it is the way from a single gateway to a cluster that shares a PostgreSQL
store.  The gateway must be stopped: a SQLite source (and a SQLite destination) is locked
for the copy exactly as a running gateway locks it, so a gateway that still runs on either
makes the command refuse.  The destination must be empty unless ``--merge`` is given (a
merge keeps a topic's later current message and refuses a pull point name or an upstream
name the destination gives another); the copy is checked afterwards (every record read
back equal) and the command exits non-zero when anything differs.  The copy marks the
destination until it has finished (``core.store_migration``): gateways refuse to start on
a half-copied store, and the same command run again carries on.  The
messages themselves stay where they are, in the middleware: point the new gateways at the
same middleware.

``wsnmom store info URL`` prints what a store holds.

The store modules are imported when a command of this group runs, not with the command
line (``wsnmom --help`` and the other commands do not need them).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from wsnmom.core.redaction import redact_url
from wsnmom.data_lock import DataDirInUse, StoreLock, lock_store

if TYPE_CHECKING:
    from wsnmom.core.model import NotificationMessage
    from wsnmom.core.store import Store

__all__ = ["StoreCounts", "copy_store", "count_records", "store"]


@dataclass(frozen=True)
class StoreCounts:
    """How many records of each kind a store holds (or a copy moved)."""

    subscriptions: int = 0
    pull_points: int = 0
    registrations: int = 0
    current_messages: int = 0
    #: upstreams added at run time (``wsnmom upstream add``)
    upstreams: int = 0
    #: intents: durable subscriptions whose record was never stored (``core.orphans``)
    intents: int = 0
    #: topics of the topic set a cluster shares (``core.topic_share``)
    topics: int = 0

    @property
    def total(self) -> int:
        """All records."""
        return (
            self.subscriptions
            + self.pull_points
            + self.registrations
            + self.current_messages
            + self.upstreams
            + self.intents
            + self.topics
        )


def count_records(target: Store) -> StoreCounts:
    """What ``target`` holds."""
    return StoreCounts(
        len(target.list_subscriptions()),
        len(target.list_pull_points()),
        len(target.list_registrations()),
        len(target.list_current_messages()),
        len(target.list_upstreams()),
        len(target.list_intents()),
        len(target.list_topics()),
    )


def copy_store(source: Store, destination: Store) -> StoreCounts:
    """Copy every record of ``source`` into ``destination`` (replacing records with the
    same ids) and check each one reads back equal; StoreError naming the first that does
    not."""
    from wsnmom.core.store import StoreError

    subscriptions = source.list_subscriptions()
    pull_points = source.list_pull_points()
    registrations = source.list_registrations()
    current = source.list_current_messages()
    upstreams = source.list_upstreams()
    # with their times: the sweep of the destination's gateways removes their durable
    # subscriptions once they are older than the grace (the middleware stays the same)
    intents = source.list_intents()
    topics = source.list_topics()
    # pull points first: a subscription may feed one, a registration may point at one
    for pp in pull_points:
        destination.put_pull_point(pp)
    for reg in registrations:
        destination.put_registration(reg)
    for sub in subscriptions:
        destination.put_subscription(sub)
    # a topic's current message is its last one: one the destination holds that was
    # published later (another gateway's, merged into) stays
    current = [m for m in current if not _newer_held(destination, m)]
    for message in current:
        destination.put_current_message(message)
    for data in upstreams:
        destination.put_upstream(str(data["name"]), data)
    for name, at in intents:
        destination.put_intent(name, at)
    # every recorded topic, without quotas.ad_hoc_topics: a migration keeps what was
    # accepted, as a restart does; the cluster's bound refuses new topics only
    destination.record_topics(topics)
    for pp in pull_points:
        if destination.get_pull_point(pp.id) != pp:
            raise StoreError(f"pull point {pp.id} did not read back equal")
    for reg in registrations:
        if destination.get_registration(reg.id) != reg:
            raise StoreError(f"registration {reg.id} did not read back equal")
    for sub in subscriptions:
        if destination.get_subscription(sub.id) != sub:
            raise StoreError(f"subscription {sub.id} did not read back equal")
    for message in current:
        assert message.topic is not None
        if destination.get_current_message(message.topic) != message:
            raise StoreError(f"the current message of {message.topic} did not read back equal")
    copied = {str(d["name"]): d for d in destination.list_upstreams()}
    for data in upstreams:
        if copied.get(str(data["name"])) != data:
            raise StoreError(f"upstream {data['name']} did not read back equal")
    copied_intents = dict(destination.list_intents())
    for name, at in intents:
        # SQLite keeps seconds as a float: equal to the millisecond
        back = copied_intents.get(name)
        if back is None or abs((back - at).total_seconds()) > 0.001:
            raise StoreError(f"the intent of {name} did not read back equal")
    recorded = set(destination.list_topics())
    for topic in topics:
        if topic not in recorded:
            raise StoreError(f"the topic {topic} did not read back")
    return StoreCounts(
        len(subscriptions),
        len(pull_points),
        len(registrations),
        len(current),
        len(upstreams),
        len(intents),
        len(topics),
    )


def _newer_held(destination: Store, message: NotificationMessage) -> bool:
    """Whether ``destination`` holds a current message of ``message``'s topic published
    after it."""
    assert message.topic is not None
    held = destination.get_current_message(message.topic)
    if held is None or held.published_at is None or message.published_at is None:
        return False
    return held.published_at > message.published_at


@click.group("store")
def store() -> None:
    """Look at a store; move a gateway's store into another (SQLite to PostgreSQL)."""


@store.command("migrate")
@click.option("--from", "source_url", required=True, help="The store to copy from.")
@click.option("--to", "destination_url", required=True, help="The store to copy into.")
@click.option("--merge", is_flag=True, help="Copy into a destination that already holds records.")
def migrate(source_url: str, destination_url: str, merge: bool) -> None:
    """Copy every record of one store into another, with the gateway stopped."""
    from wsnmom.core.store import StoreError

    if source_url == destination_url:
        raise click.UsageError("--from and --to name the same store")
    _require_source(source_url)
    locks = _lock(source_url, destination_url)
    marked = False
    try:
        source = _open(source_url)
        try:
            destination = _open(destination_url)
            try:
                resumed = _prepare(source, destination, source_url, destination_url, merge)
                marked = True
                counts = copy_store(source, destination)
                _finish(destination, source_url)
            finally:
                destination.close()
        finally:
            source.close()
    except (StoreError, KeyboardInterrupt) as exc:
        if not marked and isinstance(exc, StoreError):
            raise click.ClickException(str(exc)) from None
        if not marked:
            raise
        raise click.ClickException(
            f"{str(exc) or 'interrupted'}; the copy into {redact_url(destination_url)} did not "
            "finish: run the same command again to carry on (gateways refuse to start on "
            "that store until it has)"
        ) from None
    finally:
        for held in locks:
            held.release()
    if resumed:
        click.echo(f"carried on the copy from {redact_url(source_url)} that had not finished")
    click.echo(
        f"copied {counts.subscriptions} subscriptions, {counts.pull_points} pull points, "
        f"{counts.registrations} registrations and {counts.current_messages} current "
        f"messages{f', plus {counts.upstreams} upstreams' if counts.upstreams else ''}"
        f"{f', plus {counts.intents} intents' if counts.intents else ''}"
        f"{f', plus {counts.topics} topics' if counts.topics else ''} "
        f"from {redact_url(source_url)} to {redact_url(destination_url)}"
    )


@store.command("info")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(url: str, as_json: bool) -> None:
    """What a store holds, and the last `store migrate` into it (whether it finished)."""
    from wsnmom.core.store import StoreError
    from wsnmom.core.store_migration import migration

    try:
        opened = _open(url)
        try:
            counts = count_records(opened)
            mark = migration(opened)
        finally:
            opened.close()
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        copied = None if mark is None else {"from": mark.source, "finished": mark.finished}
        json.dump({"store": redact_url(url), **asdict(counts), "migration": copied}, sys.stdout)
        click.echo()
        return
    click.echo(f"store: {redact_url(url)}")
    for name, value in asdict(counts).items():
        click.echo(f"{name.replace('_', ' ')}: {value}")
    if mark is not None:
        state = "finished" if mark.finished else "NOT finished: run it again to finish it"
        click.echo(f"migrated from: {mark.source} ({state})")


def _lock(source_url: str, destination_url: str) -> list[StoreLock]:
    """Lock both stores as a running gateway locks its own (SQLite): a gateway that still
    runs on either makes the command refuse, naming it."""
    locks: list[StoreLock] = []
    try:
        for url, doing in (
            (source_url, "migrating its store"),
            (destination_url, "migrating into the store it serves"),
        ):
            try:
                locks.append(lock_store(url))
            except DataDirInUse as exc:
                raise click.ClickException(f"{exc}: stop that gateway before {doing}") from None
    except BaseException:
        for held in locks:
            held.release()
        raise
    return locks


def _require_source(url: str) -> None:
    """A SQLite source must exist: opening a path that names none would make an empty store
    there, and the copy of nothing would look like a finished migration."""
    from wsnmom.core.store import StoreError
    from wsnmom.core.store_sqlite import sqlite_path

    if not url.startswith("sqlite:"):
        return
    try:
        path = sqlite_path(url)
    except StoreError as exc:
        raise click.UsageError(str(exc)) from None
    if path != ":memory:" and not Path(path).is_file():
        raise click.ClickException(
            f"no store at {path}: check --from (a gateway's store is store.db in its data "
            "directory, unless its store_url names another)"
        )


def _prepare(
    source: Store, destination: Store, source_url: str, destination_url: str, merge: bool
) -> bool:
    """Check that ``destination`` may take the copy, carry the source's adapter and mark the
    copy under way (``core.store_migration``); whether it carries on an unfinished one."""
    from wsnmom.core.store_binding import ADAPTER_KEY, StoreOfAnotherAdapter, bind_store
    from wsnmom.core.store_migration import MIGRATION_KEY, Migration, migration

    origin, target = redact_url(source_url), redact_url(destination_url)
    _refuse_live_instances(source, source_url)
    half = migration(source)
    if half is not None and not half.finished:  # a copy of part of a third store
        raise click.ClickException(
            f"{origin} holds part of a copy from {half.source} that did not finish; finish "
            f"it first: wsnmom store migrate --from {half.source} --to {origin}"
        )
    mark = migration(destination)
    resumed = mark is not None and not mark.finished
    if mark is not None and not mark.finished and mark.source != origin:
        raise click.ClickException(
            f"{target} holds part of a copy from {mark.source} that did not finish; finish "
            f"it first: wsnmom store migrate --from {mark.source} --to {target}"
        )
    held = count_records(destination)
    if held.total and not resumed:
        if not merge:
            again = mark is not None and mark.source == origin
            raise click.ClickException(
                f"{target} already holds a finished copy of {origin}: copying it again would "
                "bring back what the gateways serving it removed since and undo their "
                "changes; pass --merge to copy it anyway"
                if again
                else f"{target} already holds {held.total} records; pass --merge to copy "
                "into it anyway"
            )
        _refuse_name_clashes(source, destination, target)
    adapter = source.get_meta(ADAPTER_KEY)
    if adapter is not None:
        try:  # the records' messages are in that adapter's middleware
            bind_store(destination, adapter)
        except StoreOfAnotherAdapter as exc:
            raise click.ClickException(
                f"{target}: {exc}, and those of {origin} are in {adapter!r}'s: migrate into "
                "a store of their own"
            ) from None
    destination.set_meta(MIGRATION_KEY, Migration(origin, False).encode())
    return resumed


#: seconds since its last heartbeat within which an instance of a shared source counts as
#: running (the heartbeat comes every second by default; a killed one's row stays behind)
LIVE_HEARTBEAT = 60.0


def _refuse_live_instances(source: Store, source_url: str) -> None:
    """A shared (PostgreSQL) source has no lock file: refuse it while instances serve it,
    as a running gateway's SQLite store is refused (the copy would miss their writes)."""
    from wsnmom.core.store_url import shared_store

    if not shared_store(source_url):
        return
    live = [
        i
        for i in source.coordination("wsnmom-store-migrate").instances()
        if i.heartbeat_age < LIVE_HEARTBEAT
    ]
    if live:
        shown = ", ".join(f"{i.id} at {i.address}" for i in live[:5])
        raise click.ClickException(
            f"{redact_url(source_url)} is served by {len(live)} running gateway instances "
            f"(a heartbeat within {LIVE_HEARTBEAT:g} s: {shown}): stop them before migrating "
            "their store"
        )


def _refuse_name_clashes(source: Store, destination: Store, target: str) -> None:
    """A pull point's name finds one pull point (re-attaching by name): refuse a merge that
    would give a name taken in ``destination`` to a second one, or replace an upstream of
    ``destination`` by another of the same name."""
    taken = {pp.name: pp.id for pp in destination.list_pull_points() if pp.name}
    clashes = sorted(
        str(pp.name)
        for pp in source.list_pull_points()
        if pp.name and taken.get(pp.name, pp.id) != pp.id
    )
    if clashes:
        shown = ", ".join(clashes[:5]) + (f" and {len(clashes) - 5} more" if clashes[5:] else "")
        raise click.ClickException(
            f"{target} holds other pull points named {shown}: a name finds one pull point; "
            "destroy one of each pair (DestroyPullPoint) before merging"
        )
    upstreams = {str(d["name"]): d for d in destination.list_upstreams()}
    differing = sorted(
        str(d["name"]) for d in source.list_upstreams() if upstreams.get(str(d["name"]), d) != d
    )
    if differing:
        raise click.ClickException(
            f"{target} holds other upstreams named {', '.join(differing)}: the copy would "
            "replace them; remove one of each pair (wsnmom upstream remove) before merging"
        )


def _finish(destination: Store, source_url: str) -> None:
    """Mark the copy finished: gateways may start on ``destination``."""
    from wsnmom.core.store_migration import MIGRATION_KEY, Migration

    destination.set_meta(MIGRATION_KEY, Migration(redact_url(source_url), True).encode())


def _open(url: str) -> Store:
    from wsnmom.core.store import StoreError
    from wsnmom.core.store_url import open_store

    try:
        return open_store(url)
    except StoreError as exc:
        raise click.ClickException(f"cannot open {redact_url(url)}: {exc}") from None
