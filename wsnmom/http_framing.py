"""Where an HTTP/1.1 connection is in its exchange, from the bytes it received and the
moments it answered (:class:`Framing`): request line and headers, the body by
``Content-Length`` or chunked encoding, the application at work, idle.  The connection
guard (:mod:`wsnmom.connections`) runs its deadlines and the minimum body rate on it, and
checks each request head of a reserved place as it completes (``screen``).

The framing itself is h11's (a maintained, strict HTTP/1.1 parser): every request head
is read by a new ``h11.Connection``, and a chunked body after it by the same; a body by
``Content-Length`` is counted here, by the number h11 accepted in the head. Every byte
is read as it arrives, pipelined requests included, so that nothing reaches the HTTP
server behind (waitress, cheroot) before this parser has agreed where each request ends.
h11 costs about 25 µs a head (its header expressions and event objects), ten times the
rest of this module, so a connection keeps h11's verdict on its last head that has no
chunked body, by the head's shape: its bytes with every digit of its ``Content-Length``
read as 0. A head of the same shape (a client's next request on a kept-alive connection,
as a rule) differs from that one in the number only, which h11 checks for digits only,
at most 20 of them (both kept in the shape), so h11 would read it alike: it is not read
again. On top of h11 a request is refused when its framing could be read two ways (RFC
9112): a bare CR or LF in its head, an obs-fold line, a ``Content-Length`` that is not
one decimal number, more than one ``Content-Length`` or ``Transfer-Encoding``, both of
them, or ``Transfer-Encoding`` in an HTTP/1.0 request (which waitress ignores). Six
more, which h11 accepts but a server behind refuses or misreads, are refused here too so
that both always agree: trailer fields after a chunked body (cheroot), a control
character in a header value (waitress), an empty line between a chunked body and the
next request (cheroot), a chunk size line with white space or an extension not of the
form ``;token[=token|quoted-string]`` (waitress), a method in lower case (waitress) and
``Expect: 100-continue`` on a request without a body (waitress 3.0 answers it ``100
Continue`` and then reads the next request's head as more of this one's: the request is
lost and its headers join the next one's).  So are more than one empty line before a
request (cheroot reads the second as a request line), an HTTP version other than 1.0 and
1.1 (505: h11 takes any, cheroot refuses them, waitress reads them as 1.0) and a head of
``MAX_HEAD`` bytes or more, the empty line before it and the blank line after it counted
(431, as waitress counts). A refused stream sets ``error`` (and
``status``, the answer it deserves); the connection must then be closed without passing
the bytes on.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import h11

__all__ = ["APP", "BODY", "HEADERS", "WAITING", "Framing", "head_error"]

#: phases of a connection
WAITING = "waiting"  # between requests (idle deadline)
HEADERS = "headers"  # request line and headers arriving (header deadline)
BODY = "body"  # body arriving (body deadline)
APP = "app"  # a complete request with the application: no deadline

#: the size a request head must stay under (waitress' ``max_request_header_size`` default)
MAX_HEAD = 256 * 1024
_END = b"\r\n\r\n"

#: what a :attr:`Framing.listener` receives: the h11 events of each request in order
Listener = Callable[[h11.Request | h11.Data | h11.EndOfMessage], None]


#: control characters a request head must not hold (HT is allowed, CR and LF end lines)
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


#: a chunk size line as waitress reads it: hex digits and extensions without white space
#: (RFC 9112 7.1.1: a chunk-ext-name is a token, its value a token or a quoted-string)
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_SIZE_LINE = re.compile(rb"[0-9A-Fa-f]+(?:;%s(?:=(?:%s|%s))?)*" % (_TOKEN, _TOKEN, _QUOTED))


def _size_lines_ok(frame: bytes) -> bool:
    """Whether the chunk size lines in ``frame`` (what h11 read between two chunks' data:
    the CRLF after one, the size line of the next) are all of waitress' form."""
    return all(not line or _SIZE_LINE.fullmatch(line) for line in frame.split(b"\r\n"))


def _inspect(head: bytes) -> tuple[str, int, int]:
    """Why the request head ``head`` (request line, header lines, the blank line) has a
    framing two parsers could read differently ("" when it has none), and where the value
    of its one ``Content-Length`` starts and ends in it (0, 0 without one)."""
    rest = head.replace(b"\r\n", b"")
    if b"\r" in rest or b"\n" in rest:
        return "a bare CR or LF in the request head", 0, 0
    if b"\r\n " in head or b"\r\n\t" in head:
        return "a header line folded onto the next (obs-fold)", 0, 0
    if _CONTROL.search(head):  # h11 takes them in a header value, waitress does not
        return "a control character in the request head", 0, 0
    low = head.lower()
    lengths = low.count(b"\r\ncontent-length:")
    encodings = low.count(b"\r\ntransfer-encoding:")
    if lengths > 1:
        return "more than one Content-Length", 0, 0
    if encodings > 1:
        return "more than one Transfer-Encoding", 0, 0
    if lengths and encodings:
        return "both Content-Length and Transfer-Encoding", 0, 0
    if not lengths:
        return "", 0, 0
    start = low.index(b"\r\ncontent-length:") + len(b"\r\ncontent-length:")
    end = head.index(b"\r\n", start)
    if not head[start:end].strip(b" \t").isdigit():
        return "an invalid Content-Length", 0, 0
    return "", start, end


def head_error(head: bytes) -> str:
    """Why the request head ``head`` (request line, header lines, the blank line) has a
    framing two parsers could read differently; "" when it has none."""
    return _inspect(head)[0]


class _Verdict:
    """What h11 read in a request head: whether it asked for ``100 Continue`` and whether
    its body is chunked (h11 reads such a body; it accepts no other
    ``Transfer-Encoding``); the request itself only for a :attr:`Framing.listener` (its
    header objects take up to 27 times the head's bytes, held as long as the
    connection)."""

    __slots__ = ("chunked", "expect_continue", "request")

    def __init__(self, request: h11.Request | None, expect_continue: bool, chunked: bool) -> None:
        self.request = request
        self.expect_continue = expect_continue
        self.chunked = chunked


#: the longest head whose verdict a connection keeps for its next request
_SHAPE_MAX = 4096
#: every digit read as 0: two heads of one shape differ in the value of their
#: ``Content-Length`` only, not in its length or its white space
_ZEROS = bytes.maketrans(b"123456789", b"000000000")


def _shape(head: bytes, start: int, end: int) -> bytes:
    """``head`` with the digits of its ``Content-Length`` (at ``start:end``) read as 0:
    whatever h11 reads in a head other than that number, it reads alike in every head of
    one shape (its checks of the number: digits only, at most 20 of them)."""
    if start == end:
        return head
    return head[:start] + head[start:end].translate(_ZEROS) + head[end:]


class Framing:
    """Where a connection is in the HTTP/1.1 exchange, from the bytes it received and the
    moments it sent.  ``since`` is when the current phase began."""

    __slots__ = (
        "_blank",
        "_chunked_end",
        "_head",
        "_left",
        "_parser",
        "_queued",
        "_shape",
        "_unread",
        "_verdict",
        "answered",
        "behind",
        "body_bytes",
        "error",
        "expect_continue",
        "listener",
        "phase",
        "refused",
        "screen",
        "since",
        "status",
    )

    def __init__(self, now: float) -> None:
        self.phase = HEADERS  # a new connection owes its first request's headers
        self.since = now
        #: body bytes of the request being received so far (the minimum body rate)
        self.body_bytes = 0
        #: on a reserved connection: the check every request head must pass
        self.screen: Callable[[bytes], bool] | None = None
        #: a request head failed ``screen``: the connection must be refused
        self.refused = False
        #: the refused head came behind a request the application works on
        self.behind = False
        #: why the bytes received are no HTTP/1.1 this parser and the server behind it
        #: are sure to read alike ("" while they are); then ``status`` is the answer
        self.error = ""
        self.status = 400
        #: whether anything was answered on this connection yet
        self.answered = False
        #: the request received's h11 events, for a differential test (None: none)
        self.listener: Listener | None = None
        #: the head of the request being received, until it is complete
        self._head = b""
        #: the h11 parser of the request whose chunked body is being received
        self._parser: h11.Connection | None = None
        #: the bytes still owed of a body by ``Content-Length`` being received
        self._left = 0
        #: the last request received ended with a chunked body and no head began since
        self._chunked_end = False
        #: the bytes of the empty line skipped before the request being received (0, 2)
        self._blank = 0
        #: of a chunked body, the bytes given to h11 that no event of its accounts for yet
        self._unread = b""
        #: complete requests received behind the one the application works on
        self._queued = 0
        #: the shape (:func:`_shape`) of the last head h11 read and its verdict: a client
        #: sends every request of a connection with a head of one shape, as a rule
        self._shape = b""
        self._verdict: _Verdict | None = None
        #: the current request's head asked for ``100 Continue`` before its body
        self.expect_continue = False

    def received(self, data: bytes, now: float) -> None:
        """``data`` arrived."""
        if not data or self.error:
            return
        if self.phase == WAITING:
            self.phase, self.since = HEADERS, now
        while data and not self.error:
            if self._left:
                data = self._count(data, now)
            elif self._parser is not None:
                data = self._chunks(data, now)
            else:
                data = self._take_head(data, now)

    def sent(self, now: float) -> None:
        """Response bytes were sent (a 100 Continue during the body changes nothing)."""
        self.answered = True
        if self.phase == APP:
            if self._queued:  # a pipelined request, complete already: its turn
                self._queued -= 1
                self.phase = APP
            elif self._left or self._parser is not None:
                self.phase = BODY
            elif self._head:
                self.phase = HEADERS
            else:
                self.phase = WAITING
            self.since = now
        elif self.phase == WAITING:
            self.since = now

    @property
    def mid_request(self) -> bool:
        """Whether part of a request has arrived and the rest is still owed."""
        return bool(self._head) or bool(self._left) or self._parser is not None

    # -- parsing ---------------------------------------------------------------------------
    def _take_head(self, data: bytes, now: float) -> bytes:
        """Collect the request head; once complete, check it and read it with h11.  What
        of ``data`` follows the head (the rest is kept while it is incomplete)."""
        head = self._head + data if self._head else data
        while head[:2] == b"\r\n":  # empty lines before a request (RFC 9112 2.2)
            if self._chunked_end:  # cheroot reads no trailer section: its end is the
                # one empty line it skips before a request, and this one it refuses
                self._refuse("an empty line after a chunked body")
                return b""
            if self._blank:  # cheroot skips one and reads the next as a request line
                self._refuse("more than one empty line before a request")
                return b""
            self._blank, head = 2, head[2:]
        # waitress counts the empty line and the blank line ending the head in its limit
        end = head.find(_END, max(0, len(head) - len(data) - 3))
        if end < 0:
            if self._blank + len(head) >= MAX_HEAD:
                self._refuse("the request head is too large", 431)
            self._head = head
            return b""
        end += len(_END)
        head, rest = head[:end], head[end:]
        self._head, self._chunked_end = b"", False
        if self._blank + end >= MAX_HEAD:
            self._refuse("the request head is too large", 431)
            return b""
        self._blank = 0
        why, start, stop = _inspect(head)
        if why:
            self._refuse(why)
            return b""
        if self.screen is not None and not self.screen(head[: -len(_END)]):
            self.refused, self.behind = True, self.phase == APP
        self.body_bytes = 0
        if self.phase != APP:
            self.phase, self.since = BODY, now
        shape = _shape(head, start, stop) if end <= _SHAPE_MAX else b""
        verdict = self._verdict if shape and shape == self._shape else None
        if verdict is None:  # h11 reads the head (and a chunked body after it)
            parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            parser.receive_data(head)
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(str(exc), exc.error_status_hint)
                return b""
            if not isinstance(event, h11.Request):  # pragma: no cover - a complete head
                self._refuse(f"unexpected {type(event).__name__}")
                return b""
            verdict = self._request(event)
            if verdict is None:
                return b""
            if self.listener is not None:
                self.listener(event)
            if verdict.chunked:
                self.expect_continue = verdict.expect_continue
                self._parser = parser
                return rest
            self._shape, self._verdict = shape, verdict
        elif self.listener is not None and verdict.request is not None:
            self.listener(verdict.request)
        self.expect_continue = verdict.expect_continue
        self._left = int(head[start:stop]) if start != stop else 0
        if not self._left:
            if self.expect_continue:  # waitress would read the next head into this one
                self._refuse("Expect: 100-continue on a request without a body")
                return b""
            self._done(now)
        return rest

    def _count(self, data: bytes, now: float) -> bytes:
        """Body bytes of a request by ``Content-Length`` (the number h11 accepted in its
        head); what follows the request's end."""
        take = min(self._left, len(data))
        self._left -= take
        self.body_bytes += take
        if self.listener is not None:
            self.listener(h11.Data(data=data[:take]))
        if self._left:
            return b""
        self._done(now)
        return data[take:]

    def _chunks(self, data: bytes, now: float) -> bytes:
        """Feed ``data`` to the h11 parser of a chunked body; what follows its end.  The
        chunk size lines h11 read are checked as waitress checks them (h11 takes white
        space after the size and anything after a ``;``)."""
        parser = self._parser
        assert parser is not None
        parser.receive_data(data)
        self._unread += data  # the bytes h11 was given since its last event
        try:
            while True:
                event = parser.next_event()
                if event is h11.NEED_DATA:
                    return b""
                read = len(self._unread) - len(parser.trailing_data[0])
                if isinstance(event, h11.Data):
                    self.body_bytes += len(event.data)
                    if event.chunk_start and not _size_lines_ok(
                        self._unread[: read - len(event.data)]
                    ):
                        self._refuse("an invalid chunk size line")
                        return b""
                elif isinstance(event, h11.EndOfMessage):
                    if event.headers:  # cheroot refuses them: no one reads them
                        self._refuse("trailer fields after a chunked body")
                        return b""
                    if not _size_lines_ok(self._unread[:read]):
                        self._refuse("an invalid chunk size line")
                        return b""
                    rest = parser.trailing_data[0]
                    self._parser, self._chunked_end, self._unread = None, True, b""
                    self._done(now)
                    return rest
                else:  # pragma: no cover - h11 gives a server nothing else before the end
                    self._refuse(f"unexpected {type(event).__name__}")
                    return b""
                self._unread = self._unread[read:]
                if self.listener is not None:
                    self.listener(event)
        except h11.RemoteProtocolError as exc:
            self._refuse(str(exc), exc.error_status_hint)
        return b""

    def _request(self, request: h11.Request) -> _Verdict | None:
        """The verdict on a request h11 accepted, or None when it is refused here."""
        if request.http_version not in (b"1.1", b"1.0"):  # h11 takes any digit.digit
            self._refuse("HTTP version not supported", 505)
            return None
        if request.method != request.method.upper():  # waitress refuses it
            self._refuse("a method in lower case")
            return None
        chunked = any(name == b"transfer-encoding" for name, _ in request.headers)
        if chunked and request.http_version != b"1.1":
            self._refuse("Transfer-Encoding in an HTTP/1.0 request")
            return None
        expect = (v for n, v in request.headers if n == b"expect")
        kept = request if self.listener is not None else None
        return _Verdict(kept, any(v.lower() == b"100-continue" for v in expect), chunked)

    def _done(self, now: float) -> None:
        """The request received is complete."""
        if self.listener is not None:
            self.listener(h11.EndOfMessage())
        if self.phase == APP:
            self._queued += 1  # pipelined behind the one the application works on
        else:
            self.phase, self.since = APP, now

    def _refuse(self, why: str, status: int = 400) -> None:
        self.error, self.status = why or "malformed request", status
        self._parser, self._head, self._left, self._unread = None, b"", 0, b""
