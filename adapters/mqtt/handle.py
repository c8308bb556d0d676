"""A subscription's handle on a single instance (``MqttHandle``): the subscription's queue
in the instance's queue store (the embedded adapter's engine, fed by the instance's one
session), whose delete also releases the subscription's MQTT filters from the session.

Cluster mode's handle, a persistent session of its own on the broker, is
:class:`~.cluster_handle.ClusterHandle`.  ``MqttAdapter.subscription`` makes both.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from wsnmom.adapters.embedded.adapter import EmbeddedHandle

if TYPE_CHECKING:
    from .adapter import MqttAdapter

__all__ = ["MqttHandle"]


class MqttHandle(EmbeddedHandle):
    """A subscription's queue; deleting it also releases its MQTT filters."""

    __slots__ = ()

    def delete(self) -> None:
        """Destroy the subscription, its messages and (when unused) its filters."""
        adapter = cast("MqttAdapter", self._adapter)
        adapter.delete_subscription(self.name)
        self.detach()

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Destroy the queue in the transaction that sends its messages to its dead-letter
        topic (the outbox on MQTT 5), then release its filters.  The transaction runs at a
        session barrier: what the broker confirmed before the call (a PUBACK comes before
        the broker delivers to this session) is in the queue by then, and goes too."""
        adapter = cast("MqttAdapter", self._adapter)
        node = adapter._require()
        sent = node.session.at_barrier(
            functools.partial(node.engine.delete_into_dead_letters, self.name, reason, context),
            timeout,
        )
        node.session.release(self.name)
        self.detach()
        return sent or 0
