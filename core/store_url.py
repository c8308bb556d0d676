"""Opening a store by its URL: ``sqlite:///PATH`` (the default, one gateway) or
``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (``core.store_postgres``, a server several
gateways can share)."""

from __future__ import annotations

from wsnmom.core.store import Store, StoreError
from wsnmom.core.store_sqlite import SqliteStore, sqlite_path

__all__ = ["open_store", "shared_store"]


def shared_store(url: str) -> bool:
    """Whether several gateway instances may share the store ``url`` (PostgreSQL)."""
    return url.startswith(("postgresql://", "postgres://"))


def open_store(url: str, *, instance_id: str = "") -> Store:
    """Open the store named by ``url``; StoreError for a URL no store serves.
    ``instance_id`` names this instance in a shared store (``core.coordination``)."""
    if url.startswith("sqlite:"):
        return SqliteStore(sqlite_path(url))
    if shared_store(url):
        from wsnmom.core.store_postgres import PostgresStore

        return PostgresStore(url, instance_id=instance_id)
    scheme = url.split(":", 1)[0]
    raise StoreError(f"unsupported store URL scheme {scheme!r} (supported: sqlite, postgresql)")
