"""The descriptor hold of tests/support/descriptors.py: garbage made before it must not
open a hole below the limit while it holds (a socket of the code under test took such a
hole: "assert False" from ``all(fd > ABOVE ...)`` in tests/adapters/test_mqtt_descriptors.py,
once the collector closed a socket that a failed connect's traceback kept)."""

from __future__ import annotations

import gc
import socket

from tests.support.descriptors import ABOVE, descriptors_held


def _socket_in_garbage() -> None:
    """Leave an open socket that only a reference cycle keeps (closed by the collection
    that reaches it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cycle: list[object] = [sock]
    cycle.append(cycle)


def test_garbage_made_before_the_hold_leaves_no_hole_in_it() -> None:
    was_enabled = gc.isenabled()
    gc.disable()  # the garbage waits for a collection, as garbage that grew old does
    try:
        _socket_in_garbage()
        with descriptors_held():
            gc.collect()  # a collection during the hold: the garbage is gone by then
            a, b = socket.socketpair()
            try:
                assert min(a.fileno(), b.fileno()) > ABOVE, (a.fileno(), b.fileno())
            finally:
                a.close()
                b.close()
    finally:
        if was_enabled:
            gc.enable()


def test_the_hold_gives_the_collector_back_as_it_found_it() -> None:
    assert gc.isenabled()
    with descriptors_held():
        assert not gc.isenabled()  # nothing made before the hold closes during it
    assert gc.isenabled()
