"""Cluster mode on a store that fences position writes: the cursors' positions kept by
core (``Adapter.positions_kept_by``), the backend's own position store (Kafka: a consumer
group per cursor) as a mirror and a fallback.

:class:`KeptPositions` is the engine's ``PositionStore`` then.  Core's keeper is the
truth: a cursor's saved positions are its rows there, written by one statement that lands
only while this instance still holds the cursor's shard at the epoch it holds it with
(``save_fenced``: the names refused come back with why, and the engine treats them as a refusal of
``may_save``).  After an accepted save the same positions are written to the backend's
store, best effort, so the middleware's tools still show each subscription's lag; that
copy is read only for a cursor the keeper holds nothing of yet (where a new subscription
starts, written by whichever instance made it, ``save``; or a store upgraded from a
version that kept positions only in the middleware).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from wsnmom.core.adapter import PositionKeeper

from .backend import PositionStore, StreamId

__all__ = ["KeptPositions"]

log = logging.getLogger(f"{__package__}.engine")


class KeptPositions:
    """``PositionStore`` over core's keeper and the backend's store (see the module
    docstring)."""

    def __init__(self, keeper: PositionKeeper, mirror: PositionStore) -> None:
        self.keeper = keeper
        self.mirror = mirror

    def load(self) -> dict[str, dict[StreamId, int]]:
        """The mirror's positions, replaced by the keeper's for every name it holds."""
        out = self.mirror.load()
        out.update(self.keeper.load_all())
        return out

    def load_one(self, name: str) -> dict[StreamId, int] | None:
        """The keeper's positions of ``name``; the mirror's when it holds none."""
        kept = self.keeper.load([name]).get(name)
        if kept:
            return dict(kept)
        return self.mirror.load_one(name)

    def save(self, changes: Mapping[str, Mapping[StreamId, int]]) -> None:
        """Unfenced: where new cursors start, written by the instance that makes them
        (which need not hold their shard; nobody delivers them yet), into the mirror,
        which is read while the keeper holds nothing of them."""
        self.mirror.save(changes)

    def save_fenced(self, changes: Mapping[str, Mapping[StreamId, int]]) -> dict[str, str]:
        """Keep the positions (one fenced statement); the names refused, with why.  The accepted
        ones are then written to the mirror (a failure there is logged, not raised: the
        keeper holds them)."""
        refused = self.keeper.save(changes)
        accepted = {n: p for n, p in changes.items() if n not in refused}
        if accepted:
            try:
                self.mirror.save(accepted)
            except Exception as exc:
                log.info("the mirror of %d cursors' positions not written: %s", len(accepted), exc)
        return refused

    def delete(self, names: Iterable[str]) -> None:
        """Forget these cursors in the keeper, then in the mirror."""
        names = list(names)
        self.keeper.delete(names)
        self.mirror.delete(names)
