"""Run ``wsnmom`` from another source tree with this environment's dependencies.

``python bench/ab_launch.py TREE serve ...`` imports the ``wsnmom`` packages from TREE (an
exported older commit, see :mod:`bench.ab`) instead of the editable install, using TREE's
own ``[tool.setuptools] package-dir`` table, then runs the CLI with the remaining
arguments.  Plugins registered by entry point (``wsnmom.adapters.embedded.plugin`` ...) are
imported by module name, so they come from TREE as well.

Run as a script, not with ``-m``: it must not import anything from the current tree.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level packages of ``package-dir`` in the given tree."""

    def __init__(self, packages: dict[str, Path]) -> None:
        self.packages = packages

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        where = self.packages.get(fullname)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, where / "__init__.py", submodule_search_locations=[str(where)]
        )


def package_dirs(tree: Path) -> dict[str, Path]:
    """Package name -> its folder in ``tree``, from the tree's pyproject.toml."""
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text())
    table: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    return {name: tree / folder for name, folder in table.items()}


def install(tree: Path) -> None:
    """From now on, import the ``wsnmom`` packages from ``tree``."""
    sys.meta_path.insert(0, _TreeFinder(package_dirs(tree.resolve())))


def main(argv: list[str]) -> None:
    """``TREE ARGS...``: run the CLI of TREE with ARGS."""
    install(Path(argv[0]))
    sys.argv = ["wsnmom", *argv[1:]]
    from wsnmom.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
