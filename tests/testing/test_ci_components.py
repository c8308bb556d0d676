"""Under ``CI=true`` a missing component fails the run, never skips it
(:mod:`wsnmom.testing.components`): a test module's ``pytest.importorskip`` of a client
library that is not installed, at import or inside a test, and a fixture's
:func:`~wsnmom.testing.components.missing`.  Without CI they are skips."""

from __future__ import annotations

import pytest

from wsnmom.testing.components import under_ci

#: a project of three tests, each missing something the way the suite's modules do
PROJECT = {
    "test_at_import": """
import pytest
pytest.importorskip("wsnmom_no_such_client_library")

def test_never_runs():
    pass
""",
    "test_in_a_test": """
import pytest

def test_imports_late():
    pytest.importorskip("wsnmom_no_such_client_library.sub")
""",
    "test_fixture": """
import pytest
from wsnmom.testing.components import missing

@pytest.fixture
def broker():
    missing("no broker available (local: not installed)")

def test_needs_a_broker(broker):
    pass

def test_skips_for_another_reason():
    pytest.skip("a capability the adapter lacks")
""",
}


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(**PROJECT)
    return pytester.runpytest(
        "-p",
        "wsnmom.testing.components",
        "-p",
        "no:randomly",
        "--continue-on-collection-errors",
        # this process imported the plugin before pytester's run: not rewritten, as meant
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
    )


def test_under_ci_every_missing_component_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = _run(pytester)
    result.assert_outcomes(failed=1, errors=2, skipped=1)
    out = result.stdout.str()
    assert "could not import 'wsnmom_no_such_client_library'" in out
    assert "could not import 'wsnmom_no_such_client_library.sub'" in out
    assert out.count("(required under CI=true)") >= 3, out


def test_elsewhere_a_missing_component_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = _run(pytester)
    result.assert_outcomes(skipped=4)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("", False), ("false", False)],
)
def test_what_counts_as_ci(value: str, expected: bool) -> None:
    assert under_ci({"CI": value}) is expected
    assert under_ci({}) is False
