"""The adapter conformance kit run against the embedded adapter (file store and memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wsnmom.testing.conformance import (
    AckSemantics,
    AdapterConformance,
    Durability,
)


class TestEmbeddedConformance(AdapterConformance):
    """Every group on a store directory per test."""

    receive_timeout = 3.0

    @pytest.fixture
    def adapter_url(self, tmp_path: Path) -> str:
        return f"embedded://{tmp_path / 'store'}"


class TestEmbeddedMemoryConformance(AdapterConformance):
    """``embedded://:memory:``: durability tests skip (the capability says why)."""

    receive_timeout = 3.0

    @pytest.fixture
    def adapter_url(self) -> str:
        return "embedded://:memory:"


class TestEmbeddedFullSync(AckSemantics, Durability):
    """``synchronous=FULL`` given as a URL option: the groups that restart."""

    receive_timeout = 3.0

    @pytest.fixture
    def adapter_url(self, tmp_path: Path) -> str:
        return f"embedded://{tmp_path / 'store'}?synchronous=full"
