#!/usr/bin/env bash
# Mutation testing of the modules where at-least-once delivery is decided (`make mutation`;
# docs/testing.md, "Mutation testing").  mutmut 2 changes one module at a time in place,
# runs that module's fast in-process tests against each mutant and keeps its results in
# .mutmut-cache; this script then prints the score per module.
#
#   bash scripts/mutation.sh                 # every module below
#   bash scripts/mutation.sh channel cursor  # only these (names from MODULES)
#
# Not part of `make test`: it runs the chosen tests once per mutant (minutes per module).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
# pytest without the repository's conftest plugins (brokers, browsers, gateways): the tests
# below are self-contained, and a run per mutant starts in about a second instead of four
PYTEST="$BIN/python -m pytest -x -q -p no:cacheprovider -p no:wsnmom -p no:randomly --noconftest"

# module name -> "path to mutate|tests that must kill its mutants"
declare -A MODULES=(
    [channel]="core/channel.py|tests/core/test_channel_mutants.py"
    [pull_buffer]="core/pull_buffer.py|tests/core/test_pull_buffer_mutants.py"
    [cursor]="adapters/logbase/cursor.py|tests/adapters/test_logbase_cursor_mutants.py"
    [pull_points]="core/pull_points.py|tests/core/test_pull_points_mutants.py"
    [subscriptions]="core/subscriptions.py|tests/core/test_subscriptions_mutants.py"
    [mqtt_session]="adapters/mqtt/session.py|tests/adapters/test_mqtt_session_mutants.py"
)
ORDER=(channel pull_buffer cursor pull_points subscriptions mqtt_session)

selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=("${ORDER[@]}")

for name in "${selected[@]}"; do
    entry=${MODULES[$name]:-}
    if [ -z "$entry" ]; then
        echo "unknown module $name (one of: ${ORDER[*]})" >&2
        exit 2
    fi
    path=${entry%%|*}
    tests=${entry#*|}
    # mutmut writes each mutant into the file itself: never start on uncommitted changes,
    # so that an interrupted run is undone with `git checkout -- $path`
    if ! git diff --quiet -- "$path"; then
        echo "$path has uncommitted changes; commit or stash them first" >&2
        exit 2
    fi
    echo "== $name: $path against $tests"
    # string mutations only change log and fault texts; a timeout gets generous headroom
    # because the machine is shared (a mutant that loops still times out)
    nice -n "${NICE:-10}" "$BIN/mutmut" run \
        --paths-to-mutate "$path" \
        --runner "$PYTEST $tests" \
        --tests-dir tests \
        --disable-mutation-types string,fstring \
        --test-time-multiplier 4 --test-time-base 15 \
        --no-progress --simple-output || true
    git diff --quiet -- "$path" || {
        echo "mutmut left $path changed; restoring it" >&2
        git checkout -- "$path"
    }
done

"$BIN/python" scripts/mutation_report.py
