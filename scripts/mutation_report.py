"""Print the mutation score per module from mutmut's cache (``.mutmut-cache``, written by
``scripts/mutation.sh``), as the table docs/testing.md shows, and the surviving mutants.

Killed counts mutants the tests failed on and those that timed out (an infinite loop is
caught); the score is killed / (killed + survived + suspicious).  A survivor that was not
run against the tests of the last run is marked: mutmut 2.5.1 looks cached statuses up by
the text of a mutant's line, so a re-run skips a survivor whose line repeats an earlier,
killed line's text (``mutmut run ID`` runs it).
"""

from __future__ import annotations

import sqlite3
import sys
from collections import Counter
from pathlib import Path

KILLED = {"ok_killed", "bad_timeout"}


def main(argv: list[str]) -> int:
    cache = Path(".mutmut-cache")
    if not cache.exists():
        print("no .mutmut-cache: run `make mutation` first", file=sys.stderr)
        return 1
    db = sqlite3.connect(cache)
    last = db.execute("SELECT value FROM miscdata WHERE key = 'hash_of_tests'").fetchone()
    rows = db.execute(
        "SELECT s.filename, l.line_number, l.line, m.status, m.id, m.tested_against_hash"
        " FROM mutant m"
        " JOIN line l ON m.line = l.id JOIN sourcefile s ON l.sourcefile = s.id"
        " ORDER BY s.filename, l.line_number, m.'index'"
    ).fetchall()
    per_file: dict[str, Counter[str]] = {}
    survivors: list[tuple[str, int, str, int, bool]] = []
    for filename, line_number, line, status, mutant_id, tested_against in rows:
        per_file.setdefault(filename, Counter())[status] += 1
        if status in {"bad_survived", "ok_suspicious"}:
            stale = last is not None and tested_against != last[0]
            survivors.append((filename, line_number + 1, line.strip(), mutant_id, stale))
    print("| module | mutants | killed | survived | score |")
    print("|---|---:|---:|---:|---:|")
    for filename, counts in sorted(per_file.items()):
        killed = sum(counts[s] for s in KILLED)
        survived = counts["bad_survived"] + counts["ok_suspicious"]
        tested = killed + survived
        score = f"{100 * killed / tested:.1f} %" if tested else "-"
        untested = f" ({counts['untested']} not run)" if counts["untested"] else ""
        print(f"| `{filename}` | {tested}{untested} | {killed} | {survived} | {score} |")
    if survivors:
        print("\nsurviving mutants (`.venv/bin/mutmut show ID` prints one):")
        for filename, line_number, line, mutant_id, stale in survivors:
            note = "  (not run against the last run's tests: `mutmut run ID`)" if stale else ""
            print(f"  {mutant_id:5d} {filename}:{line_number}: {line}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
