"""One instance per thread of an object that must not be shared between threads.

lxml parsers and compiled ``etree.XPath`` objects serialise their callers on an internal
lock.  Shared by the request threads of the WSGI server, that lock and the GIL hand off
to each other on every call: with 16 busy threads a bare Flask endpoint that parses with
one shared parser served 511 requests/s instead of 2,843 with a parser per thread (see
docs/performance.md, F8).  :class:`PerThread` builds the object lazily in each thread
that asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Generic, TypeVar

T = TypeVar("T")


class PerThread(Generic[T]):
    """``get()`` returns the calling thread's own instance, made by ``factory`` on first use.

    Instances are keyed by thread identifier.  An identifier is reused only after its
    thread has ended, so an instance is never used by two threads at once; the number of
    instances is bounded by the number of threads that ever ran concurrently.
    """

    __slots__ = ("_by_thread", "_factory")

    def __init__(self, factory: Callable[[], T], first: T | None = None) -> None:
        self._factory = factory
        self._by_thread: dict[int, T] = {}
        if first is not None:
            self._by_thread[get_ident()] = first

    def get(self) -> T:
        """The calling thread's instance."""
        ident = get_ident()
        obj = self._by_thread.get(ident)
        if obj is None:
            # a dict store is atomic under the GIL and only this thread writes this key
            obj = self._by_thread[ident] = self._factory()
        return obj
