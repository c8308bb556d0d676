"""Calls of the observer hooks (``wsnmom.core.hookspecs``) from core's hot paths.

Each call first asks the plugin manager whether any plugin implements the hook (a set
lookup), so a hook nobody implements costs nothing per message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from wsnmom.core.adapter import PublishReceipt
from wsnmom.core.model import NotificationMessage

if TYPE_CHECKING:
    from wsnmom.core.plugins import PluginManager

__all__ = ["Observers"]

PUBLISHED = "wsnmom_notification_published"
DELIVERED = "wsnmom_notification_delivered"
FAILED = "wsnmom_delivery_failed"


class Observers:
    """The observer hooks of one broker (``plugins`` None: nobody observes)."""

    __slots__ = ("plugins",)

    def __init__(self, plugins: PluginManager | None) -> None:
        self.plugins = plugins

    def observes(self, hook: str) -> bool:
        """Whether some plugin implements ``hook``."""
        plugins = self.plugins
        return plugins is not None and plugins.observes(hook)

    def published(
        self, messages: Sequence[NotificationMessage], receipts: Sequence[PublishReceipt]
    ) -> None:
        """The middleware confirmed ``messages``."""
        if self.plugins is not None and self.observes(PUBLISHED):
            for m, receipt in zip(messages, receipts, strict=False):
                self.plugins.notification_published(m, receipt)

    def delivered(self, messages: Sequence[NotificationMessage], subscription_id: str) -> None:
        """``messages`` reached the consumer of ``subscription_id``."""
        if self.plugins is not None and self.observes(DELIVERED):
            for m in messages:
                self.plugins.notification_delivered(m, subscription_id)

    def failed(
        self, messages: Sequence[NotificationMessage], subscription_id: str, error: BaseException
    ) -> None:
        """Delivering ``messages`` for ``subscription_id`` failed with ``error``."""
        if self.plugins is not None and self.observes(FAILED):
            for m in messages:
                self.plugins.delivery_failed(m, subscription_id, error)
