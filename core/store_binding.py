"""Which adapter a store's resources belong to.

A subscription or pull point in the store has its messages in one middleware.  Opened
with another adapter (``make run`` on the embedded default, then ``wsnmom serve --adapter
amqp://...`` on the same data directory), the gateway would restore the records against
a middleware that holds none of their messages and silently strand the backlog left in the
first one.  :func:`bind_store` records the adapter's name in the store (meta key
``adapter``) and refuses, at start, a store whose resources another adapter holds.
"""

from __future__ import annotations

from wsnmom.core.store import Store, StoreError

__all__ = ["ADAPTER_KEY", "StoreOfAnotherAdapter", "bind_store"]

#: the meta key naming the adapter a store's resources belong to
ADAPTER_KEY = "adapter"


class StoreOfAnotherAdapter(StoreError):
    """The store holds resources whose messages live in another adapter's middleware."""

    def __init__(self, recorded: str, adapter: str, resources: int) -> None:
        self.recorded = recorded
        self.adapter = adapter
        self.resources = resources
        super().__init__(
            f"the store holds {resources} subscriptions, pull points and registrations of "
            f"the {recorded!r} adapter, whose messages are in that middleware, not in "
            f"{adapter!r}"
        )


def bind_store(store: Store, adapter: str) -> None:
    """Record ``adapter`` as the store's adapter, or raise :class:`StoreOfAnotherAdapter`
    when the store holds resources of another one.  An empty store changes hands."""
    recorded = store.get_meta(ADAPTER_KEY)
    if recorded == adapter:
        return
    if recorded is not None:
        resources = (
            len(store.list_subscriptions())
            + len(store.list_pull_points())
            + len(store.list_registrations())
        )
        if resources:
            raise StoreOfAnotherAdapter(recorded, adapter, resources)
    store.set_meta(ADAPTER_KEY, adapter)
