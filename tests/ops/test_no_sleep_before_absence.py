"""No test sleeps and then asserts that something did not happen (docs/testing.md,
"Barriers").

Such a test passes whenever the code under test is slower than the nap: a broken
Unsubscribe or Pause goes unnoticed on a loaded machine.  This guard reads every test
module (and the shipped test kits in ``wsnmom/testing``) and fails, listing the sites,
when a function calls ``time.sleep`` (or ``sleep``) outside a loop and asserts an absence
after it: ``not ...``, ``... not in ...``, ``== 0``, ``== []`` (or another empty literal),
``is None``, ``....empty()``.  A sleep inside a loop paces a poll or a sender and is left
alone.

A wait that is expected to time out is the same nap in another shape, and is flagged
wherever it is: ``assert not X.wait(...)`` (or any call with a ``timeout``, negated or
compared with ``False``/``None``/an empty literal), and ``pytest.raises(Empty)`` or
``pytest.raises(TimeoutError)`` around a timed call (``q.get(timeout=...)``).
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
    # the nap is the length of a SIGSTOP (longer than RabbitMQ's heartbeat, a
    # precondition); what follows waits for the child's answer, and `is None` is one of
    # the right answers (a depth whose connection is not back yet), not an absence
    "tests/adapters/test_rabbitmq_fence.py::test_a_depth_query_right_after_a_sigcont_answers": "precondition",  # noqa: E501
    # the nap lets wall-clock time pass until the 2 s subscription has expired; what
    # follows are synchronous queries, and every delivery is checked against a sentinel
    "tests/e2e/test_crash_restart.py::test_state_and_notifications_survive_a_crash": "clock",
    # the naps are exposure windows of normal traffic under attack: every request made
    # in them was answered (or failed) before its outcome is asserted
    "tests/security/test_connections.py::test_slow_header_clients_do_not_starve_normal_requests": "window",  # noqa: E501
    "tests/security/test_https_connections.py::test_slow_tls_clients_do_not_starve_normal_requests": "window",  # noqa: E501
    # timed waits that must time out: the tests are about the timeout itself, and nothing
    # that could arrive exists (every message sent was taken, nothing completes the call)
    "tests/client/test_consumer.py::test_iterator_stops_after_quiet_or_count": "timeout api",
    "tests/adapters/test_rabbitmq_completion.py::test_timeout_raises_timeout_error_and_a_later_result_still_arrives": "timeout api",  # noqa: E501
    # the gateway closed the 13th connection (read to its end first, the barrier), so it
    # has decided on all twelve before; a closed socket would read b"" at once
    "tests/security/test_https_connections.py::test_connection_limit": "barrier before",
    # a pull's own timeout under test: an empty pull returns after it, not before
    "wsnmom/testing/conformance_delivery.py::test_empty_pull_returns_after_timeout": "timeout api",
    "tests/core/test_pull_buffer_mutants.py::test_pull_waits_for_the_first_message_up_to_the_timeout": "timeout api",  # noqa: E501
    # in process and synchronous: the feed's only other message (filtered) is in the
    # buffer already, and nothing else pushes
    "tests/core/test_pull_buffer_mutants.py::test_only_filtered_messages_waiting_is_an_empty_buffer": "synchronous",  # noqa: E501
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


#: calls that block until something comes or their time runs out (and ``wait*``, ``poll*``)
_WAITS = frozenset({"get", "join", "acquire", "result", "recv", "pull"})
#: exceptions that mean "nothing came in time"
_TIMEOUTS = frozenset({"Empty", "TimeoutError"})


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _is_wait(name: str | None) -> bool:
    return name is not None and (name in _WAITS or name.startswith(("wait", "poll")))


def _is_timed_wait(node: ast.AST) -> bool:
    """A waiting call given a time: a ``timeout``, or ``X.wait(seconds)``."""
    if not isinstance(node, ast.Call) or not _is_wait(_name(node.func)):
        return False
    if any(k.arg == "timeout" for k in node.keywords):
        return True
    return _name(node.func) == "wait" and bool(node.args)


def _is_nothing(node: ast.AST) -> bool:
    """``False``, ``None`` or an empty collection (not ``0`` or ``b""``: an exit status, a
    closed connection's end)."""
    if isinstance(node, ast.Constant):
        return node.value is None or node.value is False
    return isinstance(node, (*_EMPTY, ast.Dict)) and _is_empty_literal(node)


def asserts_a_timed_out_wait(test: ast.AST) -> bool:
    """``not WAIT``, ``WAIT is False``/``None``, ``WAIT == []``: the wait must run out."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _is_timed_wait(test.operand)
    if isinstance(test, ast.Compare) and _is_timed_wait(test.left):
        return any(
            isinstance(op, ast.Is | ast.Eq) and _is_nothing(right)
            for op, right in zip(test.ops, test.comparators, strict=True)
        )
    if isinstance(test, ast.BoolOp):
        return any(asserts_a_timed_out_wait(v) for v in test.values)
    return False


def awaits_a_timeout(with_: ast.With) -> bool:
    """``with pytest.raises(Empty | TimeoutError): ...a timed call...``"""
    expects = any(
        isinstance(item.context_expr, ast.Call)
        and _name(item.context_expr.func) == "raises"
        and item.context_expr.args
        and _name(item.context_expr.args[0]) in _TIMEOUTS
        for item in with_.items
    )
    if not expects:
        return False
    return any(
        _is_timed_wait(node) or (isinstance(node, ast.Call) and _is_wait(_name(node.func)))
        for statement in with_.body
        for node in ast.walk(statement)
    )


def asserts_absence(test: ast.AST) -> bool:
    """Whether an assert's expression claims that something is not there."""
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return True
        if isinstance(node, ast.Call) and _name(node.func) == "empty" and not node.args:
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
        timed_out = [
            n.lineno
            for n, _ in nodes
            if (isinstance(n, ast.Assert) and asserts_a_timed_out_wait(n.test))
            or (isinstance(n, ast.With) and awaits_a_timeout(n))
        ]
        if timed_out:
            found.append(
                f"{label}::{function.name}: an absence awaited as a wait that times out "
                f"at line {timed_out[0]}"
            )
            continue
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
            if "sleep(" in source or "wait" in source or "raises(" in source:
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


def test_the_guard_finds_waits_that_must_time_out() -> None:
    source = """
import queue

def test_event(outbound):
    expire()
    assert not outbound.wait(lambda: bool(outbound.attempts), timeout=0.3)

def test_pull(handle):
    assert handle.pull(5, timeout=0.3) == []

def test_queue(q):
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)

def test_flag(done):
    assert done.wait(0.5) is False

def test_nap_then_empty(q):
    time.sleep(0.2)
    assert q.empty()

def test_presence(proc, sock, done):
    assert proc.wait(15) == 0
    assert read_all(sock, timeout=10) == b""
    assert done.wait(5)
    assert not done.is_set()
    with pytest.raises(ValueError):
        q.get(timeout=0.2)
"""
    assert sites(source, "x.py") == [
        "x.py::test_event: an absence awaited as a wait that times out at line 6",
        "x.py::test_pull: an absence awaited as a wait that times out at line 9",
        "x.py::test_queue: an absence awaited as a wait that times out at line 12",
        "x.py::test_flag: an absence awaited as a wait that times out at line 16",
        "x.py::test_nap_then_empty: sleep at line 19, then an absence asserted at line 20",
    ]
