"""In-process adapters that present the session and queue shapes to core, so core's
tests cover the paths it takes for MQTT and RabbitMQ without a broker.

Both are the embedded adapter (real SQLite queues under the test's directory) with the
capabilities core acts on changed to those of the middleware they stand for:

* ``testsession://DIR`` (MQTT's session shape): ``sole_publisher=False`` (core keeps a
  durable subscription for every subscription, pull-point feeds included, instead of
  routing at publish time), ``native_pull=True``, per-message acks that need no order
  (``ordered_acks=False``), ``shape="session"``;
* ``testqueue://DIR`` (RabbitMQ's queue shape, its default ``pull = "buffer"``):
  ``sole_publisher=False`` and ``native_pull=False`` (core starts pull points' handles in
  push mode and keeps their unsettled messages in its pull buffer), ``shape="queue"``.

They are registered through the plugin mechanism (``wsnmom_register_adapters``) on the
process-wide plugin manager by :func:`registered`, so ``resolve(url)`` finds them as it
finds any adapter a plugin adds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from wsnmom.adapters.embedded.adapter import SCHEME as EMBEDDED_SCHEME
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core.adapter import Capabilities
from wsnmom.core.hookspecs import hookimpl
from wsnmom.core.plugins import AdapterRegistry, get_plugin_manager

SESSION_SCHEME = "testsession"
QUEUE_SCHEME = "testqueue"
PLUGIN_NAME = "tests-shaped-adapters"


class _Shaped(EmbeddedAdapter):
    """The embedded adapter under its own scheme, with other capabilities."""

    scheme: ClassVar[str]

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        prefix = self.scheme + "://"
        if not url.startswith(prefix):
            raise ValueError(f"not a {self.scheme} URL: {url!r}")
        super().__init__(EMBEDDED_SCHEME + "://" + url[len(prefix) :], options)
        self.capabilities = dataclasses.replace(type(self).capabilities)


class SessionShapedAdapter(_Shaped):
    """MQTT's session shape over embedded queues (see the module docstring)."""

    name = "testsession"
    scheme = SESSION_SCHEME
    schemes = (SESSION_SCHEME,)
    capabilities: Capabilities = dataclasses.replace(
        EmbeddedAdapter.capabilities,
        sole_publisher=False,
        native_pull=True,
        ordered_acks=False,
        per_message_nack=True,
        shape="session",
    )


class QueueShapedAdapter(_Shaped):
    """RabbitMQ's queue shape (pull buffer) over embedded queues."""

    name = "testqueue"
    scheme = QUEUE_SCHEME
    schemes = (QUEUE_SCHEME,)
    capabilities: Capabilities = dataclasses.replace(
        EmbeddedAdapter.capabilities,
        sole_publisher=False,
        native_pull=False,
        per_message_nack=True,
        shape="queue",
    )


class ShapedAdaptersPlugin:
    """Adds ``testsession://`` and ``testqueue://``."""

    @hookimpl
    def wsnmom_register_adapters(self, registry: AdapterRegistry) -> None:
        registry.add(SESSION_SCHEME, SessionShapedAdapter)
        registry.add(QUEUE_SCHEME, QueueShapedAdapter)


@contextmanager
def registered() -> Iterator[None]:
    """The plugin registered on the process-wide plugin manager while the block runs; then
    unregistered and its schemes removed, so later tests see the manager as it was."""
    pm = get_plugin_manager()
    pm.register(ShapedAdaptersPlugin(), name=PLUGIN_NAME)
    try:
        yield
    finally:
        pm.unregister(PLUGIN_NAME)
        pm.adapters.remove(SESSION_SCHEME)
        pm.adapters.remove(QUEUE_SCHEME)
