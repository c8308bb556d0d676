"""The base of adapters whose subscriptions are cursors over a log.

A log adapter (Kafka, the file log; a NATS JetStream or Pulsar adapter would be one too)
writes the client parts: open and close, publishing, and a
:class:`~wsnmom.adapters.logbase.backend.LogBackend` that reads its logs. The cursor engine
(:class:`~wsnmom.adapters.logbase.engine.CursorEngine`) turns those into subscriptions, and
this base hands core's subscription calls to it, so each adapter only says where its engine
is (:meth:`LogAdapter.cursor_engine`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wsnmom.core.adapter import Adapter, SubscriptionHandle, SubscriptionSpec

from .engine import CursorEngine


class LogAdapter(Adapter):
    """Subscriptions, their names, depths and the restore window, served by a cursor engine."""

    def cursor_engine(self) -> CursorEngine:
        """The open adapter's engine; raises ``AdapterUnavailable`` when it is not open."""
        raise NotImplementedError

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        """The cursor ``spec.name``: created at the end of the logs, or re-attached.  What
        its limits skip is published to ``spec.dead_letters`` through
        ``spec.dead_letter_sink`` (core's, which counts them), else ``publish_many``."""
        return self.cursor_engine().subscription(
            spec, bury=spec.dead_letter_sink or self.publish_many
        )

    def delete_subscription(self, name: str) -> None:
        """Forget the cursor and its stored positions (idempotent)."""
        self.cursor_engine().delete_subscription(name)

    def forget_subscription(self, name: str) -> bool:
        """Drop the cursor another instance deleted; nothing of it is saved again (and
        nothing is left: False)."""
        self.cursor_engine().forget_subscription(name)
        return False

    def subscription_names(self) -> list[str] | None:
        """Cursors open now or stored."""
        return self.cursor_engine().names()

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """Records waiting per cursor, under one engine lock."""
        return self.cursor_engine().depths(handles)

    def restoring(self) -> None:
        """Hold the head reader back while core re-attaches subscriptions."""
        self.cursor_engine().restoring()

    def restored(self) -> None:
        """Every subscription is re-attached: follow the head."""
        self.cursor_engine().restored()

    def stats(self) -> Mapping[str, int]:
        """The engine's counts (cursors, attached, threads) for tests and metrics."""
        return self.cursor_engine().stats()
