"""Where an HTTP/1.1 connection is in its exchange, from the bytes it received and the
moments it answered (:class:`Framing`): request line and headers, the body by
``Content-Length`` or chunked encoding, the application at work, idle.  The connection
guard (:mod:`wsnmom.connections`) runs its deadlines and the minimum body rate on it, and
checks each request head of a reserved place as it completes (``screen``)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["APP", "BODY", "HEADERS", "WAITING", "Framing"]

#: phases of a connection
WAITING = "waiting"  # between requests (idle deadline)
HEADERS = "headers"  # request line and headers arriving (header deadline)
BODY = "body"  # body arriving (body deadline)
APP = "app"  # a complete request with the application: no deadline

_MAX_HEAD = 256 * 1024


class Framing:
    """Where a connection is in the HTTP/1.1 exchange, from the bytes it received and the
    moments it sent.  ``since`` is when the current phase began."""

    __slots__ = (
        "_chunk",
        "_head",
        "_left",
        "_pending",
        "body_bytes",
        "expect_continue",
        "phase",
        "refused",
        "screen",
        "since",
    )

    def __init__(self, now: float) -> None:
        self.phase = HEADERS  # a new connection owes its first request's headers
        self.since = now
        #: body bytes of the current request received so far (the minimum body rate)
        self.body_bytes = 0
        #: on a reserved connection: the check every request head must pass
        self.screen: Callable[[bytes], bool] | None = None
        #: a request head failed ``screen``: the connection must be refused
        self.refused = False
        self._head = b""
        #: body bytes still expected (Content-Length), or -1 while chunked
        self._left = 0
        #: chunked decoding state: bytes of the current chunk (+ CRLF) left, or a
        #: negative state (-1: size line, -2: trailers)
        self._chunk = 0
        #: bytes received while the application works (a pipelined next request)
        self._pending = b""
        #: the current request's head asked for ``100 Continue`` before its body
        self.expect_continue = False

    def received(self, data: bytes, now: float) -> None:
        """``data`` arrived."""
        if not data:
            return
        if self.phase == APP:
            if len(self._pending) < _MAX_HEAD:
                self._pending += data
            return
        if self.phase == WAITING:
            self.phase, self.since, self._head = HEADERS, now, b""
        offset = 0
        if self.phase == HEADERS:
            offset = self._headers(data, now)
            if offset < 0:
                return
            if self._head:  # the head came in pieces: continue in the joined bytes
                data, self._head = self._head, b""
        if self.phase == BODY and offset < len(data):
            offset = self._body(data, offset)
        if self.phase == APP and offset < len(data):
            self._pending = data[offset : offset + _MAX_HEAD]

    def sent(self, now: float) -> None:
        """Response bytes were sent (a 100 Continue during the body changes nothing)."""
        if self.phase == APP:
            pending, self._pending = self._pending, b""
            self.phase, self.since = WAITING, now
            if pending:
                self.received(pending, now)
        elif self.phase == WAITING:
            self.since = now

    def _headers(self, data: bytes, now: float) -> int:
        """Take the request head from ``data``: the offset of the body in ``data`` (in
        ``self._head`` when the head came in pieces, which then holds all of it), or -1
        while the head is incomplete."""
        head = self._head + data if self._head else data
        start = 0
        if not self._head and head[:2] == b"\r\n":
            start = len(head) - len(head.lstrip(b"\r\n"))  # stray CRLFs (RFC 9112 2.2)
            if start == len(head):
                return -1
        end = head.find(b"\r\n\r\n", start)
        if end < 0:
            self._head = head[-_MAX_HEAD:]
            return -1
        block = head[start:end].lower()
        if self.screen is not None and not self.screen(head[start:end]):
            self.refused = True
        self._head = head if head is not data else b""
        self.phase, self.since, self.body_bytes = BODY, now, 0
        self.expect_continue = b"100-continue" in _header(block, b"expect")
        if b"\ntransfer-encoding:" in block and b"chunked" in _header(block, b"transfer-encoding"):
            self._left, self._chunk = -1, -1
        else:
            length = _header(block, b"content-length").strip()
            self._left = int(length) if length.isdigit() else 0
            if self._left == 0:
                self.phase = APP
        return end + 4

    def _body(self, data: bytes, offset: int) -> int:
        """Take body bytes from ``data[offset:]``; the offset after them."""
        if self._left >= 0:
            take = min(self._left, len(data) - offset)
            self._left -= take
            self.body_bytes += take
            if self._left == 0:
                self.phase = APP
            return offset + take
        rest = self._chunked(data[offset:])
        self.body_bytes += len(data) - offset - len(rest)
        return len(data) - len(rest)

    def _chunked(self, data: bytes) -> bytes:
        i = 0
        while i < len(data):
            if self._chunk > 0:
                take = min(self._chunk, len(data) - i)
                self._chunk -= take
                i += take
                if self._chunk == 0:
                    self._chunk = -1
                continue
            line_end = data.find(b"\n", i)
            if line_end < 0:
                self._head = (self._head + data[i:])[-1024:]
                return b""
            line = (self._head + data[i:line_end]).strip()
            self._head = b""
            i = line_end + 1
            if self._chunk == -2:  # trailers until an empty line
                if not line:
                    self.phase = APP
                    return data[i:]
                continue
            if not line:
                continue  # the CRLF after a chunk's data
            size = line.split(b";", 1)[0]
            try:
                n = int(size, 16)
            except ValueError:
                self.phase = APP  # malformed: waitress answers it
                return b""
            # the data; the CRLF after it reads as an empty size line and is skipped
            self._chunk = n if n else -2
        return b""


def _header(block: bytes, name: bytes) -> bytes:
    """The value of header ``name`` in a lower-cased header block ("" when absent)."""
    start = block.find(b"\n" + name + b":")
    if start < 0:
        return b""
    start += len(name) + 2
    end = block.find(b"\r\n", start)
    return block[start:] if end < 0 else block[start:end]
