"""Failing fast while the broker cannot serve: before its state is restored at start-up,
and while the adapter knows the middleware is unreachable.

Without this, an operation during a middleware outage waits for the middleware's timeouts
(a Notify for ``publish_timeout``, a Subscribe for the adapter's operation timeout), each
holding one of the HTTP server's threads, so a handful of clients make the whole gateway
unresponsive.  Instead:

* every WS-N operation is refused until the broker has restored its resources from the
  store (a gateway started before its middleware keeps serving ``/healthz``);
* an operation that needs the middleware asks the adapter (``Adapter.available``, which
  answers at once).  When it is down, the request may wait for it to come back, but only
  within ``grace`` seconds of the moment the outage was first seen, and only a few
  requests at a time (``max_waiters``); every other request is refused at once.

Work that takes disk space (Notify, Subscribe, CreatePullPoint, RegisterPublisher) is
refused too while the data directory's disk is low (``require_space``, :mod:`.disk`), and
an operation whose write found the disk full is refused the same way (``refusal``).

A refusal is ``errors.ResourceUnavailable`` with ``retry_after`` set: a SOAP Receiver
fault with a ResourceUnavailableFault detail, which the frontend answers with HTTP 503 and
a ``Retry-After`` header.  A connected but slow middleware is not affected: its operations
keep their full timeouts.  When one of them still runs out of time, the adapter raises
``MiddlewareBusy`` and the operation is refused with ``errors.MiddlewareOverloaded``
("overloaded", not "not reachable"; ``Retry-After`` from the adapter's backlog estimate),
and the middleware is not treated as down.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wsnmom.core import errors
from wsnmom.core.adapter import Adapter, AdapterUnavailable, MiddlewareBusy
from wsnmom.core.disk import DiskWatch, is_storage_full, storage_full_text
from wsnmom.core.redaction import redact_text

if TYPE_CHECKING:
    from wsnmom.core.store import Store

__all__ = ["MiddlewareGate", "data_paths", "middleware_reason", "shown_reason", "store_reason"]


def data_paths(settings: Any, adapter: Adapter, store: Any) -> list[str]:
    """The directories whose free space the broker watches: the embedded middleware's
    (``embedded://PATH``), the data directory of an adapter that keeps data there, and
    the store file's."""
    from wsnmom.core.config import EMBEDDED_PREFIX, embedded_path

    paths: list[str] = []
    url = str(getattr(settings, "adapter_url", ""))
    if url.startswith(EMBEDDED_PREFIX) and (embedded := embedded_path(url)):
        paths.append(embedded)
    data_dir = getattr(settings, "data_dir", None)
    if data_dir and getattr(type(adapter), "uses_data_dir", False):
        paths.append(str(data_dir))
    store_path = getattr(store, "path", None)
    if isinstance(store_path, str) and store_path != ":memory:":
        paths.append(os.path.dirname(os.path.abspath(store_path)))
    return paths


def shown_reason(why: object) -> str:
    """A dependency's reason as the gateway shows it (503 texts, ``/readyz``, the admin
    API): credentials redacted (``core.redaction``), on one line; "" for none."""
    return " ".join(redact_text(str(why)).split()) if why else ""


def middleware_reason(adapter: Adapter) -> str:
    """Why the middleware is unavailable, as the adapter says (``unavailable_reason``,
    no I/O), shown (``shown_reason``); "" when it says nothing."""
    try:
        return shown_reason(adapter.unavailable_reason())
    except Exception:  # a reason is a courtesy: never a failure of its own
        return ""


def store_reason(store: Store) -> str:
    """Why the store does not answer, as it says (``Store.unavailable_reason``, no I/O),
    shown (``shown_reason``); "" when it says nothing."""
    try:
        return shown_reason(store.unavailable_reason())
    except Exception:  # likewise
        return ""


class MiddlewareGate:
    """Refuses operations the broker cannot serve now (see the module docstring)."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        grace: float = 2.0,
        retry_after: float = 5.0,
        max_waiters: int = 4,
        clock: Callable[[], float] = time.monotonic,
        disk: DiskWatch | None = None,
    ) -> None:
        self._adapter = adapter
        #: the data directory's free space (None: not watched)
        self.disk = disk
        self.grace = grace
        self.retry_after = retry_after
        self._clock = clock
        self._waiters = threading.BoundedSemaphore(max(1, max_waiters))
        self._down_since: float | None = None
        #: the broker's resources are restored and it serves requests
        self.ready = False
        #: until then: what the last attempt to open the adapter raised, as shown
        #: (``shown_reason``; "" for none), the cause of the refusals and of ``/readyz``
        self.open_error = ""

    def require_ready(self) -> None:
        """Refuse while the broker has not restored its resources yet."""
        if not self.ready:
            why = f": {self.open_error}" if self.open_error else ""
            raise errors.ResourceUnavailable(
                f"the broker is starting: its middleware is not reachable yet{why}",
                retry_after=self.retry_after,
            )

    def require_middleware(self) -> None:
        """Refuse unless the middleware is reachable now, or comes back within the grace
        that remains of the current outage."""
        self.require_ready()
        if self._adapter.available():
            self._down_since = None
            return
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
        deadline = self._down_since + self.grace
        if now < deadline and self._waiters.acquire(blocking=False):
            try:
                while self._clock() < deadline:
                    time.sleep(0.05)
                    if self._adapter.available():
                        self._down_since = None
                        return
            finally:
                self._waiters.release()
        raise self.unavailable()

    def require_space(self) -> None:
        """Refuse work that takes disk space while the disk is low."""
        low = self.disk.low() if self.disk is not None else None
        if low is not None:
            raise errors.ResourceUnavailable(storage_full_text(low), retry_after=self.retry_after)

    def disk_full(self) -> errors.ResourceUnavailable:
        """The refusal for an operation whose write found the disk full."""
        if self.disk is not None:
            self.disk.note_full()
            return errors.ResourceUnavailable(
                storage_full_text(self.disk.state()), retry_after=self.retry_after
            )
        return errors.ResourceUnavailable(storage_full_text(), retry_after=self.retry_after)

    def unavailable(self, cause: BaseException | None = None) -> errors.ResourceUnavailable:
        """The refusal for an operation that found the middleware unreachable: which
        middleware (the adapter's name) and what failed (``cause``, else the adapter's
        ``unavailable_reason``), with any credential in it redacted."""
        adapter = self._adapter
        which = getattr(type(adapter), "name", "") or type(adapter).__name__
        why = shown_reason(cause) if cause is not None else middleware_reason(adapter)
        detail = f": {why}" if why else ""
        return errors.ResourceUnavailable(
            f"the middleware ({which}) is not reachable{detail}; retry later",
            retry_after=self.retry_after,
        )

    def overloaded(self, cause: MiddlewareBusy) -> errors.MiddlewareOverloaded:
        """The refusal for an operation the connected middleware did not answer in time."""
        wait = cause.retry_after if cause.retry_after is not None else self.retry_after
        return errors.MiddlewareOverloaded(
            f"the middleware is overloaded (connected, but slow to answer): {cause}; "
            f"retry in {max(1, math.ceil(wait))} s",
            retry_after=wait,
        )

    def fault(self, exc: Exception, otherwise: errors.WsnError) -> errors.WsnError:
        """``refusal`` for an ``AdapterUnavailable`` or ``MiddlewareBusy``, else
        ``otherwise``."""
        refusal = self.refusal(exc)
        return otherwise if refusal is None else refusal

    def refusal(self, exc: Exception) -> errors.ResourceUnavailable | None:
        """``disk_full`` for a write that found the disk full, ``unavailable`` for an
        ``AdapterUnavailable`` raised mid-operation, ``overloaded`` for a
        ``MiddlewareBusy``, else None (the caller keeps its own fault for other adapter
        errors)."""
        if is_storage_full(exc):
            return self.disk_full()
        if isinstance(exc, AdapterUnavailable):
            return self.unavailable(exc)
        if isinstance(exc, MiddlewareBusy):
            return self.overloaded(exc)
        return None
