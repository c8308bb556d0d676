"""Untrusted XML never makes the gateway open a file or a URL (``core.safe_xml``).

libxml2 opened the external subset named by a document type declaration even with DTD
loading off: the answer differed between an existing and a missing file, and a FIFO (or a
device such as ``/dev/stdin``) blocked the request thread for good.  Found while writing
the fuzz suite; every parser of untrusted bytes now resolves external resources to
nothing.

Cost: well under a second.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from wsnmom.core.codec import safe_parse
from wsnmom.core.filter_worker import serve
from wsnmom.soap_frontend.xml import XmlRejected, parse_xml


def finishes(fn: Callable[[], object], timeout: float = 3.0) -> bool:
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception:
            pass
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def doctypes(target: Path) -> list[bytes]:
    uri = target.as_uri().encode()
    return [
        b'<!DOCTYPE x SYSTEM "' + uri + b'"><x/>',
        b'<!DOCTYPE x PUBLIC "-//x" "' + uri + b'"><x/>',
        b'<!DOCTYPE x [<!ENTITY % p SYSTEM "' + uri + b'"> %p;]><x/>',
        b'<!DOCTYPE x [<!ENTITY e SYSTEM "' + uri + b'">]><x>&e;</x>',
    ]


@pytest.mark.parametrize("index", range(4))
def test_request_parser_never_opens_the_external_subset(fifo: Path, index: int) -> None:
    data = doctypes(fifo)[index]

    def parse() -> None:
        with pytest.raises(XmlRejected, match="document type declarations"):
            parse_xml(data)

    assert finishes(parse), "parse_xml blocked on a FIFO named by the document"


@pytest.mark.parametrize("index", range(4))
def test_payload_parser_never_opens_the_external_subset(fifo: Path, index: int) -> None:
    assert finishes(lambda: safe_parse(doctypes(fifo)[index]))


def test_existing_and_missing_files_look_the_same(tmp_path: Path) -> None:
    existing = tmp_path / "there.dtd"
    existing.write_text("<!ELEMENT x ANY>")
    answers = []
    for target in (existing, tmp_path / "missing.dtd"):
        with pytest.raises(XmlRejected) as refused:
            parse_xml(doctypes(target)[0])
        answers.append(str(refused.value))
    assert answers[0] == answers[1] == "document type declarations are not accepted"


def test_filter_worker_parser_never_opens_the_external_subset(fifo: Path) -> None:
    import io
    import pickle
    import struct

    request = pickle.dumps(("true()", (), False, 5.0, [doctypes(fifo)[0]]))
    inp = io.BytesIO(struct.pack("!I", len(request)) + request)
    out = io.BytesIO()
    assert finishes(lambda: serve(inp, out))
    # the verdict, then the request's CPU seconds (``T`` + an 8-byte double)
    data = out.getvalue()
    verdict, cpu = data[:-9], data[-9:]
    assert cpu[:1] == b"T"
    assert verdict in (b"1", b"0") or verdict.startswith(b"E")
