"""This machine's own IP addresses: every address of every network interface.

A gateway listening on all addresses (``0.0.0.0``, ``::``) is reached at each of them, so
the delivery-loop rule (``core.loops.SelfAddressRule``) must know them all, not only the
addresses this host's name resolves to (which often is just ``127.0.1.1``).  The
standard library has no ``getifaddrs``; on Linux the kernel lists the local IPv4
addresses in ``/proc/net/fib_trie`` (the ``/32 host LOCAL`` entries of its routing trie)
and the IPv6 ones in ``/proc/net/if_inet6``.  Elsewhere, or when those files cannot be
read, the result is empty and the caller falls back on name resolution.
"""

from __future__ import annotations

import contextlib
import ipaddress
from pathlib import Path

__all__ = ["interface_addresses", "parse_fib_trie", "parse_if_inet6"]

_FIB_TRIE = Path("/proc/net/fib_trie")
_IF_INET6 = Path("/proc/net/if_inet6")


def parse_fib_trie(text: str) -> set[str]:
    """The local IPv4 addresses of a ``/proc/net/fib_trie`` listing: each leaf
    ``|-- a.b.c.d`` followed by a ``/32 host LOCAL`` line."""
    found: set[str] = set()
    leaf: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            leaf = stripped[3:].strip()
        elif leaf is not None and stripped.startswith("/32 host LOCAL"):
            with contextlib.suppress(ValueError):
                found.add(str(ipaddress.IPv4Address(leaf)))
    return found


def parse_if_inet6(text: str) -> set[str]:
    """The IPv6 addresses of a ``/proc/net/if_inet6`` listing (32 hex digits first)."""
    found: set[str] = set()
    for line in text.splitlines():
        field = line.split(maxsplit=1)[0] if line.strip() else ""
        if len(field) == 32:
            with contextlib.suppress(ValueError):
                found.add(str(ipaddress.IPv6Address(int(field, 16))))
    return found


def interface_addresses() -> set[str]:
    """Every address of this machine's interfaces (empty where the kernel does not list
    them as Linux does)."""
    found: set[str] = set()
    for path, parse in ((_FIB_TRIE, parse_fib_trie), (_IF_INET6, parse_if_inet6)):
        with contextlib.suppress(OSError):
            found |= parse(path.read_text(encoding="ascii", errors="replace"))
    return found
