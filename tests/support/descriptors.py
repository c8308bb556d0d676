"""Holding descriptors up to a number ``select()`` cannot watch (FD_SETSIZE, 1024), so that
every descriptor the code under test opens afterwards lies above it: a gateway holding
many connections is in that state, and any ``select.select`` on its new descriptors fails
("filedescriptor out of range in select()")."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

#: every descriptor below this is taken before the code under test opens anything
ABOVE = 1100


@contextlib.contextmanager
def descriptors_held(above: int = ABOVE) -> Iterator[None]:
    """Hold descriptors up to ``above`` (the soft limit raised if needed), released after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = above + 200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < above:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
