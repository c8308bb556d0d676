"""Where data lives: ``data_dir`` (:func:`default_data_dir`) holds the store and the
embedded middleware unless ``store_url`` / ``adapter_url`` say otherwise; an explicit
``embedded://PATH`` without a ``data_dir`` makes PATH the data directory
(:func:`_derive_locations`, for :func:`wsnmom.core.config.load_settings` and a
:class:`~wsnmom.core.config_model.Settings` made in code).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from wsnmom.core.config_model import Settings

__all__ = ["EMBEDDED_PREFIX", "default_data_dir", "embedded_path"]


EMBEDDED_PREFIX = "embedded://"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/wsnmom``, else ``~/.local/share/wsnmom`` (XDG Base Directory spec:
    a relative ``XDG_DATA_HOME`` is ignored)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "wsnmom"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "share" / "wsnmom"


def _embedded_path(url: str) -> str | None:
    """The directory of an ``embedded://PATH`` URL (None for other URLs and :memory:)."""
    if not url.startswith(EMBEDDED_PREFIX):
        return None
    path = unquote(url[len(EMBEDDED_PREFIX) :].partition("?")[0])
    return path if path and path != ":memory:" else None


#: the directory of an ``embedded://PATH`` URL (None for other URLs and :memory:)
embedded_path = _embedded_path


def _derive_locations(
    settings: Settings, explicit: frozenset[str], environ: Mapping[str, str]
) -> None:
    """Fill in ``data_dir``, ``adapter_url`` and ``store_url`` that were not given."""
    data_dir = settings.data_dir if "data_dir" in explicit else None
    if data_dir is None and "adapter_url" in explicit:
        data_dir = _embedded_path(settings.adapter_url)
    if data_dir is None:
        data_dir = str(default_data_dir(environ))
    settings.data_dir = data_dir
    if "adapter_url" not in explicit or not settings.adapter_url:
        settings.adapter_url = EMBEDDED_PREFIX + quote(data_dir, safe="/~")
    if "store_url" not in explicit or not settings.store_url:
        settings.store_url = "sqlite:///" + os.path.join(data_dir, "store.db")
