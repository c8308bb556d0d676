"""Shared pytest configuration: fixture modules are plugins so every test folder sees them."""

import importlib.util

_FIXTURE_MODULES = (
    "tests.fixtures.brokers",
    "tests.fixtures.mosquitto",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
    "tests.fixtures.browser",
)

pytest_plugins = [name for name in _FIXTURE_MODULES if importlib.util.find_spec(name)]
pytest_plugins.append("pytester")  # tests/testing runs the wsnmom pytest plugin in a project
