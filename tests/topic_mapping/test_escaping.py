"""Escaping between NCName segments and native levels: examples and round-trip properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsnmom.topic_mapping.dialects import is_ncname as dialects_is_ncname
from wsnmom.topic_mapping.escaping import (
    _NAME_EXTRA_RANGES,
    _NAME_START_RANGES,
    _NCNAME_CODEC,
    EMPTY_LEVEL,
    _Codec,
    _in_ranges,
    _native_codec,
    decode_segment,
    encode_segment,
    escape_char,
    escape_word,
    is_ncname,
    is_ncname_char,
    is_ncname_start_char,
    native_word_to_ncname,
    ncname_to_native_word,
    unescape_word,
)
from wsnmom.topic_mapping.syntax import KAFKA, MQTT, RABBITMQ, WildcardSyntax

SYNTAXES = [RABBITMQ, MQTT, KAFKA]
ids = [s.name for s in SYNTAXES]

# Fragments that exercise the escape grammar itself.
TRICKY = [
    "_",
    "x",
    "_x",
    "_x_",
    "_x0041_",
    "_x005F_",
    "_x005F_x",
    "_x002E_",
    "_x002A_",
    "_x0023_",
    "_x002F_",
    "_x0032_",
    "_x0001F600_",
    "_x00e9_",
    "_xZZZZ_",
    "_x12",
    "005F_",
    ".",
    "-",
    "·",
    "*",
    "#",
    "+",
    "/",
    "$",
    " ",
    "\x00",
]


def _name_start_chars() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(list("_aZxÀé温Ω\u017f")),
        st.characters(min_codepoint=0x41, max_codepoint=0x2FFFF).filter(
            lambda c: dialects_is_ncname(c)
        ),
    )


def _name_chars() -> st.SearchStrategy[str]:
    return st.one_of(
        _name_start_chars(),
        st.sampled_from(list("0129-.·\u0300\u036f\u203f\u2040_xABCDEF")),
    )


# The strategies a draw uses are built once, here: building one (and hypothesis's checks of
# it) at every draw cost more CPU than the draw.
_name_parts = st.lists(
    st.one_of(_name_chars(), st.sampled_from([t for t in TRICKY if dialects_is_ncname("a" + t)])),
    max_size=8,
)
_name_starts = _name_start_chars()


@st.composite
def ncnames(draw: st.DrawFn) -> str:
    parts = draw(_name_parts)
    text = draw(_name_starts) + "".join(parts)
    if draw(st.booleans()) and dialects_is_ncname("".join(parts)):
        text = "".join(parts)
    assert dialects_is_ncname(text), text
    return text


raw_texts = st.lists(
    st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(TRICKY)),
    max_size=8,
).map("".join)


def native_words(syntax: WildcardSyntax) -> st.SearchStrategy[str]:
    """Levels ``syntax`` can carry: allowed characters, no separator, not a wildcard token."""
    if syntax is KAFKA:
        chars: st.SearchStrategy[str] = st.sampled_from(list("aZ09_-xABCDEF"))
    else:
        chars = st.characters(exclude_categories=["Cs"])
    return (
        st.lists(st.one_of(chars, st.sampled_from(TRICKY)), max_size=8)
        .map("".join)
        .filter(
            lambda w: not any(syntax.must_escape(c) for c in w) and w not in syntax.wildcard_tokens
        )
    )


#: per syntax, :func:`native_words` (built once)
native_words_of = {s.name: native_words(s) for s in SYNTAXES}
#: one NCName (built once; ``ncnames()`` builds a new strategy at each call)
an_ncname = ncnames()


# --- examples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "ncname"),
    [
        ("a", "a"),
        ("stock.IBM", "stock.IBM"),
        ("Prüfung", "Prüfung"),
        ("2024", "_x0032_024"),
        ("-a", "_x002D_a"),
        (".a", "_x002E_a"),
        ("·a", "_x00B7_a"),
        ("a b", "a_x0020_b"),
        ("a:b", "a_x003A_b"),
        ("a/b", "a_x002F_b"),
        ("", EMPTY_LEVEL),
        ("_x_", "_x005F_x_"),
        ("_x0041_", "_x0041_"),  # 'A' never needs escaping: literal text
        ("_x0032_", "_x005F_x0032_"),  # would read as an escaped leading '2'
        ("a_x0032_", "a_x0032_"),  # not at the start: '2' is fine, so literal
        ("_x0020_", "_x005F_x0020_"),
        ("😀", "😀"),  # non-BMP letters are NCName characters
        ("\U000f0000", "_x000F0000_"),  # a private-use plane character is not
    ],
)
def test_ncname_layer_examples(raw: str, ncname: str) -> None:
    assert native_word_to_ncname(raw) == ncname
    assert ncname_to_native_word(ncname) == raw
    assert dialects_is_ncname(ncname)


@pytest.mark.parametrize(
    ("syntax", "ncname", "word"),
    [
        (RABBITMQ, "stock.IBM", "stock_x002E_IBM"),
        (RABBITMQ, "_x002A_", "_x002A_"),  # a whole-level raw '*' is escaped
        (RABBITMQ, "a_x002A_b", "a*b"),  # '*' inside a word is no wildcard
        (RABBITMQ, "_x0032_024", "2024"),
        (RABBITMQ, "温度", "温度"),
        (RABBITMQ, "_x_", ""),
        (MQTT, "stock.IBM", "stock.IBM"),
        (MQTT, "a_x002F_b", "a_x002F_b"),
        (MQTT, "a_x002B_", "a_x002B_"),
        (MQTT, "_x0024_SYS", "$SYS"),
        (KAFKA, "stock.IBM", "stock_x002E_IBM"),
        (KAFKA, "Prüfung", "Pr_x00FC_fung"),
        (KAFKA, "温度", "_x6E29__x5EA6_"),
        (KAFKA, "a_b-c", "a_b-c"),
        (KAFKA, "a𐀀", "a_x00010000_"),
    ],
    ids=lambda v: v.name if isinstance(v, WildcardSyntax) else repr(v),
)
def test_segment_examples(syntax: WildcardSyntax, ncname: str, word: str) -> None:
    assert encode_segment(ncname, syntax) == word
    assert decode_segment(word, syntax) == ncname


def test_escape_char_widths() -> None:
    assert escape_char(".") == "_x002E_"
    assert escape_char("\U0001f600") == "_x0001F600_"


def test_lowercase_hex_is_literal() -> None:
    assert unescape_word("a_x002e_b", RABBITMQ) == "a_x002e_b"
    assert ncname_to_native_word("_x0032_") == "2"
    assert ncname_to_native_word("a_x0032_") == "a_x0032_"


def test_mqtt_words_never_carry_wildcards() -> None:
    assert escape_word("+", MQTT) == "_x002B_"
    assert escape_word("a#b", MQTT) == "a_x0023_b"
    assert escape_word("a/b", MQTT) == "a_x002F_b"


def test_ncname_to_native_word_rejects_non_ncnames() -> None:
    with pytest.raises(ValueError):
        ncname_to_native_word("2a")
    with pytest.raises(ValueError):
        ncname_to_native_word("")


def test_syntax_must_carry_escape_alphabet() -> None:
    with pytest.raises(ValueError):
        WildcardSyntax(
            name="bad",
            separator="_",
            single_level=None,
            multi_level=None,
            multi_level_mid_path=False,
            multi_level_matches_parent=False,
            allowed_char=lambda c: True,
            max_length=None,
        )
    with pytest.raises(ValueError):
        WildcardSyntax(
            name="bad",
            separator=".",
            single_level=None,
            multi_level=None,
            multi_level_mid_path=False,
            multi_level_matches_parent=False,
            allowed_char=str.islower,
            max_length=None,
        )


# --- properties -------------------------------------------------------------------------


@given(an_ncname)
def test_is_ncname_agrees_with_the_dialect_parser(name: str) -> None:
    assert is_ncname(name)


@given(raw_texts)
def test_ncname_layer_round_trip_from_raw(raw: str) -> None:
    name = native_word_to_ncname(raw)
    assert dialects_is_ncname(name)
    assert ncname_to_native_word(name) == raw


@given(an_ncname)
def test_ncname_layer_round_trip_from_ncname(name: str) -> None:
    assert native_word_to_ncname(ncname_to_native_word(name)) == name


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@given(data=st.data())
def test_segment_round_trip_from_ncname(syntax: WildcardSyntax, data: st.DataObject) -> None:
    name = data.draw(an_ncname)
    word = encode_segment(name, syntax)
    assert decode_segment(word, syntax) == name
    # the word is a plain native level: no separator, no wildcard, only carried characters
    assert syntax.separator not in word
    assert word not in syntax.wildcard_tokens
    assert not any(syntax.must_escape(c) for c in word)


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@given(data=st.data())
def test_segment_round_trip_from_native_word(syntax: WildcardSyntax, data: st.DataObject) -> None:
    word = data.draw(native_words_of[syntax.name])
    name = decode_segment(word, syntax)
    assert dialects_is_ncname(name)
    assert encode_segment(name, syntax) == word


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@given(data=st.data())
def test_native_layer_round_trip_from_raw(syntax: WildcardSyntax, data: st.DataObject) -> None:
    raw = data.draw(raw_texts)
    assert unescape_word(escape_word(raw, syntax), syntax) == raw


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@given(data=st.data())
def test_encoding_is_injective(syntax: WildcardSyntax, data: st.DataObject) -> None:
    a = data.draw(an_ncname)
    b = data.draw(an_ncname)
    if a != b:
        assert encode_segment(a, syntax) != encode_segment(b, syntax)


# --- the ASCII fast paths give what the general code gives --------------------------------

ascii_texts = st.lists(
    st.one_of(st.characters(max_codepoint=127), st.sampled_from(TRICKY)), max_size=12
).map("".join)
_CODECS = [("ncname", _NCNAME_CODEC)] + [(s.name, _native_codec(s)) for s in SYNTAXES]


def _ncname_by_ranges(text: str) -> bool:
    return (
        bool(text)
        and _in_ranges(ord(text[0]), _NAME_START_RANGES)
        and all(
            _in_ranges(ord(ch), _NAME_START_RANGES) or _in_ranges(ord(ch), _NAME_EXTRA_RANGES)
            for ch in text[1:]
        )
    )


def test_ascii_character_classes_match_the_ranges() -> None:
    for code in range(128):
        ch = chr(code)
        assert is_ncname_start_char(ch) == _in_ranges(code, _NAME_START_RANGES)
        assert is_ncname_char(ch) == _ncname_by_ranges("a" + ch)


@given(st.one_of(ascii_texts, raw_texts))
def test_is_ncname_fast_path_matches_the_ranges(text: str) -> None:
    assert is_ncname(text) == _ncname_by_ranges(text)


@pytest.mark.parametrize("name,codec", _CODECS, ids=[n for n, _ in _CODECS])
@given(text=st.one_of(ascii_texts, raw_texts))
def test_codec_fast_paths_match_the_general_code(name: str, codec: _Codec, text: str) -> None:
    assert codec.encode(text) == codec._encode_general(text)
    assert codec.decode(text) == codec._decode_general(text)


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
def test_plain_names_take_the_fast_path(syntax: WildcardSyntax) -> None:
    """What the fast path is for: a pull point inbox segment ("p" + 32 hex digits)."""
    codec = _native_codec(syntax)
    word = "p" + "0123456789abcdef" * 2
    assert codec.literal_start.issuperset(word[:1]) and codec.literal.issuperset(word)
    assert encode_segment(word, syntax) == word == decode_segment(word, syntax)
