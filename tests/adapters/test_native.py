"""The media type of a native body that came without one, shared by the Kafka and MQTT
adapters (and through them the Spark bridge)."""

from __future__ import annotations

import pytest
from wsnmom.adapters.native import sniff_content_type


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"<a/>", "application/xml"),
        (b"  \n<?xml version='1.0'?><a/>", "application/xml"),
        (b'{"order": 17}', "application/json"),
        (b"[1, 2]", "application/json"),
        (b"{not json", "text/plain"),
        (b"plain words", "text/plain"),
        ("grüße".encode(), "text/plain"),
        (b"", "text/plain"),
        (b"\x00\xff\xfe", "application/octet-stream"),
    ],
)
def test_sniffed_media_type(body: bytes, expected: str) -> None:
    assert sniff_content_type(body) == expected
