"""Waiting until sockets can be read or written, without ``select()``'s limit.

``select.select`` refuses descriptors numbered 1024 and above (FD_SETSIZE: "filedescriptor
out of range in select()"), and a process with many connections gets such numbers for
its new sockets: in cluster mode an instance holds a connection per subscription session
it delivers, and a busy gateway many HTTP connections.  The publisher's network loop
(:mod:`.driver`) took that error for "the socket is readable" and polled without ever
waiting, burning CPU for as long as its connection was above the limit (a reconnect in
a process with over a thousand descriptors open).  :func:`ready` answers what
``select.select(readers, writers, [], timeout)`` answers, through ``poll(2)``, which has
no such limit (the subscription sessions' :mod:`.hub` uses an epoll selector).
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

__all__ = ["ready"]

#: what counts as readable (as ``select`` reports a hang-up or an error: readable)
_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
#: what counts as writable
_WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _fd(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else int(obj.fileno())
    if fd < 0:  # a closed socket, as select.select says
        raise ValueError("file descriptor cannot be a negative integer")
    return fd


def ready(
    readers: Sequence[Any], writers: Sequence[Any], timeout: float
) -> tuple[list[Any], list[Any]]:
    """The objects of ``readers`` that can be read and of ``writers`` that can be
    written (sockets, or anything with ``fileno()``), waiting up to ``timeout`` seconds
    for one; ValueError for a closed socket, as ``select.select``."""
    wanted: dict[int, int] = {}
    objects: dict[int, Any] = {}
    for obj in readers:
        fd = _fd(obj)
        objects[fd] = obj
        wanted[fd] = wanted.get(fd, 0) | select.POLLIN | select.POLLPRI
    for obj in writers:
        fd = _fd(obj)
        objects.setdefault(fd, obj)
        wanted[fd] = wanted.get(fd, 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    events = poller.poll(max(0, math.ceil(timeout * 1000)))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, event in events:
        if event & _READ and wanted[fd] & select.POLLIN:
            readable.append(objects[fd])
        if event & _WRITE and wanted[fd] & select.POLLOUT:
            writable.append(objects[fd])
    return readable, writable
