"""Shared pytest configuration: fixture modules are plugins so every test folder sees them."""

import importlib.util
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# A property's deadline and "too slow" checks time the machine, not the code: the suite runs
# on two workers on two cores next to brokers, where one example may wait 300 ms for a core.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

_FIXTURE_MODULES = (
    "tests.fixtures.brokers",
    "tests.fixtures.tansu",
    "tests.fixtures.mosquitto",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
    "tests.fixtures.browser",
)

# first: under CI=true, a test module's missing client library (pytest.importorskip) fails
# the run (and the fixture modules import it: a plugin imported before is not rewritten)
pytest_plugins = ["wsnmom.testing.components"]
pytest_plugins += [name for name in _FIXTURE_MODULES if importlib.util.find_spec(name)]
pytest_plugins.append("pytester")  # tests/testing runs the wsnmom pytest plugin in a project


def pytest_configure(config: pytest.Config) -> None:
    """Before xdist starts its workers (in the controller only): write the bytecode cache
    every child process reads, and pytest's cache of the rewritten test modules that every
    worker reads while it collects (tests/support/bytecode.py says why)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        from tests.support.bytecode import compile_sources, rewrite_test_modules

        compile_sources()
        rewrite_test_modules(config)


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


#: descriptors open at the end of each pytest-xdist worker, by worker id
_WORKER_DESCRIPTORS: dict[str, int] = {}
#: the suite gateways' starts of each worker, forked and as processes of their own
_WORKER_STARTS: dict[str, dict[str, int]] = {}
#: threads alive at the end of each pytest-xdist worker, by worker id
_WORKER_THREADS: dict[str, int] = {}


def _open_descriptors() -> int | None:
    """The descriptors this process holds (None where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its count of open descriptors to the controller."""
    from tests.support.zygote_client import started

    output = getattr(session.config, "workeroutput", None)
    count = _open_descriptors()
    if output is not None and count is not None:
        output["open_descriptors"] = count
    if output is not None:
        output["gateway_starts"] = dict(started)
        output["live_threads"] = threading.active_count()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: optional without it
def pytest_testnodedown(node: Any, error: Any) -> None:
    count = getattr(node, "workeroutput", {}).get("open_descriptors")
    if count is not None:
        _WORKER_DESCRIPTORS[str(node.gateway.id)] = int(count)
    starts = getattr(node, "workeroutput", {}).get("gateway_starts")
    if starts is not None:
        _WORKER_STARTS[str(node.gateway.id)] = dict(starts)
    threads = getattr(node, "workeroutput", {}).get("live_threads")
    if threads is not None:
        _WORKER_THREADS[str(node.gateway.id)] = int(threads)


def _report_descriptors(terminalreporter: Any) -> None:
    """One line: the descriptors each test process held at its end.  Tests that leak them
    (adapters, clients, pull buffers kept past their test) show here long before a process
    reaches 1024, where ``select()`` (paho's own loop, the test suite's native clients)
    fails."""
    counts = dict(_WORKER_DESCRIPTORS)
    if not counts and not hasattr(terminalreporter.config, "workerinput"):
        own = _open_descriptors()
        if own is not None:
            counts["main"] = own
    if counts:
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        terminalreporter.write_line(f"open descriptors at the end: {listed}")
    threads = dict(_WORKER_THREADS)
    if not threads and not hasattr(terminalreporter.config, "workerinput"):
        threads["main"] = threading.active_count()
    if threads:
        listed = ", ".join(f"{k} {v}" for k, v in sorted(threads.items()))
        terminalreporter.write_line(f"live threads at the end: {listed}")


def _report_gateway_starts(terminalreporter: Any) -> None:
    """One line: the suite gateways (``PatientGateway``) each test process started, forked
    from its pre-imported parent or as processes of their own (tests/support/zygote.py)."""
    from tests.support.zygote_client import started

    starts = dict(_WORKER_STARTS)
    if not starts and not hasattr(terminalreporter.config, "workerinput"):
        starts["main"] = dict(started)
    listed = ", ".join(
        f"{k} {v.get('forked', 0)} forked + {v.get('process', 0)} processes"
        for k, v in sorted(starts.items())
        if sum(v.values())
    )
    if listed:
        terminalreporter.write_line(f"suite gateway starts: {listed}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The descriptors left open (:func:`_report_descriptors`); one line per capability
    the run skipped tests for, with the adapters that lack it (a skip whose reason is a
    capability name: ``wsnmom.testing.conformance.require``)."""
    _report_descriptors(terminalreporter)
    _report_gateway_starts(terminalreporter)
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


#: per-test timeout of a test marked ``slow`` or ``spark`` that sets none itself (the
#: default for every other test is ``timeout`` in pyproject.toml).  Spark's: a JVM and the
#: Python workers of the bridge's sources start inside them, and at load 33 the first Spark
#: test of a run (63 s on a quiet machine) ran past 180 s, which also broke the shared
#: session for every Spark test after it
SLOW_TIMEOUT = 600


#: the seconds each test module took (``scripts/test_durations.py`` writes it)
DURATIONS = Path(__file__).with_name("durations.json")
#: seconds per test of a module ``durations.json`` does not know, in a directory where it
#: knows no module either (elsewhere: that directory's seconds per test, see
#: :func:`seconds_per_test`)
UNKNOWN_TEST_SECONDS = 0.5
#: directories whose modules one pytest-xdist worker runs together: every module of
#: tests/spark_bridge needs the worker's SparkSession, a JVM of its own (tens of seconds of
#: CPU to start, then hundreds of MB), which two workers would both start
ONE_WORKER_DIRECTORIES = ("tests/spark_bridge/",)


def work_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs as a whole (``make test``: ``--dist loadfile``): a
    test module, or a directory of :data:`ONE_WORKER_DIRECTORIES`."""
    module = nodeid.split("::", 1)[0]
    for directory in ONE_WORKER_DIRECTORIES:
        if module.startswith(directory):
            return directory.rstrip("/")
    return module


def seconds_per_test(counts: dict[str, int], known: dict[str, float]) -> dict[str, float]:
    """Per directory, the seconds a test of its modules that ``known`` has took on
    average: the estimate for a module of that directory that ``known`` lacks.  A new
    cluster module (a few tests of tens of seconds each) then counts as one, not as
    ``UNKNOWN_TEST_SECONDS`` a test, which put it last, where one worker ran it alone
    while the other had finished."""
    seconds: dict[str, float] = {}
    tests: dict[str, int] = {}
    for module, count in counts.items():
        if module in known:
            directory = module.rsplit("/", 1)[0]
            seconds[directory] = seconds.get(directory, 0.0) + known[module]
            tests[directory] = tests.get(directory, 0) + count
    return {d: seconds[d] / tests[d] for d in seconds if tests[d]}


def longest_first(items: list[pytest.Item], known: dict[str, float]) -> list[pytest.Item]:
    """``items`` with whole work units (:func:`work_unit`) ordered by their expected
    seconds, longest first, each unit's tests kept in their order.  A module's seconds
    come from ``known`` or, when it is not there, its number of tests times its
    directory's seconds per test (:func:`seconds_per_test`; ``UNKNOWN_TEST_SECONDS``
    where ``known`` has none of the directory); ties in the units' path order (every
    worker must collect the same order)."""
    counts: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        counts[module] = counts.get(module, 0) + 1
    rates = seconds_per_test(counts, known)
    units: dict[str, float] = {}
    for module, count in counts.items():
        rate = rates.get(module.rsplit("/", 1)[0], UNKNOWN_TEST_SECONDS)
        seconds = known.get(module, rate * count)
        unit = work_unit(module)
        units[unit] = units.get(unit, 0.0) + seconds
    return sorted(items, key=lambda item: (-units[work_unit(item.nodeid)], work_unit(item.nodeid)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: optional without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with :func:`work_unit` as the unit (a module, or a directory
    that one worker runs whole)."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist ships no type information: its scheduler is Any to mypy
    class WorkUnitScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        long = item.get_closest_marker("slow") or item.get_closest_marker("spark")
        if long and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
    # On pytest-xdist workers (``make test``: ``--dist loadfile --no-loadscope-reorder``),
    # the work units are handed out in this order, so the longest start first and the two
    # workers finish together.  xdist's own order (most tests first) put modules of few
    # long tests (Spark, broker restarts, clusters) last, where one worker ran them alone.
    if hasattr(config, "workerinput") and DURATIONS.is_file():
        known = json.loads(DURATIONS.read_text())
        items[:] = longest_first(items, {str(k): float(v) for k, v in known.items()})


@pytest.fixture(autouse=True)
def _throttled_logs_forgotten() -> None:
    """Each test starts with the product's throttled log lines forgotten (refusals, auth
    failures, invalid requests: one line per kind per 10 s for the whole process), so a
    test that reads a line is not blind to it because an earlier test of its worker wrote
    one (``test_topic_share`` failed so after ``test_topic_bound``)."""
    from wsnmom.core.guard import refusals
    from wsnmom.soap_frontend.auth import _failures
    from wsnmom.soap_frontend.faults import invalid_requests

    for throttled in (refusals, _failures, invalid_requests):
        throttled.reset()
