"""``core.codec.xml_payload`` checks a body with the parser once per thread when the same
bytes come again (a fan-out decodes one notification once per subscription), and never
lets a body it did not check through."""

from __future__ import annotations

import threading

import pytest
from wsnmom.core import codec

BODY = b'<t:temp xmlns:t="urn:example">21.5</t:temp>'


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies handed to the parser, in order (on a fresh memo)."""
    monkeypatch.setattr(codec, "_WELL_FORMED", threading.local())
    seen: list[bytes] = []
    real = codec.safe_parse

    def counting(data: bytes):  # type: ignore[no-untyped-def]
        seen.append(data)
        return real(data)

    monkeypatch.setattr(codec, "safe_parse", counting)
    return seen


def test_the_same_body_is_parsed_once_per_thread(parses: list[bytes]) -> None:
    for _ in range(1000):
        # a new bytes object each time, as every delivery of a fan-out brings
        assert codec.xml_payload(bytes(bytearray(BODY)), "application/xml") == BODY
    assert parses == [BODY]

    other = threading.Thread(target=codec.xml_payload, args=(BODY, "application/xml"))
    other.start()
    other.join()
    assert parses == [BODY, BODY]  # another thread checks it itself


def test_a_malformed_body_after_a_well_formed_one_is_still_wrapped(parses: list[bytes]) -> None:
    assert codec.xml_payload(BODY, "application/xml") == BODY
    broken = BODY[:-1]
    wrapped = codec.xml_payload(broken, "application/xml")
    assert wrapped != broken
    assert wrapped == codec.wrap_native(broken, "application/xml")
    # and the well-formed one is not forgotten by a failure
    assert codec.xml_payload(BODY, "application/xml") == BODY
    assert parses == [BODY, broken]


def test_empty_and_mutable_bodies_are_not_remembered(parses: list[bytes]) -> None:
    assert codec.xml_payload(b"", "application/xml") == codec.wrap_native(b"", "application/xml")
    mutable = bytearray(BODY)
    codec.xml_payload(mutable, "application/xml")  # type: ignore[arg-type]
    codec.xml_payload(mutable, "application/xml")  # type: ignore[arg-type]
    assert len(parses) == 3


def test_bodies_over_the_bound_are_parsed_every_time(parses: list[bytes]) -> None:
    big = b"<a>" + b"x" * codec._WELL_FORMED_MAX + b"</a>"
    codec.xml_payload(big, "application/xml")
    codec.xml_payload(big, "application/xml")
    assert len(parses) == 2
