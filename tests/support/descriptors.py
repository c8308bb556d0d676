"""Holding descriptors up to a number ``select()`` cannot watch (FD_SETSIZE, 1024), so that
every descriptor the code under test opens afterwards lies above it: a gateway holding
many connections is in that state, and any ``select.select`` on its new descriptors fails
("filedescriptor out of range in select()").

A descriptor opened before the hold and closed during it leaves a hole below the limit,
and the next descriptor the code under test opens takes it (the kernel hands out the
lowest free number).  The likeliest closer is the garbage collector: an object in a
reference cycle that still holds a socket (a failed connect's traceback keeps its frame
and the socket in it; earlier tests leave such garbage) is closed whenever a collection
reaches it.  So the hold collects first and keeps the automatic collector off until it
ends."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from collections.abc import Iterator

#: every descriptor below this is taken before the code under test opens anything
ABOVE = 1100


@contextlib.contextmanager
def descriptors_held(above: int = ABOVE) -> Iterator[None]:
    """Hold descriptors up to ``above`` (the soft limit raised if needed), released after;
    garbage is collected before and the automatic collector is off meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = above + 200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    collecting = gc.isenabled()
    gc.collect()  # garbage holding descriptors closes them now, before the holes are filled
    gc.disable()
    held: list[int] = []
    try:
        while not held or held[-1] < above:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        if collecting:
            gc.enable()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
