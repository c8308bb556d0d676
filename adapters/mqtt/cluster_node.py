"""What one gateway instance holds for one MQTT broker in cluster mode
(``Adapter.shared_by_instances``; docs/scale-out.md "MQTT in cluster mode"): the
publishing connection, the mapping (pull point inboxes on the broker, under
``wsnmom/internal``) and the subscription sessions (:mod:`.cluster_sessions`,
:mod:`.cluster_handle`).  Nothing of a subscription lives on this instance's disk: the
data directory keeps only the instance's own client id (its publisher and its dead-letter
boxes' sessions).

Threads: the publisher's network thread, and one network thread (:mod:`.hub`) for every
subscription session this instance connects, whatever their number.
"""

from __future__ import annotations

from collections.abc import Callable

from ..dir_lock import lock_directory
from .cluster_sessions import SubscriptionSessions
from .config import MqttSettings
from .hub import Hub
from .mapping import MqttMapping
from .publisher import Publisher
from .state import SessionState

__all__ = ["LOCK_FILE", "ClusterNode"]

#: held in the data directory while an instance uses it (``adapters.dir_lock``)
LOCK_FILE = "cluster.lock"


class ClusterNode:
    """One instance's connection to the broker in cluster mode (module docstring)."""

    def __init__(self, settings: MqttSettings, may_deliver: Callable[[str], bool] | None) -> None:
        self.settings = settings
        # the instance's client ids come from this directory: a second process on it
        # would connect with the same ones, and each CONNECT would cut the other off
        self._dir_lock = lock_directory(settings.queue_dir, LOCK_FILE, "MQTT data directory")
        try:
            self._setup(settings, may_deliver)
        except BaseException:
            self._dir_lock.release()
            raise

    def _setup(self, settings: MqttSettings, may_deliver: Callable[[str], bool] | None) -> None:
        self.mapping = MqttMapping(
            settings.namespaces,
            settings.topic_prefix,
            dead_letters=True,
            dead_letter_share=settings.dead_letter_share,
            internal_on_broker=True,
        )
        state = SessionState(settings.queue_dir)
        try:
            self.client_id = state.settle_client_id(settings.client_id)
        finally:
            state.close()
        self.publisher = Publisher(settings, self.client_id + "-p")
        #: the network thread of every subscription session of this instance
        self.hub = Hub("mqtt-sessions", tls=settings.tls)
        self.sessions = SubscriptionSessions(
            settings, self.mapping, self.client_id, may_deliver, self.publisher, self.hub
        )

    def start(self) -> None:
        """Connect the publisher."""
        self.publisher.start()

    @property
    def connected(self) -> bool:
        return self.publisher.link.connected

    @property
    def reason(self) -> str:
        """Why the publisher's connection is down ("" when it is up; no I/O)."""
        return self.publisher.link.reason

    def close(self) -> None:
        try:
            self.sessions.questions.close()
            self.publisher.stop()
            self.hub.close()
        finally:
            self._dir_lock.release()
