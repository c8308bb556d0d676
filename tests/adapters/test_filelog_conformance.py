"""The adapter conformance kit run against the file-log reference adapter (log shape:
offset acknowledgements, cursors, no per-message nack, no native pull or limits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wsnmom.testing.conformance import AdapterConformance


class TestFileLogConformance(AdapterConformance):
    """Every group on a log directory per test (groups needing native pull or native
    limits skip, with the capability as the reason)."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, tmp_path: Path) -> str:
        return f"filelog://{tmp_path / 'log'}"


class TestFileLogOnePartition(AdapterConformance):
    """One stream per namespace: order holds across topics too."""

    receive_timeout = 5.0

    @pytest.fixture
    def adapter_url(self, tmp_path: Path) -> str:
        return f"filelog://{tmp_path / 'log'}?partitions=1"
