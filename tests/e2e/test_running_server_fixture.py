"""The test harness itself: a ``RunningServer`` whose start fails for any reason stops the
process it launched, so no fixture leaves a gateway running (one did, when a server's
readiness check raised an unexpected error)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.fixtures.server import RunningServer, free_port


class _Boom(Exception):
    pass


def test_failed_start_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-fixture-"))
    server = RunningServer("embedded", f"embedded://{data_dir}/mw", data_dir, free_port())

    def boom(self: RunningServer, *args: object) -> None:
        raise _Boom

    monkeypatch.setattr(RunningServer, "_wait_ready", boom)
    with pytest.raises(_Boom):
        server.start()
    assert server.process is not None
    assert server.process.poll() is not None  # stopped, not left running
