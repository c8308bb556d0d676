"""A persistent MQTT session of the adapter's own making whose only consumers are taps (no
gateway, no queue store): what the Spark bridge's standalone buffer ``wsnmom spark-buffer``
runs on.

:class:`TapSession` keeps its client id and the filters the broker holds for it in a state
directory of its own (as the gateway keeps them next to its queues), maps MQTT topics to WS
topics as the gateway does (``namespaces``, ``topic_prefix``, derived roots), and hands its
taps every message on their patterns before acknowledging it (see :mod:`.taps`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import MqttSettings
from .mapping import MqttMapping
from .session import Session
from .state import SessionState
from .taps import Tap, Taps

__all__ = ["TapSession"]


class TapSession:
    """A session whose consumers are ``taps``; its state lives in ``state_dir``."""

    def __init__(self, settings: MqttSettings, state_dir: str, taps: Sequence[Tap]) -> None:
        self.settings = settings
        self.mapping = MqttMapping(settings.namespaces, settings.topic_prefix)
        self.taps = Taps(taps)
        #: the MQTT filters the session subscribes for its taps
        self.filters: list[str] = sorted(
            {f for tap in self.taps.taps for f in self.mapping.filters(tap.patterns)}
        )
        self.state = SessionState(state_dir)
        try:
            #: the client id: the settings', else the one kept in the state directory
            self.client_id = self.state.settle_client_id(settings.client_id)
            #: the adapter's session (its inside: for tests that inject faults)
            self.session = Session(
                settings, self.client_id, None, self.mapping, self.state, self.taps
            )
        except BaseException:
            self.state.close()
            raise

    @property
    def session_present(self) -> bool:
        """Whether the broker still had the session at the last connect."""
        return self.session.link.session_present

    @property
    def tap_failures(self) -> int:
        """Sink calls that raised (each was retried)."""
        return self.taps.failures

    def start(self) -> None:
        """Connect, subscribe the taps' filters and start handing messages to the taps;
        ``AdapterError`` (``AdapterUnavailable`` when the broker does not answer within the
        session's timeouts)."""
        try:
            self.session.start(())
        except BaseException:
            self.state.close()
            raise

    def stop(self) -> None:
        """Hand over and acknowledge what arrived, then disconnect (the session stays on
        the broker, which queues for it) and close the state."""
        try:
            self.session.stop()
        finally:
            self.state.close()
