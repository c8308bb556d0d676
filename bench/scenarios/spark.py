"""Scenario 7, Spark bridge: not built yet; reported as not available until it exists."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from bench.middleware import Middleware
from bench.model import ScenarioResult
from bench.scenarios.base import Context, Scenario


def _bridge_present() -> bool:
    try:
        if importlib.util.find_spec("wsnmom.spark") is not None:
            return True
    except (ImportError, ValueError):
        pass
    for group in ("wsnmom.adapters", "wsnmom.bridges"):
        if any(ep.name == "spark" for ep in importlib.metadata.entry_points(group=group)):
            return True
    return False


class SparkBridge(Scenario):
    """Placeholder for the Spark bridge benchmark."""

    name = "spark"
    title = "Spark bridge"
    middlewares = ()
    needs_server = False

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        result.status = "not_available"
        if _bridge_present():
            result.reason = "a Spark bridge exists but this harness has no scenario for it yet"
        else:
            result.reason = "the Spark bridge is not built yet (no wsnmom.spark, no 'spark' plugin)"
