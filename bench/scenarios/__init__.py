"""The benchmark scenarios, in run order (see docs/performance.md for what each measures)."""

from __future__ import annotations

from bench.scenarios.base import Scenario
from bench.scenarios.delivery import Delivery
from bench.scenarios.fanout import FanOut
from bench.scenarios.follow import Follow
from bench.scenarios.ha import HighAvailability
from bench.scenarios.ha_scale import HighAvailabilityAtScale
from bench.scenarios.ingress import Ingress
from bench.scenarios.isolation import Isolation
from bench.scenarios.matching import Matching
from bench.scenarios.memory import Memory
from bench.scenarios.recovery import Recovery
from bench.scenarios.rejoin import Rejoin
from bench.scenarios.spark import SparkBridge
from bench.scenarios.startup import Startup

#: every scenario, in the order a full run executes them
SCENARIOS: tuple[type[Scenario], ...] = (
    Ingress,
    Delivery,
    Isolation,
    FanOut,
    Matching,
    Memory,
    Recovery,
    HighAvailability,
    HighAvailabilityAtScale,
    Rejoin,
    Follow,
    SparkBridge,
    Startup,
)

__all__ = ["SCENARIOS", "Scenario"]
