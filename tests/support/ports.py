"""A loopback port that is provably closed, for "a consumer (or broker) that is down".

``127.0.0.1:9`` or ``:1`` are only *probably* closed: any program on the machine may listen
there, and then a test about an unreachable consumer talks to it.  ``closed_port()`` binds a
TCP socket on a free loopback port without listening on it and keeps it bound while the
``with`` block runs: nothing else can bind that port meanwhile, and a connection to it is
refused (Linux answers a SYN to a bound, non-listening socket with a reset).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["closed_port"]


@contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port on ``host`` that refuses connections until the block ends."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))  # never listen(): connections are refused
        yield sock.getsockname()[1]
