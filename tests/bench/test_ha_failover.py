"""The pieces of scenario ``ha`` that judge a run without a gateway: which parts
``WSNMOM_BENCH_HA`` runs, the ``[cluster]`` table the instances get, the stray deliveries
of a stopped instance and the duplicates counted per event (bench/ha_failover.py)."""

from __future__ import annotations

import tomllib

import pytest

from bench.ha_failover import Event, count_duplicates, strays
from bench.ha_rig import cluster_config
from bench.scenarios.ha import _parts


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        (None, ("failover", "cost")),
        ("failover", ("failover",)),
        ("cost", ("cost",)),
        ("cost,failover", ("failover", "cost")),
    ],
)
def test_parts(monkeypatch: pytest.MonkeyPatch, value: str | None, parts: tuple[str, ...]) -> None:
    if value is None:
        monkeypatch.delenv("WSNMOM_BENCH_HA", raising=False)
    else:
        monkeypatch.setenv("WSNMOM_BENCH_HA", value)
    assert _parts() == parts


def test_an_unknown_part_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSNMOM_BENCH_HA", "failsafe")
    with pytest.raises(RuntimeError, match="expected failover, cost or both"):
        _parts()


def test_the_full_run_leaves_lease_and_heartbeat_at_their_defaults() -> None:
    table = tomllib.loads(cluster_config("h0", None, None))["cluster"]
    assert table == {"instance_id": "h0", "shards": 1}
    quick = tomllib.loads(cluster_config("h1", 3.0, 0.5))["cluster"]
    assert quick == {"instance_id": "h1", "shards": 1, "lease": 3, "heartbeat": 0.5}


def test_a_stray_is_a_number_published_after_the_stop_and_delivered_before_a_retake() -> None:
    arrivals = [
        (9.0, "h0", 40),  # before the stop
        (10.5, "h0", 41),  # after SIGCONT, published before the stop (allowed)
        (10.6, "h0", 43),  # published after the stop: a stray
        (10.7, "h1", 44),  # the new owner
        (30.0, "h0", 60),  # after its log says it took the shard again
    ]
    assert strays(arrivals, "h0", (10.0, 29.0), before=42) == [43]
    assert strays(arrivals, "h0", (10.0, float("inf")), before=42) == [43, 60]
    assert strays(arrivals, "h1", (10.0, float("inf")), before=42) == [44]


def test_duplicates_count_for_the_last_event_before_them() -> None:
    events = [Event("kill", "h0", at=10.0), Event("term", "h1", at=20.0)]
    arrivals = [
        (5.0, "h0", 1),
        (6.0, "h0", 2),
        (11.0, "h1", 2),  # again after the kill
        (12.0, "h1", 3),
        (21.0, "h0", 3),  # again after the SIGTERM
        (21.5, "h0", 3),  # and once more
    ]
    count_duplicates(events, arrivals)
    assert [e.duplicates for e in events] == [1, 2]
