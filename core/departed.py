"""Departed instances (cluster mode): what a gateway instance kept for itself on the
middleware outlives it when it leaves for good (scaled down, or started again under a
new id with an empty data directory).  On MQTT that is its dead-letter boxes, which
Mosquitto goes on handing a share of every destination's dead letters to
(docs/scale-out.md, "Dead-letter boxes").

:class:`DepartedSweep` runs with the orphan sweep (``core.orphans``), so on the instance
that runs periodic work once, every ``termination.orphan_sweep_interval``: it asks the
adapter to retire what the instances that are not live kept
(``Adapter.retire_departed``).  An instance is live while its heartbeat in the store's
instance table is younger than ``termination.orphan_grace``: one stalled for less (a
long pause, a SIGSTOP) keeps its boxes; one that left cleanly (its row is gone) or whose
heartbeat lapsed past the grace has departed.  One that comes back afterwards makes its
own again (the adapter's part).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from wsnmom.core.adapter import Adapter, AdapterError
from wsnmom.core.coordination import InstanceInfo

__all__ = ["DepartedSweep"]

log = logging.getLogger(__name__)


class DepartedSweep:
    """One retirement round per ``sweep`` call (see the module docstring).
    ``instances``: the store's instance table (``ClusterMember.instances``)."""

    def __init__(
        self,
        adapter: Adapter,
        instances: Callable[[], Sequence[InstanceInfo]],
        grace: float,
    ) -> None:
        self._adapter = adapter
        self._instances = instances
        #: seconds a heartbeat may lapse before its instance counts as departed
        self.grace = grace

    def live(self) -> set[str]:
        """The ids of the instances whose heartbeat is younger than the grace."""
        return {i.id for i in self._instances() if i.heartbeat_age < self.grace}

    def sweep(self) -> list[str]:
        """Retire what departed instances kept (the adapter's names, for the log);
        nothing when the store or the middleware cannot be read now (the next round
        tries again)."""
        try:
            return self._adapter.retire_departed(self.live)
        except AdapterError as exc:
            log.warning("retiring what departed instances kept failed: %s", exc)
        except Exception:
            # the store's instance table could not be read (asked by the adapter)
            log.warning("retiring what departed instances kept failed", exc_info=True)
        return []
