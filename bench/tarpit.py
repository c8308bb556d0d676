"""Tarpit consumers for the isolation scenario: loopback ports that complete TCP
connections (the kernel's listen backlog does) and never answer, nor even accept.

A delivery to one waits for the gateway's whole ``retry.timeout``.  ``connections()`` takes
the waiting connections off the backlog (and keeps them open, still unanswered) to count
how many were made.
"""

from __future__ import annotations

import socket

__all__ = ["Tarpits"]


class Tarpits:
    """``count`` tarpit ports: one each on ``hosts`` (loopback addresses, taken in turn),
    by default all on 127.0.0.1."""

    def __init__(self, count: int, backlog: int = 64, hosts: list[str] | None = None) -> None:
        self.sockets: list[socket.socket] = []
        self._held: list[socket.socket] = []
        self._made = 0
        hosts = hosts or ["127.0.0.1"]
        try:
            for i in range(count):
                sock = socket.socket()
                sock.bind((hosts[i % len(hosts)], 0))
                sock.listen(backlog)
                sock.setblocking(False)
                self.sockets.append(sock)
        except BaseException:
            self.close()
            raise

    def addresses(self, path: str = "/pit") -> list[str]:
        """One consumer address per tarpit."""
        return [f"http://{s.getsockname()[0]}:{s.getsockname()[1]}{path}" for s in self.sockets]

    def connections(self) -> int:
        """Connections made to the tarpits so far."""
        for sock in self.sockets:
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                self._held.append(conn)
                self._made += 1
        return self._made

    def close(self) -> None:
        """Close every connection and port."""
        for sock in [*self._held, *self.sockets]:
            sock.close()
        self._held.clear()
        self.sockets.clear()
