"""Bijective escaping between topic path segments (NCNames) and native name levels.

Two layers, both using XML name escaping (``_xHHHH_``, the ``XmlConvert.EncodeName``
convention) with the same rules, composed through the *raw* text of a level::

    NCName  --ncname_to_native_word-->  raw text  --escape_word(syntax)-->  native level
    NCName  <--native_word_to_ncname--  raw text  <--unescape_word(syntax)-- native level

``encode_segment`` / ``decode_segment`` are the compositions.  The raw text is what a level
"means": a native publisher writing the MQTT level ``2024`` and a WS-N publisher using the
segment ``_x0032_024`` talk about the same topic, and each side sees its own spelling.

Escape sequences
    A character is written ``_x`` + four upper-case hex digits + ``_`` (``.`` is
    ``_x002E_``).  Characters beyond the BMP use eight hex digits (``😀`` is
    ``_x0001F600_``), never a surrogate pair.  Lower-case hex is not an escape.

When a character is escaped
    * NCName layer: a character that is not an NCName character, and a first character that
      cannot start an NCName (digits, ``-``, ``.``, ``·``, combining marks).  The empty raw
      text (an empty MQTT level as in ``a//b``) is written ``_x_``, which is not otherwise a
      valid escape.
    * Native layer: the separator, characters the middleware cannot carry, and a level that
      is exactly a wildcard token (RabbitMQ ``*`` is ``_x002A_``; ``a*b`` stays as it is,
      because only whole-word ``*`` is a wildcard).
    * In both layers ``_`` is escaped (``_x005F_``) exactly when leaving it literal would
      make the decoder read an escape sequence where there is none.

Why this is a bijection
    The decoder recognises an escape only where the encoder could have produced one: a
    sequence for a character that *must* be escaped at that position, the whole-level forms
    above, or ``_x005F_`` followed by text that would otherwise start an escape.  The
    encoder works right to left and escapes ``_`` with the very same test.  So
    ``decode(encode(x)) == x`` for every text and ``encode(decode(w)) == w`` for every
    level that uses only characters the layer can carry: e.g. the RabbitMQ level
    ``_x0041_`` (``A`` never needs escaping) is just the literal text ``_x0041_``.

No Unicode normalisation is applied (XML compares code points).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from .syntax import WildcardSyntax

#: the NCName-layer spelling of an empty level
EMPTY_LEVEL: Final = "_x_"

_HEX4: Final = re.compile(r"x([0-9A-F]{4})_")
_HEX8: Final = re.compile(r"x([0-9A-F]{8})_")
_UNDERSCORE: Final = 0x5F

# XML 1.0 (5th edition) NameStartChar / NameChar ranges, without ':' (NCName).
_NAME_START_RANGES: Final = (
    (0x41, 0x5A),
    (0x5F, 0x5F),
    (0x61, 0x7A),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x2FF),
    (0x370, 0x37D),
    (0x37F, 0x1FFF),
    (0x200C, 0x200D),
    (0x2070, 0x218F),
    (0x2C00, 0x2FEF),
    (0x3001, 0xD7FF),
    (0xF900, 0xFDCF),
    (0xFDF0, 0xFFFD),
    (0x10000, 0xEFFFF),
)
_NAME_EXTRA_RANGES: Final = (
    (0x2D, 0x2E),
    (0x30, 0x39),
    (0xB7, 0xB7),
    (0x300, 0x36F),
    (0x203F, 0x2040),
)


def _in_ranges(code: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(lo <= code <= hi for lo, hi in ranges)


# ASCII answers precomputed from the ranges: topic names are mostly ASCII, and the range
# scan costs ~1 µs per character in Python (44 µs for a 33-character pull point inbox name)
_ASCII_START: Final = frozenset(chr(c) for c in range(128) if _in_ranges(c, _NAME_START_RANGES))
_ASCII_NAME: Final = frozenset(
    chr(c)
    for c in range(128)
    if _in_ranges(c, _NAME_START_RANGES) or _in_ranges(c, _NAME_EXTRA_RANGES)
)


def is_ncname_start_char(ch: str) -> bool:
    """Whether ``ch`` may start an NCName."""
    if ch.isascii():
        return ch in _ASCII_START
    return _in_ranges(ord(ch), _NAME_START_RANGES)


def is_ncname_char(ch: str) -> bool:
    """Whether ``ch`` may appear in an NCName after the first character."""
    if ch.isascii():
        return ch in _ASCII_NAME
    code = ord(ch)
    return _in_ranges(code, _NAME_START_RANGES) or _in_ranges(code, _NAME_EXTRA_RANGES)


def is_ncname(text: str) -> bool:
    """Whether ``text`` is an XML NCName."""
    if text.isascii():
        return bool(text) and text[0] in _ASCII_START and _ASCII_NAME.issuperset(text)
    return (
        bool(text) and is_ncname_start_char(text[0]) and all(is_ncname_char(ch) for ch in text[1:])
    )


def escape_char(ch: str) -> str:
    """The escape sequence of one character: ``_xHHHH_`` or, beyond the BMP, ``_xHHHHHHHH_``."""
    code = ord(ch)
    return f"_x{code:04X}_" if code <= 0xFFFF else f"_x{code:08X}_"


@dataclass(frozen=True, slots=True)
class _Rules:
    """One escaping layer."""

    #: must_escape(ch, at_start): ch cannot stay literal at that position
    must_escape: Callable[[str, bool], bool]
    #: the empty text is spelled EMPTY_LEVEL (NCName layer) rather than ""
    empty_marker: bool
    #: whole texts that must be written with their first character escaped
    whole_words: frozenset[str]

    def whole_forms(self) -> dict[str, str]:
        return {escape_char(w[0]) + w[1:]: w for w in self.whole_words}


class _Codec:
    """Encoder and decoder for one layer (see the module docstring)."""

    def __init__(self, rules: _Rules) -> None:
        self.rules = rules
        self.whole_forms = rules.whole_forms()
        # the text after a leading '_' that makes "_" + text a whole-level form
        self.whole_tails = frozenset(form[1:] for form in self.whole_forms)
        #: how many characters _after_underscore looks at
        self.width = max([11, *(len(t) for t in self.whole_tails)])
        #: ASCII characters other than "_" that stay literal at the start of a level, and
        #: after it: a text made of them (and not a whole word) encodes to itself
        ascii_chars = [chr(c) for c in range(128) if c != _UNDERSCORE]
        self.literal_start = frozenset(ch for ch in ascii_chars if not rules.must_escape(ch, True))
        self.literal = frozenset(ch for ch in ascii_chars if not rules.must_escape(ch, False))

    def _after_underscore(self, window: Callable[[int], str], length: int, at_start: bool) -> bool:
        """Would ``"_"`` followed by a text of ``length`` characters be read as an escape (at
        the start of a level if ``at_start``)?  ``window(n)`` returns the first characters
        (at least ``self.width``) of the text's last ``n`` characters.  Iterative over
        chains of ``_x005F_``, so the cost is linear in the chain."""
        rules = self.rules
        while True:
            head = window(length)
            if at_start:
                if rules.empty_marker and length == 2 and head == "x_":
                    return True
                if len(head) == length and head in self.whole_tails:
                    return True
            m = _HEX4.match(head)
            if m is not None:
                code = int(m.group(1), 16)
                if code == _UNDERSCORE:
                    length -= m.end()
                    continue
                return rules.must_escape(chr(code), at_start)
            m = _HEX8.match(head)
            if m is not None:
                code = int(m.group(1), 16)
                return 0x10000 <= code <= 0x10FFFF and rules.must_escape(chr(code), at_start)
            return False

    def encode(self, raw: str) -> str:
        if (
            raw
            and raw[0] in self.literal_start
            and self.literal.issuperset(raw[1:])
            and raw not in self.rules.whole_words
        ):
            return raw
        return self._encode_general(raw)

    def _encode_general(self, raw: str) -> str:
        rules = self.rules
        if not raw:
            return EMPTY_LEVEL if rules.empty_marker else ""
        rev: list[str] = []  # output characters, last character first
        width = self.width

        def window(n: int) -> str:
            return "".join(reversed(rev[max(0, n - width) : n]))

        whole = raw in rules.whole_words
        for k in range(len(raw) - 1, -1, -1):
            ch = raw[k]
            at_start = k == 0
            if (
                (at_start and whole)
                or rules.must_escape(ch, at_start)
                or (ch == "_" and self._after_underscore(window, len(rev), at_start))
            ):
                rev.extend(reversed(escape_char(ch)))
            else:
                rev.append(ch)
        return "".join(reversed(rev))

    def decode(self, word: str) -> str:
        # every escape, EMPTY_LEVEL and every whole-word form starts with "_"
        if "_" not in word:
            return word
        return self._decode_general(word)

    def _decode_general(self, word: str) -> str:
        rules = self.rules
        if rules.empty_marker and word == EMPTY_LEVEL:
            return ""
        whole = self.whole_forms.get(word)
        if whole is not None:
            return whole
        out: list[str] = []
        i = 0
        n = len(word)
        width = self.width

        def window(length: int) -> str:
            return word[n - length : n - length + width]

        while i < n:
            ch = word[i]
            if ch == "_":
                at_start = i == 0
                m = _HEX4.match(word, i + 1)
                if m is not None:
                    code = int(m.group(1), 16)
                    if (
                        self._after_underscore(window, n - m.end(), at_start)
                        if code == _UNDERSCORE
                        else rules.must_escape(chr(code), at_start)
                    ):
                        out.append(chr(code))
                        i = m.end()
                        continue
                else:
                    m = _HEX8.match(word, i + 1)
                    if m is not None:
                        code = int(m.group(1), 16)
                        if 0x10000 <= code <= 0x10FFFF and rules.must_escape(chr(code), at_start):
                            out.append(chr(code))
                            i = m.end()
                            continue
            out.append(ch)
            i += 1
        return "".join(out)


def _ncname_must_escape(ch: str, at_start: bool) -> bool:
    return not (is_ncname_start_char(ch) if at_start else is_ncname_char(ch))


_NCNAME_CODEC: Final = _Codec(
    _Rules(must_escape=_ncname_must_escape, empty_marker=True, whole_words=frozenset())
)


@lru_cache(maxsize=64)
def _native_codec(syntax: WildcardSyntax) -> _Codec:
    def must_escape(ch: str, at_start: bool) -> bool:
        return syntax.must_escape(ch)

    return _Codec(
        _Rules(
            must_escape=must_escape,
            empty_marker=False,
            whole_words=frozenset(syntax.wildcard_tokens),
        )
    )


def native_word_to_ncname(word: str) -> str:
    """NCName spelling of a raw level (any text, including the empty text).

    ``2024`` -> ``_x0032_024``, ``a b`` -> ``a_x0020_b``, ``""`` -> ``_x_``, ``Prüfung`` and
    ``stock.IBM`` unchanged.
    """
    return _NCNAME_CODEC.encode(word)


def ncname_to_native_word(ncname: str) -> str:
    """Raw level text of an NCName segment (inverse of :func:`native_word_to_ncname`)."""
    if not is_ncname(ncname):
        raise ValueError(f"not an NCName: {ncname!r}")
    return _NCNAME_CODEC.decode(ncname)


def escape_word(raw: str, syntax: WildcardSyntax) -> str:
    """Native level for raw text: escapes the separator, characters ``syntax`` cannot carry
    and a level equal to a wildcard token."""
    return _native_codec(syntax).encode(raw)


def unescape_word(word: str, syntax: WildcardSyntax) -> str:
    """Raw text of a native level (inverse of :func:`escape_word`)."""
    return _native_codec(syntax).decode(word)


def encode_segment(ncname: str, syntax: WildcardSyntax) -> str:
    """Native level for a topic path segment (an NCName)."""
    return escape_word(ncname_to_native_word(ncname), syntax)


def decode_segment(word: str, syntax: WildcardSyntax) -> str:
    """Topic path segment (an NCName) for a native level."""
    return native_word_to_ncname(unescape_word(word, syntax))
