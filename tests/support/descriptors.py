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
ends.  A thread of an earlier test still running does the same (a RabbitMQ connection
that an earlier test left retrying closed its socket, "[331, 333]" from
tests/adapters/test_mqtt_descriptors.py in a run on three workers): so
:meth:`DescriptorHold.refill` takes the holes again, and a test calls it right before the
code under test opens its descriptors."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from collections.abc import Iterator

#: every descriptor below this is taken before the code under test opens anything
ABOVE = 1100


class DescriptorHold:
    """The descriptors a hold took (see :func:`descriptors_held`)."""

    def __init__(self, above: int) -> None:
        self.above = above
        self.held: list[int] = []

    def refill(self) -> list[int]:
        """Take every descriptor up to :attr:`above` that is free now (closed since the
        hold began by whoever had it open); returns them.  The kernel gives the lowest
        free number, so once one above the limit comes back there is no hole."""
        taken: list[int] = []
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            if fd > self.above:
                os.close(fd)
                return taken
            self.held.append(fd)
            taken.append(fd)


@contextlib.contextmanager
def descriptors_held(above: int = ABOVE) -> Iterator[DescriptorHold]:
    """Hold every free descriptor up to ``above`` (the soft limit raised if needed),
    released after; garbage is collected before and the automatic collector is off
    meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = above + 200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    collecting = gc.isenabled()
    gc.collect()  # garbage holding descriptors closes them now, before the holes are filled
    gc.disable()
    hold = DescriptorHold(above)
    try:
        hold.refill()
        yield hold
    finally:
        for fd in hold.held:
            os.close(fd)
        if collecting:
            gc.enable()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
