"""No test sleeps and then asserts that something did not happen (docs/testing.md,
"Barriers").

Such a test passes whenever the code under test is slower than the nap: a broken
Unsubscribe or Pause goes unnoticed on a loaded machine.  This guard reads every test
module (and the shipped test kits in ``wsnmom/testing``) and fails, listing the sites,
when a function calls ``time.sleep`` (or ``sleep``) outside a loop and asserts an absence
after it: ``not ...``, ``... not in ...``, ``== 0``, ``== []`` (or another empty literal),
``is None``.  A sleep inside a loop paces a poll or a sender and is left alone.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "tests", ROOT / "wsnmom" / "testing")

#: "path::function" -> why its sleep is not a wait for an absence.  Only sleeps whose
#: absence assertions do not depend on the nap belong here; each needs its reason.
ALLOWED: dict[str, str] = {
    # the nap lets the engine save its positions (every 0.2 s) before the broker is
    # killed: a slower save makes the duplicate check fail, never pass
    "tests/adapters/test_kafka_outage.py::test_broker_killed_and_restarted_with_its_data_loses_nothing": "precondition",  # noqa: E501
    # the nap precedes a presence check (the batch still waits for PUBACKs); the absence,
    # `not caller.is_alive()`, follows a join of the caller
    "tests/adapters/test_mqtt_publisher.py::test_a_waiting_batch_fails_at_once_when_the_connection_is_lost": "presence",  # noqa: E501
    # the nap lets wall-clock time pass until the 2 s subscription has expired; what
    # follows are synchronous queries, and every delivery is checked against a sentinel
    "tests/e2e/test_crash_restart.py::test_state_and_notifications_survive_a_crash": "clock",
    # the naps are exposure windows of normal traffic under attack: every request made
    # in them was answered (or failed) before its outcome is asserted
    "tests/security/test_connections.py::test_slow_header_clients_do_not_starve_normal_requests": "window",  # noqa: E501
    "tests/security/test_https_connections.py::test_slow_tls_clients_do_not_starve_normal_requests": "window",  # noqa: E501
}

_EMPTY = (ast.List, ast.Tuple, ast.Dict, ast.Set)


def _is_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "sleep") or (
        isinstance(func, ast.Name) and func.id == "sleep"
    )


def _is_empty_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in (0, None, "", b"") and node.value is not False
    if isinstance(node, ast.Dict):
        return not node.keys
    if isinstance(node, _EMPTY):
        return not node.elts  # type: ignore[union-attr]
    return False


def asserts_absence(test: ast.AST) -> bool:
    """Whether an assert's expression claims that something is not there."""
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return True
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.NotIn):
                    return True
                if isinstance(op, ast.Is) and _is_empty_literal(right):
                    return True
                if isinstance(op, ast.Eq) and _is_empty_literal(right):
                    return True
    return False


def _body(node: ast.AST, in_loop: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """The nodes of a function (not of the functions and classes inside it), each with
    whether it is inside a loop."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield child, in_loop
        yield from _body(child, in_loop or isinstance(child, ast.For | ast.While))


def sites(source: str, label: str) -> list[str]:
    """``label::function: sleep at line N, then absence at line M`` for each offender."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        nodes = list(_body(function))
        naps = [n.lineno for n, in_loop in nodes if _is_sleep(n) and not in_loop]  # type: ignore[attr-defined]
        if not naps:
            continue
        absences = [
            n.lineno
            for n, _ in nodes
            if isinstance(n, ast.Assert) and n.lineno > naps[0] and asserts_absence(n.test)
        ]
        if absences:
            found.append(
                f"{label}::{function.name}: sleep at line {naps[0]}, "
                f"then an absence asserted at line {absences[0]}"
            )
    return found


@functools.cache
def _scan() -> list[str]:
    found: list[str] = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if "sleep(" in source:  # parse only what can hold a nap
                found += sites(source, path.relative_to(ROOT).as_posix())
    return found


def test_no_test_sleeps_before_asserting_an_absence() -> None:
    offenders = [s for s in _scan() if _key(s) not in ALLOWED]
    assert offenders == [], (
        "these tests sleep, then assert that something did not happen; publish a sentinel "
        "after the message under test and wait for it instead (docs/testing.md, "
        "Barriers):\n" + "\n".join(offenders)
    )


def test_every_allowed_site_still_exists() -> None:
    """An allow-list entry whose sleep is gone is removed, so the list stays honest."""
    flagged = {_key(s) for s in _scan()}
    assert sorted(set(ALLOWED) - flagged) == []


def _key(site: str) -> str:
    """``path::function`` of a site."""
    return site.split(": ", 1)[0]


def test_the_guard_finds_the_pattern_and_spares_polls() -> None:
    source = """
import time

def test_unsubscribe(consumer):
    unsubscribe()
    time.sleep(0.5)
    assert consumer.messages() == []

def test_pause(consumer):
    pause()
    sleep(1)
    assert not consumer.messages()

def test_poll(consumer):
    while not consumer.messages():
        time.sleep(0.05)
    assert consumer.messages() is not None

def test_barrier(consumer, witness):
    unsubscribe()
    witness.wait_for_sentinel()
    assert consumer.messages() == []
"""
    assert sites(source, "x.py") == [
        "x.py::test_unsubscribe: sleep at line 6, then an absence asserted at line 7",
        "x.py::test_pause: sleep at line 11, then an absence asserted at line 12",
    ]
