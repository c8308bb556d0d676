"""Test-only fault injection (never installed with wsnmom): a ``wsnmom serve`` process
whose ``PYTHONPATH`` starts with this directory SIGKILLs itself exactly where a crash
leaves an orphan durable subscription (``core.orphans``), as its environment says:

* ``KILLPOINT_BEFORE_STORE=TEXT``: about to store the record of a new subscription whose
  consumer address contains ``TEXT`` (or of a new pull point whose name is ``TEXT``),
  after its durable subscription was made, before its record exists;
* ``KILLPOINT_AFTER_DELETE=TEXT``: just after the removal (Unsubscribe, DestroyPullPoint,
  expiry) of such a subscription or pull point deleted its record, before the
  middleware's delete;
* ``KILLPOINT_AFTER_PURGE=1``: just after an operator's purge of a pull point returned
  (what it dropped is answered as gone), before the answer is sent.
* ``KILLPOINT_CUT_ANSWER=PATH``: once the file ``PATH`` exists, after the server wrote the
  head and the first byte of a GetMessages answer that holds messages (a WSGI wrapper
  put around the application through ``waitress.create_server``; the application's body
  is iterated as a server does, never asked for more than the chunk being written).
* ``KILLPOINT_PUT_SUBSCRIPTION=TEXT``: about to write (``put_subscription``, what
  ``wsnmom store migrate`` copies with) a subscription whose id contains ``TEXT``: a copy
  killed half way;
* ``KILLPOINT_HOLD_FORGET=PATH``: not a kill: while the file ``PATH`` exists, following
  another instance's end of a subscription (``SubscriptionChanges.forget``) waits, so a
  test can act between that end and this instance's following it.
* ``KILLPOINT_HOLD_DRAIN=PATH``: not a kill: while the file ``PATH`` exists, an end of
  a subscription that feeds a pull point read here (``PullReader.suspend_feed`` with
  ``drain``) waits before it drains the feed, after the record's delete; the file
  ``PATH.reached`` says it waits.

Python imports ``sitecustomize`` from ``sys.path`` at start; without the variables this
does nothing."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

BEFORE_STORE = os.environ.get("KILLPOINT_BEFORE_STORE", "")
AFTER_DELETE = os.environ.get("KILLPOINT_AFTER_DELETE", "")
AFTER_PURGE = os.environ.get("KILLPOINT_AFTER_PURGE", "")
CUT_ANSWER = os.environ.get("KILLPOINT_CUT_ANSWER", "")
PUT_SUBSCRIPTION = os.environ.get("KILLPOINT_PUT_SUBSCRIPTION", "")
HOLD_FORGET = os.environ.get("KILLPOINT_HOLD_FORGET", "")
HOLD_DRAIN = os.environ.get("KILLPOINT_HOLD_DRAIN", "")


def _marked(record: Any, mark: str) -> bool:
    consumer = getattr(record, "consumer", None)
    named = getattr(consumer, "address", None) or getattr(record, "name", None) or ""
    return mark in named


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killing_before(cls: type, method: str) -> None:
    real = getattr(cls, method)

    def add(self: Any, record: Any) -> None:
        if _marked(record, BEFORE_STORE):
            _kill()
        real(self, record)

    setattr(cls, method, add)


def _killing_put(cls: Any) -> None:
    real = cls.put_subscription

    def put(self: Any, record: Any) -> None:
        if PUT_SUBSCRIPTION in record.id:
            _kill()
        real(self, record)

    cls.put_subscription = put


def _killing_after(cls: type, method: str, getter: str) -> None:
    real = getattr(cls, method)

    def delete(self: Any, name: str, *, intent: bool = False) -> bool:
        record = getattr(self, getter)(name)
        removed = bool(real(self, name, intent=intent))
        if record is not None and _marked(record, AFTER_DELETE):
            _kill()
        return removed

    setattr(cls, method, delete)


def _killing_after_purge(cls: Any) -> None:
    real = cls.purge

    def purge(self: Any, pull_point_id: str) -> Any:
        dropped = real(self, pull_point_id)
        _kill()
        return dropped

    cls.purge = purge


if AFTER_PURGE:
    from wsnmom.core.pull_points import PullPoints

    _killing_after_purge(PullPoints)

if BEFORE_STORE or AFTER_DELETE or PUT_SUBSCRIPTION:
    from wsnmom.core.store_postgres import PostgresStore
    from wsnmom.core.store_sqlite import SqliteStore

    for store in (SqliteStore, PostgresStore):
        if PUT_SUBSCRIPTION:
            _killing_put(store)
        if BEFORE_STORE:
            _killing_before(store, "add_subscription")
            _killing_before(store, "add_pull_point")
        if AFTER_DELETE:
            _killing_after(store, "delete_subscription", "get_subscription")
            _killing_after(store, "delete_pull_point", "get_pull_point")


def _cut(result: Iterable[bytes]) -> Iterator[bytes]:
    try:
        for chunk in result:
            if b"GetMessagesResponse" in chunk and b"NotificationMessage" in chunk:
                # the head and the first byte go out (two send()s: waitress writes the head
                # and then the body), then the process dies
                yield chunk[:1]
                _kill()
            yield chunk
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()


def _cutting(app: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        result = app(environ, start_response)
        return _cut(result) if os.path.exists(CUT_ANSWER) else result

    return wrapped


if CUT_ANSWER:
    import waitress

    _create = waitress.create_server

    def _create_cutting(application: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return _create(_cutting(application), *args, **kwargs)

    waitress.create_server = _create_cutting


if HOLD_FORGET:
    import time

    from wsnmom.core.subscription_changes import SubscriptionChanges

    _forget = SubscriptionChanges.forget

    def _held_forget(self: Any, live: Any) -> None:
        while os.path.exists(HOLD_FORGET):
            time.sleep(0.01)
        _forget(self, live)

    SubscriptionChanges.forget = _held_forget  # type: ignore[method-assign]


if HOLD_DRAIN:
    import pathlib
    import time

    from wsnmom.core.pull_reader import PullReader

    _suspend = PullReader.suspend_feed

    def _held_suspend(self: Any, name: str, *, drain: bool = True, **kwargs: Any) -> Any:
        if drain and os.path.exists(HOLD_DRAIN):
            pathlib.Path(HOLD_DRAIN + ".reached").touch()
            while os.path.exists(HOLD_DRAIN):
                time.sleep(0.01)
        return _suspend(self, name, drain=drain, **kwargs)

    PullReader.suspend_feed = _held_suspend  # type: ignore[method-assign]
