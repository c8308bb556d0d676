"""Shared pytest configuration: fixture modules are plugins so every test folder sees them."""

import importlib.util

import pytest

_FIXTURE_MODULES = (
    "tests.fixtures.brokers",
    "tests.fixtures.mosquitto",
    "tests.fixtures.server",
    "tests.fixtures.browser",
)

pytest_plugins = [name for name in _FIXTURE_MODULES if importlib.util.find_spec(name)]
pytest_plugins.append("pytester")  # tests/testing runs the wsnmom pytest plugin in a project

#: per-test timeout of a test marked ``slow`` that sets none itself (the default for every
#: other test is ``timeout`` in pyproject.toml)
SLOW_TIMEOUT = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
