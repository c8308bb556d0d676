"""pytest plugin shipped with wsnmom (entry point ``pytest11: wsnmom``).

It makes the adapter conformance kit's assertions readable (assertion rewriting for
:mod:`wsnmom.testing.conformance` and its parts), declares the ``wsnmom_conformance``
marker and offers these fixtures:

``wsnmom_gateway``
    session scoped: a running gateway (:class:`wsnmom.testing.gateway.Gateway`) in a
    subprocess on a free loopback port, for testing applications that talk WS-N.  Its
    adapter is ``wsnmom_gateway_adapter`` (default ``embedded``, or the
    ``--wsnmom-adapter`` command-line option: ``embedded``, ``filelog``, ``rabbitmq``,
    ``kafka``, ``mqtt`` or an adapter URL);
    its settings are ``wsnmom_gateway_env`` (``WSNMOM_*`` variables).  Override either
    fixture in a conftest.py to choose.  When the middleware cannot be provided the tests
    are skipped (they fail under ``CI=true``).
``wsnmom_plugin_manager``
    a fresh :class:`wsnmom.core.plugins.PluginManager`, loaded from the installed entry
    points, for tests that register throwaway plugins.
``wsnmom_namespace``
    a topic namespace URI no other test uses.

Loading this plugin imports nothing from the adapters.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

# the kit and its parts (wsnmom.testing.conformance imports them)
pytest.register_assert_rewrite(
    "wsnmom.testing.conformance",
    "wsnmom.testing.conformance_fixtures",
    "wsnmom.testing.conformance_routing",
    "wsnmom.testing.conformance_delivery",
    "wsnmom.testing.conformance_retention",
    "wsnmom.testing.conformance_messages",
)

if TYPE_CHECKING:
    from wsnmom.core.plugins import PluginManager
    from wsnmom.testing.gateway import Gateway


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--wsnmom-adapter``: the adapter of the ``wsnmom_gateway`` fixture."""
    parser.getgroup("wsnmom").addoption(
        "--wsnmom-adapter",
        default=None,
        help="adapter of the wsnmom_gateway fixture: embedded (default), filelog, rabbitmq, "
        "kafka, mqtt or an adapter URL",
    )


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


@pytest.fixture(scope="session")
def wsnmom_gateway_adapter(pytestconfig: pytest.Config) -> str:
    """The adapter ``wsnmom_gateway`` runs on: ``--wsnmom-adapter``, else ``embedded``."""
    return str(pytestconfig.getoption("--wsnmom-adapter") or "embedded")


@pytest.fixture(scope="session")
def wsnmom_gateway_env() -> dict[str, str]:
    """Settings for ``wsnmom_gateway`` as ``WSNMOM_*`` environment variables (none)."""
    return {}


@pytest.fixture(scope="session")
def wsnmom_gateway(
    wsnmom_gateway_adapter: str, wsnmom_gateway_env: dict[str, str]
) -> Iterator[Gateway]:
    """A running wsnmom gateway for the whole session (see the module docstring)."""
    from wsnmom.testing.components import missing
    from wsnmom.testing.gateway import start_gateway
    from wsnmom.testing.middleware import MiddlewareUnavailable

    with contextlib.ExitStack() as stack:
        try:
            gateway = stack.enter_context(
                start_gateway(wsnmom_gateway_adapter, env=wsnmom_gateway_env)
            )
        except MiddlewareUnavailable as exc:
            missing(f"wsnmom_gateway: {exc}")
        yield gateway
