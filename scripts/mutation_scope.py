"""Write a patch that marks the given functions of a module as added lines, for mutmut's
``--use-patch-file`` (only those lines are mutated): ``scripts/mutation.sh`` mutates just the
settling code of a large module this way.

    python scripts/mutation_scope.py adapters/mqtt/ingest.py Ingest._process ... > scope.patch
"""

from __future__ import annotations

import ast
import sys


def spans(source: str, names: set[str]) -> list[tuple[int, int]]:
    """(first, last) line numbers (1-based) of the named functions (``Class.method`` or a
    module-level ``function``)."""
    found: list[tuple[int, int]] = []
    tree = ast.parse(source)
    for node in tree.body:
        inner = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
        for fn in inner:
            if isinstance(fn, ast.FunctionDef) and f"{prefix}{fn.name}" in names:
                assert fn.end_lineno is not None
                found.append((fn.lineno, fn.end_lineno))
                names = names - {f"{prefix}{fn.name}"}
    if names:
        raise SystemExit(f"not found: {', '.join(sorted(names))}")
    return sorted(found)


def main(argv: list[str]) -> int:
    path, *names = argv
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out = [f"--- {path}", f"+++ {path}"]
    for first, last in spans("\n".join(lines), set(names)):
        out.append(f"@@ -{first - 1},0 +{first},{last - first + 1} @@")
        out += [f"+{line}" for line in lines[first - 1 : last]]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
