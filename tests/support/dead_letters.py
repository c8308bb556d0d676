"""The gateway's dead letters through its admin API, for the end-to-end tests: what a
destination holds, the Subscribe policy element that names one, and the waits for a
subscription's end and for its dead letters."""

from __future__ import annotations

from typing import Any

import requests

from tests.fixtures.server import RunningServer
from tests.support.soap import WSNMOM
from tests.support.waiting import wait_until

__all__ = ["letters", "policy", "wait_ended", "wait_letters"]


def letters(server: RunningServer, destination: str) -> list[dict[str, Any]]:
    """The dead letters ``server`` holds of ``destination`` (the admin API's list)."""
    url = f"{server.base_url}/wsn/admin/api/dead-letters?destination={destination}"
    resp = requests.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()["dead_letters"]
    return found


def policy(destination: str) -> str:
    """The SubscriptionPolicy content that names dead-letter ``destination``."""
    return f'<wsnmom:DeadLetters xmlns:wsnmom="{WSNMOM}">{destination}</wsnmom:DeadLetters>'


def wait_ended(server: RunningServer, sub_id: str, timeout: float = 30) -> None:
    """Until the admin API no longer knows subscription ``sub_id`` (it ended)."""
    url = f"{server.base_url}/wsn/admin/api/subscriptions/{sub_id}"
    wait_until(lambda: requests.get(url, timeout=10).status_code == 404, timeout, what="the end")


def wait_letters(
    server: RunningServer, destination: str, count: int, what: str | None = None
) -> list[dict[str, Any]]:
    """``destination``'s dead letters once ``server`` holds at least ``count`` (30 s)."""
    found: list[dict[str, Any]] = wait_until(
        lambda: (d := letters(server, destination)) and len(d) >= count and d,
        30,
        what=what or f"{count} dead letters",
    )
    return found
