"""A store that ``wsnmom store migrate`` copies into: the mark of a copy under way.

The copy writes record after record (``wsnmom.store_command.copy_store``); killed half way
(SIGKILL, a server that stops answering), it leaves a store that holds part of another
gateway's records.  A gateway started on it would serve that part as the whole: the
subscriptions not copied yet would be lost to their subscribers, and a later copy would
replace what the gateway had changed since.  So the copy marks the destination before its
first write (meta key :data:`MIGRATION_KEY`: the source, not finished) and marks it
finished once every record read back equal; a gateway refuses to start on a store whose
copy did not finish (:func:`refuse_unfinished`), and the same command run again carries on
(the copy replaces records with the same ids: nothing is doubled).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from wsnmom.core.store import Store, StoreError

__all__ = ["MIGRATION_KEY", "Migration", "MigrationUnfinished", "migration", "refuse_unfinished"]

#: the meta key of the mark: JSON ``{"from": source URL (redacted), "finished": bool}``
MIGRATION_KEY = "migration"


@dataclass(frozen=True)
class Migration:
    """The last copy into a store: where from, and whether it finished."""

    source: str
    finished: bool

    def encode(self) -> str:
        """The meta value."""
        return json.dumps({"from": self.source, "finished": self.finished})


def migration(store: Store) -> Migration | None:
    """The mark of the last copy into ``store``, or None (never copied into)."""
    value = store.get_meta(MIGRATION_KEY)
    if value is None:
        return None
    try:
        data = json.loads(value)
        return Migration(str(data["from"]), bool(data["finished"]))
    except (ValueError, TypeError, KeyError):
        return Migration("an unknown store", False)


class MigrationUnfinished(StoreError):
    """The store holds part of a copy that did not finish."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(
            f"a `wsnmom store migrate` from {source} into this store did not finish (the store "
            f"holds part of that gateway's records); run the same `wsnmom store migrate "
            f"--from {source} --to ...` again to finish it before starting a gateway on it"
        )


def refuse_unfinished(store: Store) -> None:
    """Raise :class:`MigrationUnfinished` when a copy into ``store`` did not finish (a
    gateway's start)."""
    mark = migration(store)
    if mark is not None and not mark.finished:
        raise MigrationUnfinished(mark.source)
