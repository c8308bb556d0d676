"""wsnmom benchmarks: ``python -m bench`` (or ``make bench``).

Runs the scenarios of docs/performance.md against the embedded adapter and every middleware
that can be started here, reports each machine-dependent figure next to a baseline measured
in the same run on the same machine, prints a table and writes ``bench/results/latest.json``.
``--check`` compares the ratios with their targets and exits non-zero when one is missed.
"""
