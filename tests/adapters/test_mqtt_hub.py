"""The MQTT hub's wake-ups (adapters/mqtt/hub.py): pure, no broker, no thread."""

from __future__ import annotations

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.hub import Hub


def test_wakes_before_the_thread_looks_poke_it_once() -> None:
    """The PUBACKs of a settled batch (one wake per message) cost the hub's thread one
    wake-up: only a wake that finds nothing waiting pokes it; once the thread has looked
    (it empties the waiting set), the next wake pokes again."""
    hub = Hub("test")
    try:
        a, b = object(), object()
        for client in (a, b, a, b, a):
            hub.wake(client)
        hub.wake()
        assert hub._wake_r.recv(100) == b"\0"
        with hub._lock:  # what the thread does at the top of each pass
            hub._dirty.clear()
        hub.wake(a)
        hub.wake(b)
        assert hub._wake_r.recv(100) == b"\0"
    finally:
        hub.close()
