"""Shared pytest configuration: fixture modules are plugins so every test folder sees them."""

import importlib.util
from typing import Any

import pytest

_FIXTURE_MODULES = (
    "tests.fixtures.brokers",
    "tests.fixtures.mosquitto",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
    "tests.fixtures.browser",
)

pytest_plugins = [name for name in _FIXTURE_MODULES if importlib.util.find_spec(name)]
pytest_plugins.append("pytester")  # tests/testing runs the wsnmom pytest plugin in a project


def _capability_names() -> set[str]:
    """Every capability an adapter declares (``Capabilities`` fields, ``syntax.*`` too)."""
    from dataclasses import fields

    from wsnmom.core.adapter import Capabilities
    from wsnmom.topic_mapping.syntax import WildcardSyntax

    names = {f.name for f in fields(Capabilities)}
    return names | {f"syntax.{f.name}" for f in fields(WildcardSyntax)}


def _adapter_of(nodeid: str) -> str:
    """The adapter a test ran on, from its id: ``[param]``, or the kit's ``TestXConformance``
    class, or the ``test_x_...`` module."""
    if nodeid.endswith("]"):
        return nodeid[nodeid.rindex("[") + 1 : -1].split("-")[0]
    parts = nodeid.split("::")
    if len(parts) > 2 and parts[1].startswith("Test"):
        return parts[1].removeprefix("Test").removesuffix("Conformance") or parts[1]
    return parts[0].rsplit("/", 1)[-1].removeprefix("test_").split("_")[0]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per capability the run skipped tests for, with the adapters that lack it
    (a skip whose reason is a capability name: ``wsnmom.testing.conformance.require``)."""
    names = _capability_names()
    lacking: dict[str, dict[str, int]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if not isinstance(longrepr, tuple) or len(longrepr) != 3:
            continue
        reason = str(longrepr[2]).removeprefix("Skipped: ").strip()
        if reason in names:
            adapters = lacking.setdefault(reason, {})
            adapter = _adapter_of(report.nodeid)
            adapters[adapter] = adapters.get(adapter, 0) + 1
    if not lacking:
        return
    terminalreporter.section("capability skips (capability: adapters that lack it, tests)")
    for capability in sorted(lacking):
        adapters = lacking[capability]
        listed = ", ".join(f"{a} ({n})" for a, n in sorted(adapters.items()))
        terminalreporter.write_line(f"{capability}: {listed}")


#: per-test timeout of a test marked ``slow`` that sets none itself (the default for every
#: other test is ``timeout`` in pyproject.toml)
SLOW_TIMEOUT = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
