"""A WSGI request's body read whole before the application sees it, and put back for it.

``pull_forward`` reads a body whole to forward it (or to check a forwarded one's
signature): :func:`read_whole` reads a plain ``Content-Length`` body within the limit,
or a chunked one (cheroot hands it on with ``Transfer-Encoding`` and no length) to its
end, and puts it back as ``wsgi.input`` with its length.  A body over the limit, or not
framed, is left to the application: what was read of a chunked one is put back in
front of the rest of its stream (:class:`_Joined`).
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["read_whole"]


def read_whole(environ: dict[str, Any], max_body: int | None) -> bytes | None:
    """The request body (put back for the application to read), or None when it is
    over ``max_body`` or not framed (left alone: the application answers it).  A body
    the server hands on chunked (cheroot: ``Transfer-Encoding``, no length) is read
    to its end.  A request without a body (a GET) has the empty one."""
    length = environ.get("CONTENT_LENGTH")
    chunked = "HTTP_TRANSFER_ENCODING" in environ
    if chunked:
        if str(environ["HTTP_TRANSFER_ENCODING"]).strip().lower() != "chunked":
            return None
        wanted = None
    elif isinstance(length, str) and length.isascii() and length.isdigit():
        wanted = int(length)
        if max_body is not None and wanted > max_body:
            return None
    elif not length and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
        return b""
    else:
        return None
    stream = environ["wsgi.input"]
    parts: list[bytes] = []
    got = 0
    while wanted is None or got < wanted:
        step = 65536 if wanted is None else min(65536, wanted - got)
        chunk = stream.read(step)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
        if wanted is None and max_body is not None and got > max_body:
            # over the limit: the application answers what it reads (the rest)
            environ["wsgi.input"] = io.BufferedReader(_Joined(parts, stream))
            return None
    body = b"".join(parts)
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ["wsgi.input_terminated"] = True
    return body


class _Joined(io.RawIOBase):
    """What was read of a body, then the rest of its stream."""

    def __init__(self, parts: list[bytes], rest: Any) -> None:
        self._head = b"".join(parts)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
