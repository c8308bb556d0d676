"""A relay on a loopback port in front of a real broker, for tests that need to stand
between a client and the broker: :class:`LoopbackRelay` accepts on 127.0.0.1, connects
each accepted connection to the upstream address and pumps the bytes both ways, each
direction on its own thread, until :meth:`LoopbackRelay.close` ends them all.  A subclass
changes what it accepts (:meth:`LoopbackRelay.client_side`: a TLS-terminating relay) or
which of the broker's bytes pass (:meth:`LoopbackRelay.passes`: a relay that silences the
broker); :func:`relayed_url` is a broker URL pointing at the relay.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["LoopbackRelay", "relayed_url", "upstream_of"]


class LoopbackRelay:
    """Relays loopback connections to ``upstream`` (see the module docstring)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        #: connections relayed so far (the n-th is number n in :meth:`passes`)
        self.connections = 0
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def client_side(self, raw: socket.socket) -> socket.socket | None:
        """The accepted connection as the relay reads it (None: dropped); as it is."""
        return raw

    def passes(self, number: int) -> bool:
        """Whether the broker's bytes on connection ``number`` reach the client; all do."""
        return True

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(raw,), daemon=True).start()

    def _relay(self, raw: socket.socket) -> None:
        client = self.client_side(raw)
        if client is None:
            return
        up = socket.create_connection(self.upstream)
        with self._lock:
            self.connections += 1
            number = self.connections
            self.sockets += [client, up]
        threading.Thread(target=self._pump, args=(client, up, None), daemon=True).start()
        self._pump(up, client, number)

    def _pump(self, src: socket.socket, dst: socket.socket, number: int | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if number is None or self.passes(number):
                    dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop accepting and end the relayed connections, and with them the threads
        (closing a socket does not wake a thread blocked on it: shutting it down does;
        the accepting thread was left behind per test)."""
        for s in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._accepting.join(10)


def upstream_of(url: str, default_port: int) -> tuple[str, int]:
    """The host and port a broker URL names."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    return parts.hostname, parts.port or default_port


def relayed_url(url: str, port: int, scheme: str | None = None) -> str:
    """``url`` (its credentials, path and query kept) through a relay on loopback
    ``port``, with ``scheme`` instead of its own when given."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit((scheme or parts.scheme, netloc, parts.path, parts.query, ""))
