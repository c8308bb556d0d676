"""A component a test needs and cannot have: skipped on a developer's machine, a failure
under ``CI=true``.

A CI run that skips the tests of a missing broker, binary or client library would pass
without testing what it stands for, so under ``CI=true`` (also ``1`` or ``yes``, any case)
every such test fails instead.  This module is the one place of that rule:

* :func:`missing` skips, or fails under CI: the ``wsnmom_gateway`` fixture and the test
  suite's broker, browser, disk and HAProxy fixtures call it;
* registered as a pytest plugin (wsnmom's own suite lists it in ``pytest_plugins``), it
  turns the skip of ``pytest.importorskip`` — a test module's optional client library
  (``confluent_kafka``, ``paho.mqtt``, ``pika``, ``pyspark``...) that is not installed —
  into a failure under CI, at collection (a module's import) and in a test alike.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from typing import Any, NoReturn

import pytest

__all__ = [
    "missing",
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
    "under_ci",
]

#: how ``pytest.importorskip`` words the reason of its skip
IMPORT_SKIP = "could not import "
#: added to the reason of a skip turned into a failure
UNDER_CI = "(required under CI=true)"


def under_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this is a CI run (``CI`` set to ``true``, ``1`` or ``yes``)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in ("1", "true", "yes")


def missing(message: str) -> NoReturn:
    """Skip the current test because ``message`` is missing; fail it under CI."""
    if under_ci():
        pytest.fail(f"{message} {UNDER_CI}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def _import_skip(longrepr: Any) -> str | None:
    """The reason of a skip by ``pytest.importorskip`` (None for any other outcome)."""
    if not isinstance(longrepr, tuple) or len(longrepr) != 3:
        return None
    reason = str(longrepr[2]).removeprefix("Skipped: ")
    return reason if reason.startswith(IMPORT_SKIP) else None


def _fail_import_skip(report: pytest.CollectReport | pytest.TestReport, nodeid: str) -> None:
    """Under CI, turn a skip by ``importorskip`` into a failure that names ``nodeid``."""
    reason = _import_skip(report.longrepr) if report.skipped and under_ci() else None
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = f"{nodeid}: {reason} {UNDER_CI}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module skipped by ``importorskip`` at its import is a collection error under CI."""
    report = yield
    _fail_import_skip(report, collector.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test (or its fixture) skipped by ``importorskip`` fails under CI."""
    report = yield
    _fail_import_skip(report, item.nodeid)
    return report
