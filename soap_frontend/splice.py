"""Bodies whose notification payloads are copied into the serialised message as bytes.

A push Notify or a GetMessagesResponse carries payloads that are already serialised XML
(``NotificationMessage.payload``).  Parsing each one into an lxml tree only to serialise the
tree again costs more than the rest of the message.  A :class:`Spliced` body is an element
holding a marker child where the serialised messages go: the envelope around it is built
and serialised as usual, then :meth:`Spliced.fill` puts the bytes in the marker's place.

The marker is an element without a namespace, so it serialises as ``<wsnmom-splice/>`` as
long as no default namespace is in scope, which holds for every envelope and body element
the frontend builds (they use prefixes only).  :meth:`Spliced.fill` takes the *last*
occurrence: the body comes after the SOAP header, where an echoed reference parameter could
contain the same characters.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

#: tag of the marker element; unqualified, see the module docstring
MARKER_TAG = "wsnmom-splice"
MARKER = b"<" + MARKER_TAG.encode() + b"/>"


def add_marker(parent: etree._Element) -> None:
    """Append the marker to ``parent`` (which must not be in a default namespace)."""
    etree.SubElement(parent, MARKER_TAG)


@dataclass(frozen=True, slots=True)
class Spliced:
    """A body element with a marker child and the bytes that replace the marker."""

    element: etree._Element
    content: bytes
    #: SOAP header blocks to send with it (``envelope_bytes`` adds them)
    headers: tuple[etree._Element, ...] = ()

    def fill(self, serialized: bytes) -> bytes:
        """``serialized`` (a serialisation that contains :attr:`element`) with the marker
        replaced by :attr:`content`."""
        head, marker, tail = serialized.rpartition(MARKER)
        if not marker:
            raise ValueError("the serialised message has no splice marker")
        return head + self.content + tail

    def to_bytes(self) -> bytes:
        """The body element alone, serialised with its content."""
        return self.fill(etree.tostring(self.element, encoding="utf-8"))


__all__ = ["MARKER", "MARKER_TAG", "Spliced", "add_marker"]
