"""Write ``tests/durations.json``, the seconds each test module took, from JUnit XML reports.

``make test`` hands whole modules to its pytest-xdist workers (``--dist loadfile``), longest
first (``tests/conftest.py``, ``pytest_collection_modifyitems``), so that the two workers
finish together instead of one running the last long module alone.  The order comes from
this file; a module it does not know is estimated from its number of tests.

    .venv/bin/pytest -p no:cacheprovider --junitxml=/tmp/e2e.xml tests/e2e
    .venv/bin/python scripts/test_durations.py /tmp/*.xml

Each report's modules replace the ones the file had; the others stay.  A test's time is
its set-up, call and tear-down (a session broker or gateway started by a module's first
test is counted to that module).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree

OUT = Path("tests/durations.json")


def module_of(classname: str, root: Path) -> str | None:
    """``tests.e2e.test_x`` or ``tests.e2e.test_x.TestY`` -> ``tests/e2e/test_x.py``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = Path(*parts[:end]).with_suffix(".py")
        if (root / candidate).is_file():
            return candidate.as_posix()
    return None


def durations(report: Path, root: Path) -> dict[str, float]:
    """Seconds per test module in one JUnit XML report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).iter("testcase"):
        module = module_of(case.get("classname", ""), root)
        if module is not None:
            totals[module] += float(case.get("time") or 0.0)
    return dict(totals)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path.cwd()
    known: dict[str, float] = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name in argv:
        known.update(durations(Path(name), root))
    known = {m: s for m, s in known.items() if (root / m).is_file()}
    ordered = {m: round(known[m], 1) for m in sorted(known)}
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} modules, {sum(ordered.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
