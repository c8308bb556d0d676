#!/usr/bin/env bash
# Mutation testing of the modules where at-least-once delivery is decided (`make mutation`;
# docs/testing.md, "Mutation testing").  mutmut 2 writes one mutant at a time into the module
# itself, runs that module's fast in-process tests against it (through the fork server
# scripts/mutation_runner.py: a second per mutant instead of a new pytest process) and keeps
# its results in .mutmut-cache; scripts/mutation_report.py then prints the score per module.
#
#   bash scripts/mutation.sh                 # every module below
#   bash scripts/mutation.sh channel cursor  # only these (names from MODULES)
#
# Not part of `make test`: it runs the chosen tests once per mutant (minutes per module).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
# the tests are self-contained: no conftest plugins (brokers, browsers, gateways)
PYTEST_ARGS="-x -q -p no:cacheprovider --noconftest"

# module name -> "import name|path to mutate|tests that must kill its mutants|scope", where
# scope (optional) names the functions to mutate (the settling code of a larger module);
# tests under tests/core/ that use its conftest's broker fixtures run with conftests
declare -A MODULES=(
    # core/channel.py and its parts (channel_state, channel_give_up, backoff), against the same tests
    [channel]="wsnmom.core.channel|core/channel.py|tests/core/test_channel_mutants.py tests/core/test_channel_restart_mutants.py tests/core/test_channel_feature_mutants.py|"
    [channel_state]="wsnmom.core.channel_state|core/channel_state.py|tests/core/test_channel_mutants.py tests/core/test_channel_restart_mutants.py tests/core/test_channel_feature_mutants.py|"
    [channel_give_up]="wsnmom.core.channel_give_up|core/channel_give_up.py|tests/core/test_channel_mutants.py tests/core/test_channel_restart_mutants.py tests/core/test_channel_feature_mutants.py|"
    [backoff]="wsnmom.core.backoff|core/backoff.py|tests/core/test_channel_mutants.py tests/core/test_channel_restart_mutants.py tests/core/test_channel_feature_mutants.py|"
    [unordered]="wsnmom.core.unordered|core/unordered.py|tests/core/test_unordered_channel.py|"
    [pull_buffer]="wsnmom.core.pull_buffer|core/pull_buffer.py|tests/core/test_pull_buffer_mutants.py|"
    [cursor]="wsnmom.adapters.logbase.cursor|adapters/logbase/cursor.py|tests/adapters/test_logbase_engine.py tests/adapters/test_logbase_cursor_mutants.py|"
    [mqtt_session]="wsnmom.adapters.mqtt.session|adapters/mqtt/session.py|tests/adapters/test_mqtt_session_mutants.py|Session._message_cb Session._disconnected_cb"
    [mqtt_barriers]="wsnmom.adapters.mqtt.barriers|adapters/mqtt/barriers.py|tests/adapters/test_mqtt_session_mutants.py|Barriers._send_barrier sentinel_topic"
    [mqtt_ingest]="wsnmom.adapters.mqtt.ingest|adapters/mqtt/ingest.py|tests/adapters/test_mqtt_session_mutants.py|_topic_of Ingest._process Ingest._twin Ingest._convert Ingest._commit Ingest._store Ingest._arrived _run_barrier"
    [pull_points]="wsnmom.core.pull_points|core/pull_points.py|tests/core/test_pull_points.py tests/core/test_pull_feeds.py tests/core/test_operations.py|"
    # core/subscriptions.py and its parts (subscription_changes, subscription_ends), against the same tests
    [subscriptions]="wsnmom.core.subscriptions|core/subscriptions.py|tests/core/test_subscriptions.py tests/core/test_termination.py tests/core/test_operations.py tests/core/test_direct_pull_routing.py tests/core/test_access.py tests/core/test_delivery.py|"
    [subscription_changes]="wsnmom.core.subscription_changes|core/subscription_changes.py|tests/core/test_subscriptions.py tests/core/test_termination.py tests/core/test_operations.py tests/core/test_direct_pull_routing.py tests/core/test_access.py tests/core/test_delivery.py|"
    [subscription_ends]="wsnmom.core.subscription_ends|core/subscription_ends.py|tests/core/test_subscriptions.py tests/core/test_termination.py tests/core/test_operations.py tests/core/test_direct_pull_routing.py tests/core/test_access.py tests/core/test_delivery.py|"
)
ORDER=(channel channel_state channel_give_up backoff unordered pull_buffer cursor mqtt_session mqtt_barriers mqtt_ingest pull_points subscriptions subscription_changes subscription_ends)

selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=("${ORDER[@]}")

SOCKET=$(mktemp -u /tmp/wsnmom-mutation.XXXXXX)
server=""
current=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null || true
    rm -f "$SOCKET" "$SOCKET.patch"
    # an interrupted mutmut leaves its mutant (and a .bak) behind
    if [ -n "$current" ]; then
        rm -f "$current.bak"
        git diff --quiet -- "$current" || git checkout -- "$current"
    fi
}
trap cleanup EXIT

for name in "${selected[@]}"; do
    entry=${MODULES[$name]:-}
    if [ -z "$entry" ]; then
        echo "unknown module $name (one of: ${ORDER[*]})" >&2
        exit 2
    fi
    IFS='|' read -r module path tests scope <<<"$entry"
    args=$PYTEST_ARGS
    case $tests in *_mutants.py) ;; *) args=${args/ --noconftest/} ;; esac
    scope_args=()
    if [ -n "$scope" ]; then
        # shellcheck disable=SC2086  # scope is a list of function names
        "$BIN/python" scripts/mutation_scope.py "$path" $scope >"$SOCKET.patch"
        scope_args=(--use-patch-file "$SOCKET.patch")
    fi
    # mutmut writes each mutant into the file itself: never start on uncommitted changes,
    # so that an interrupted run can be undone with `git checkout`
    if ! git diff --quiet -- "$path"; then
        echo "$path has uncommitted changes; commit or stash them first" >&2
        exit 2
    fi
    echo "== $name: $path against $tests"
    current=$path
    nice -n "${NICE:-10}" "$BIN/python" scripts/mutation_runner.py serve "$SOCKET" "$module" "$path" &
    server=$!
    until [ -S "$SOCKET" ]; do
        kill -0 "$server" 2>/dev/null || { echo "the mutation runner did not start" >&2; exit 1; }
        sleep 0.2
    done
    # string mutations only change log and fault texts; timeouts get headroom because the
    # machine may be shared (a mutant that loops still times out)
    nice -n "${NICE:-10}" "$BIN/mutmut" run \
        --paths-to-mutate "$path" \
        --runner "$BIN/python scripts/mutation_runner.py run $SOCKET $args $tests" \
        "${scope_args[@]}" \
        --tests-dir tests \
        --disable-mutation-types string,fstring \
        --test-time-multiplier 5 --test-time-base 20 \
        --no-progress --simple-output || true
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
    rm -f "$SOCKET" "$SOCKET.patch" "$path.bak"
    git diff --quiet -- "$path" || git checkout -- "$path"
    current=""
done

"$BIN/python" scripts/mutation_report.py
