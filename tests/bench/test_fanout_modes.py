"""``WSNMOM_BENCH_FANOUT`` chooses the halves of the fan-out scenario."""

from __future__ import annotations

import pytest

from bench.scenarios.fanout import _modes


@pytest.mark.parametrize(
    ("value", "modes"),
    [
        (None, ("push", "pull")),
        ("pull", ("pull",)),
        ("push", ("push",)),
        ("pull,push", ("push", "pull")),
    ],
)
def test_modes(monkeypatch: pytest.MonkeyPatch, value: str | None, modes: tuple[str, ...]) -> None:
    if value is None:
        monkeypatch.delenv("WSNMOM_BENCH_FANOUT", raising=False)
    else:
        monkeypatch.setenv("WSNMOM_BENCH_FANOUT", value)
    assert _modes() == modes


def test_an_unknown_half_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSNMOM_BENCH_FANOUT", "pul")
    with pytest.raises(RuntimeError, match="expected push, pull or both"):
        _modes()
