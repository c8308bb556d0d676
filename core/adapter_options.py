"""Adapter options declared once: each adapter describes its options as a dataclass whose
fields carry a doc string (:func:`option`), and :func:`parse_options` turns URL query
arguments, TOML ``[adapter_options]`` and ``WSNMOM_ADAPTER_OPTIONS__*`` values into it.

Values are converted with :func:`wsnmom.core.config_values.convert`, so an adapter option
follows the same rules as a gateway setting (one boolean rule: true/false, yes/no, on/off,
1/0; durations; ranges from the field's limits).  A field may name its own ``parse``
function where a value needs more than a type (aliases, nested tables).

Every mistake is an :class:`AdapterOptionError` (a :class:`~wsnmom.core.config.ConfigError`,
so ``wsnmom serve`` exits with the configuration status) naming the option, where it came
from, and for an unknown name the closest declared one ("did you mean topic_prefix?").
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from wsnmom.core.adapter import AdapterError
from wsnmom.core.config import ConfigError
from wsnmom.core.config_values import InvalidValue, convert, limits
from wsnmom.core.redaction import SECRET_NAME

__all__ = [
    "NOT_AN_OPTION",
    "AdapterOptionError",
    "OptionDoc",
    "describe_options",
    "did_you_mean",
    "option",
    "parse_options",
]

T = TypeVar("T")

#: where a value came from: the URL's query (``?name=value``) or the options mapping
QUERY = "query"
OPTIONS = "options"


class AdapterOptionError(ConfigError, AdapterError):
    """An adapter option (or the adapter URL) cannot be used.  A configuration error, not
    a middleware failure: it is never retried."""


def option(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    parse: Callable[[Any], Any] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    secret: bool = False,
) -> Any:
    """A dataclass field declaring one adapter option: its default, what it means
    (``doc``, shown in the documentation), an optional ``parse`` function for the raw value
    (instead of the conversion by type), the range of a number, and ``secret`` (never
    shown)."""
    metadata = {
        **limits(minimum, maximum, above=above),
        "doc": doc,
        "parse": parse,
        "secret": secret,
    }
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata=metadata,
        repr=not secret,
    )


#: field metadata of a dataclass field that is not an option (set from the URL, derived)
NOT_AN_OPTION: Mapping[str, Any] = {"option": False}


def _declared(declared: type) -> dict[str, dataclasses.Field[Any]]:
    """The options of ``declared``: its init fields, except those marked NOT_AN_OPTION."""
    return {
        f.name: f for f in dataclasses.fields(declared) if f.init and f.metadata.get("option", True)
    }


def _plain(tp: Any) -> Any:
    """``tp`` with ``Mapping[K, V]`` read as ``dict[K, V]`` (what the converter knows)."""
    origin = typing.get_origin(tp)
    if origin is Mapping:
        return dict[typing.get_args(tp)]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_plain(arg) for arg in typing.get_args(tp))]  # noqa: UP007
    return tp


def _where(source: str, name: str, value: object, secret: bool) -> str:
    if source == QUERY:
        return f"?{name}={'***' if secret else value}"
    return f"adapter_options.{name} = {'***' if secret else repr(value)}"


def parse_options(
    declared: type[T],
    *,
    adapter: str,
    query: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    options: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> T:
    """An instance of ``declared`` from the URL's ``query`` arguments and the ``options``
    mapping (configuration: TOML or environment; it wins over the query).  ``fixed`` are
    values the adapter took from elsewhere (its URL's host, say) for fields that are not
    options.  The dataclass's ``__post_init__`` may raise ValueError for combinations.

    :raises AdapterOptionError: an unknown option (with the closest declared name), an
        unusable value (naming the option and where it came from), or a rejected
        combination.
    """
    fields = _declared(declared)
    hints = typing.get_type_hints(declared)
    values: dict[str, Any] = {}
    pairs = query.items() if isinstance(query, Mapping) else query
    sources = [(QUERY, name, value) for name, value in pairs]
    sources += [(OPTIONS, str(name), value) for name, value in (options or {}).items()]
    for source, name, raw in sources:
        spec = fields.get(name)
        if spec is None:
            raise AdapterOptionError(
                f"unknown {adapter} adapter option "
                f"{_where(source, name, raw, bool(SECRET_NAME.search(name)))}"
                f"{did_you_mean(name, fields)}"
            )
        try:
            parse = spec.metadata.get("parse")
            values[name] = parse(raw) if parse else convert(raw, _plain(hints[name]), spec.metadata)
        except (InvalidValue, ValueError, TypeError) as exc:
            secret = spec.metadata.get("secret", False)
            problem = "not a usable value" if secret else str(exc)  # exc may quote it
            where = _where(source, name, raw, secret)
            raise AdapterOptionError(f"{adapter} adapter option {where}: {problem}") from None
    try:
        return declared(**{**values, **(fixed or {})})
    except (ValueError, TypeError) as exc:
        raise AdapterOptionError(f"{adapter} adapter options: {exc}") from None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean X?)" for the known name closest to ``name``, else " (known: ...)"."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(names)})"


@dataclasses.dataclass(frozen=True, slots=True)
class OptionDoc:
    """One declared option as the documentation shows it."""

    name: str
    type: str
    default: str
    doc: str


def describe_options(declared: type) -> list[OptionDoc]:
    """The declared options of ``declared`` in declaration order (for documentation and
    ``wsnmom adapters``)."""
    hints = typing.get_type_hints(declared)
    described = []
    for name, spec in _declared(declared).items():
        if spec.default is not dataclasses.MISSING:
            default = "none" if spec.default is None else repr(spec.default)
        elif spec.default_factory is not dataclasses.MISSING:
            default = repr(spec.default_factory())
        else:
            default = "required"
        kind = str(hints[name]).replace("typing.", "")
        described.append(OptionDoc(name, kind, default, spec.metadata.get("doc", "")))
    return described
