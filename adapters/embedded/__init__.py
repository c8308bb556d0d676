"""Embedded adapter: an in-process, SQLite-backed middleware -- the zero-setup default.

Features
    * Type: native (the middleware *is* this package: no server to run)
    * Topic routing: full wildcards (one level, zero-or-more levels, anywhere in the path)
      through a topic trie; a message is stored once and referenced by every subscription
      that receives it
    * Durable subscriptions: yes (SQLite queue per subscription; survives restarts and
      crashes; unsettled messages come back with ``redelivered=True``)
    * Ack: per message; nack with requeue keeps the original position (FIFO).  Acks are
      group-committed (with the next write, or within ~2 ms by the dispatcher thread); a
      crash inside that window redelivers those messages (at-least-once)
    * Pull: native; push: one dispatcher thread per store, ``prefetch`` respected
    * Queue limits: native (max messages, max bytes, max age; drop oldest / drop newest)
    * Current message: retained per topic
    * Competing consumers: within one process only; a store directory is locked by the
      process that opened it

Connection String
    ``embedded://PATH`` -- ``PATH`` is a directory, created if absent
    (``embedded:///var/lib/wsnmom`` absolute, ``embedded://data`` relative).
    ``embedded://:memory:`` is a private, non-durable store for tests.

Options (URL query or adapter options; options win)
    ``synchronous`` -- ``NORMAL`` (default): every commit survives a crash of the process,
    the last ones may be lost on power failure or OS crash.  ``FULL``: every commit is
    fsynced, survives those too, at a throughput cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import EMBEDDED_SYNTAX, EmbeddedAdapter, EmbeddedHandle, EmbeddedReceived

__all__ = ["EMBEDDED_SYNTAX", "EmbeddedAdapter", "EmbeddedHandle", "EmbeddedReceived"]


def __getattr__(name: str) -> Any:
    # importing the package (its plugin module does, at every start of the command line)
    # does not import the adapter: it is imported when an embedded:// URL is resolved
    if name in __all__:
        from . import adapter

        return getattr(adapter, name)
    raise AttributeError(name)
