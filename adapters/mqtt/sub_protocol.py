"""The MQTT 5 connection of one subscription session as a state machine, without I/O
(:mod:`.sub_client` drives it on a socket).

:class:`SessionProtocol` queues the packets to send (:mod:`.sub_codec`), checks what
arrives against the protocol (a CONNACK first and once, acknowledgements only of what was
asked, PINGRESP only after a PINGREQ) and keeps the connection alive (a PINGREQ when
nothing was sent for the keep-alive, the connection given up when the PINGRESP does not
come within it).
"""

from __future__ import annotations

from collections.abc import Sequence

from wsnmom.core.adapter import AdapterUnavailable

from .sub_codec import (
    Connack,
    Disconnect,
    Packet,
    Pingresp,
    SubAck,
    Violation,
    decode,
    encode_subscribe,
    encode_unsubscribe,
)
from .sub_fields import PINGREQ_PACKET, PROTOCOL_ERROR

__all__ = ["SessionProtocol"]


class SessionProtocol:
    """The connection's protocol state (see the module docstring); not thread-safe: its
    owner holds a lock around every call."""

    def __init__(self, keepalive: int, now: float) -> None:
        #: "connecting" until the CONNACK, "open", then "closed"
        self.state = "connecting"
        self.keepalive = keepalive
        #: bytes to send
        self.out = bytearray()
        self._last_sent = now
        self._ping_sent: float | None = None
        #: packet identifier -> (UNSUBSCRIBE or not, the number of filters)
        self._asked: dict[int, tuple[bool, int]] = {}
        self._next_id = 0

    def queue(self, packet: bytes) -> None:
        """Send ``packet`` (nothing once closed)."""
        if self.state != "closed":
            self.out += packet

    def sent(self, now: float) -> None:
        """Bytes went out at ``now`` (the keep-alive counts from the last)."""
        self._last_sent = now

    def _packet_id(self) -> int:
        for _ in range(0xFFFF):
            self._next_id = self._next_id % 0xFFFF + 1
            if self._next_id not in self._asked:
                return self._next_id
        raise AdapterUnavailable("every MQTT packet identifier is in use")

    def subscribe(self, filters: Sequence[str], options: int) -> int:
        """Queue a SUBSCRIBE; its packet identifier."""
        pid = self._packet_id()
        self.queue(encode_subscribe(pid, filters, options))
        self._asked[pid] = (False, len(filters))
        return pid

    def unsubscribe(self, filters: Sequence[str]) -> int:
        """Queue an UNSUBSCRIBE; its packet identifier."""
        pid = self._packet_id()
        self.queue(encode_unsubscribe(pid, filters))
        self._asked[pid] = (True, len(filters))
        return pid

    def receive(self, packets: list[tuple[int, bytes]]) -> list[Packet]:
        """The packets (from :func:`~.sub_codec.split`) decoded and checked against the
        state; the state follows them.  :class:`Violation` for a packet that breaks the
        protocol (the caller closes with its reason code; the packets before it count
        for nothing, the connection being lost)."""
        found: list[Packet] = []
        for first, body in packets:
            packet = decode(first, body)
            self._check(packet)
            found.append(packet)
            if self.state == "closed":
                break
        return found

    def _check(self, packet: Packet) -> None:
        if self.state == "connecting" and not isinstance(packet, Connack):
            raise Violation(PROTOCOL_ERROR, "a packet before the CONNACK")
        if isinstance(packet, Connack):
            if self.state != "connecting":
                raise Violation(PROTOCOL_ERROR, "a second CONNACK")
            self.state = "open" if packet.reason < 0x80 else "closed"
            if packet.keepalive is not None:
                self.keepalive = packet.keepalive  # the broker's word wins (3.2.2.3.14)
        elif isinstance(packet, SubAck):
            asked = self._asked.pop(packet.packet_id, None)
            if asked is None or asked != (packet.unsubscribe, len(packet.reasons)):
                raise Violation(PROTOCOL_ERROR, "an acknowledgement of nothing asked")
        elif isinstance(packet, Pingresp):
            if self._ping_sent is None:
                raise Violation(PROTOCOL_ERROR, "a PINGRESP without a PINGREQ")
            self._ping_sent = None
        elif isinstance(packet, Disconnect):
            self.state = "closed"

    def due(self, now: float) -> str | None:
        """Keep-alive work at ``now``: a PINGREQ queued when nothing went out for the
        keep-alive; why the connection is dead when an earlier one got no PINGRESP in
        time (None: alive)."""
        if not self.keepalive or self.state != "open":
            return None
        if self._ping_sent is not None:
            if now - self._ping_sent >= self.keepalive:
                return f"no PINGRESP within the keep-alive ({self.keepalive}s)"
            return None
        if now - self._last_sent >= self.keepalive:
            self.queue(PINGREQ_PACKET)
            self._ping_sent = now
        return None
