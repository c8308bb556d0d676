"""pytest plugin shipped with wsnmom (entry point ``pytest11: wsnmom``).

It makes the adapter conformance kit's assertions readable (assertion rewriting for
:mod:`wsnmom.testing.conformance`), declares the ``wsnmom_conformance`` marker and offers
two fixtures to adapter authors:

``wsnmom_plugin_manager``
    a fresh :class:`wsnmom.core.plugins.PluginManager`, loaded from the installed entry
    points, for tests that register throwaway plugins.
``wsnmom_namespace``
    a topic namespace URI no other test uses.

Loading this plugin imports nothing from the adapters.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

pytest.register_assert_rewrite("wsnmom.testing.conformance")

if TYPE_CHECKING:
    from wsnmom.core.plugins import PluginManager


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker used by the conformance kit."""
    config.addinivalue_line(
        "markers", "wsnmom_conformance: a test from the wsnmom adapter conformance kit"
    )


@pytest.fixture
def wsnmom_plugin_manager() -> PluginManager:
    """A freshly loaded plugin manager (not the process-wide one)."""
    from wsnmom.core.plugins import PluginManager

    return PluginManager().load()


@pytest.fixture
def wsnmom_namespace() -> str:
    """A unique topic namespace URI."""
    return f"urn:wsnmom:test:{uuid.uuid4().hex}"
