"""``core.lanes.destination_key``: the lane of a consumer address, one per scheme, host and
port, numeric hosts in canonical form; the host part is cached (many subscriptions share a
host), which must not change an answer, a refusal included."""

from __future__ import annotations

import pytest
from wsnmom.core.lanes import destination_key


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("http://127.0.0.1:8080/a", "http://127.0.0.1:8080"),
        ("http://2130706433:8080/b", "http://127.0.0.1:8080"),
        ("http://0x7f.1:8080/c", "http://127.0.0.1:8080"),
        ("HTTP://LocalHost/x", "http://localhost:80"),
        ("https://example.org./y", "https://example.org:443"),
        ("http://[::1]:9000/z", "http://[::1]:9000"),
        ("http://[0:0::1]:9000/z", "http://[::1]:9000"),
    ],
)
def test_the_key_of_an_address_asked_twice(address: str, key: str) -> None:
    assert destination_key(address) == key
    assert destination_key(address) == key


@pytest.mark.parametrize(
    "address", ["http:///nohost", "http://h:99999/", "http://[::zz]/", "not a url"]
)
def test_an_address_without_a_destination_has_none_every_time(address: str) -> None:
    assert destination_key(address) is None
    assert destination_key(address) is None
