"""How ``make test`` hands the suite to its pytest-xdist workers (tests/conftest.py): work
units (a module, or tests/spark_bridge whole) ordered longest first by tests/durations.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import pytest

from tests.conftest import (
    DURATIONS,
    UNKNOWN_TEST_SECONDS,
    longest_first,
    seconds_per_test,
    work_unit,
)


@dataclass
class FakeItem:
    nodeid: str


def ids(items: list[Any]) -> list[str]:
    return [item.nodeid for item in items]


def test_a_module_is_a_unit_and_the_spark_directory_is_one() -> None:
    assert work_unit("tests/e2e/test_tls.py::test_x[1]") == "tests/e2e/test_tls.py"
    assert work_unit("tests/adapters/test_mqtt.py::TestA::test_b") == "tests/adapters/test_mqtt.py"
    assert work_unit("tests/spark_bridge/test_sink.py::test_a") == "tests/spark_bridge"
    assert work_unit("tests/spark_bridge/test_log.py::test_b") == "tests/spark_bridge"


def test_units_longest_first_each_in_its_own_order() -> None:
    items = [
        FakeItem("tests/a/test_short.py::t1"),
        FakeItem("tests/a/test_short.py::t2"),
        FakeItem("tests/spark_bridge/test_one.py::s1"),
        FakeItem("tests/b/test_long.py::l2"),
        FakeItem("tests/b/test_long.py::l1"),
        FakeItem("tests/spark_bridge/test_two.py::s2"),
        FakeItem("tests/c/test_unknown.py::u1"),
    ]
    known = {
        "tests/a/test_short.py": 1.0,
        "tests/b/test_long.py": 30.0,
        "tests/spark_bridge/test_one.py": 20.0,
        "tests/spark_bridge/test_two.py": 20.0,
    }
    ordered = longest_first(cast(list[pytest.Item], items), known)
    assert ids(ordered) == [
        # the Spark unit (40 s together) before the longest module (30 s)
        "tests/spark_bridge/test_one.py::s1",
        "tests/spark_bridge/test_two.py::s2",
        "tests/b/test_long.py::l2",
        "tests/b/test_long.py::l1",
        "tests/a/test_short.py::t1",
        "tests/a/test_short.py::t2",
        # unknown: UNKNOWN_TEST_SECONDS a test
        "tests/c/test_unknown.py::u1",
    ]
    assert UNKNOWN_TEST_SECONDS < 1.0


def test_a_module_the_file_lacks_counts_its_directorys_seconds_per_test() -> None:
    """A new two-test cluster module is estimated at the known cluster modules' 10 s a
    test: 20 s, before a known 15 s module (at 0.5 s a test it came last)."""
    items = [
        FakeItem("tests/e2e/test_known.py::k"),
        FakeItem("tests/cluster/test_new.py::n1"),
        FakeItem("tests/cluster/test_new.py::n2"),
        FakeItem("tests/cluster/test_old.py::o1"),
        FakeItem("tests/cluster/test_old.py::o2"),
        FakeItem("tests/cluster/test_old.py::o3"),
    ]
    known = {"tests/e2e/test_known.py": 15.0, "tests/cluster/test_old.py": 30.0}
    counts = {"tests/e2e/test_known.py": 1, "tests/cluster/test_new.py": 2}
    counts["tests/cluster/test_old.py"] = 3
    assert seconds_per_test(counts, known) == {"tests/e2e": 15.0, "tests/cluster": 10.0}
    ordered = longest_first(cast(list[pytest.Item], items), known)
    assert ids(ordered) == [
        "tests/cluster/test_old.py::o1",
        "tests/cluster/test_old.py::o2",
        "tests/cluster/test_old.py::o3",
        "tests/cluster/test_new.py::n1",
        "tests/cluster/test_new.py::n2",
        "tests/e2e/test_known.py::k",
    ]


def test_ties_are_broken_by_path_so_every_worker_collects_the_same_order() -> None:
    items = [FakeItem("tests/z/test_b.py::x"), FakeItem("tests/z/test_a.py::y")]
    ordered = longest_first(cast(list[pytest.Item], items), {})
    assert ids(ordered) == ["tests/z/test_a.py::y", "tests/z/test_b.py::x"]


def test_the_durations_file_names_modules_that_exist() -> None:
    known = json.loads(DURATIONS.read_text())
    root = DURATIONS.parent.parent
    assert known, "tests/durations.json is empty"
    missing = [module for module in known if not (root / module).is_file()]
    assert missing == [], "refresh it: scripts/test_durations.py (docs/testing.md)"
    assert all(isinstance(seconds, int | float) and seconds >= 0 for seconds in known.values())
