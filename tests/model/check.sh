#!/usr/bin/env bash
# Checks the liveness model with Quint's TypeScript simulator (fixed seeds: every run is
# the same run). Exits non-zero, printing the trace, if the protocol breaks an invariant;
# and if a variant of variants.qnt no longer breaks the invariant it must break, or a run of
# the protocol never reaches one of its witnesses (a model that cannot fail checks nothing).
# `make model` runs it after `npm ci`; the full output of each check is in out/.
set -euo pipefail
cd "$(dirname "$0")"

QUINT=node_modules/.bin/quint
SEED=${MODEL_SEED:-0x5eed}
STEPS=90             # events in one run
PROTOCOL_SAMPLES=200 # runs of the protocol, all checked
VARIANT_SAMPLES=1000 # the most runs a variant gets to break its invariant
INVARIANTS="outcomesFenced healthyKeepJobs fencedBeforeTaken dueJobsClaimable"
WITNESSES="fleetMixesSettings nameShared staleRescued hungRescued takenOver reRegistered
  zombieRunning dueWhileNoLeader"
mkdir -p out
failed=0

run() { # FILE MAIN SAMPLES OUT ARGS...: one quint run; its output in OUT
    local file=$1 main=$2 samples=$3 out=$4
    shift 4
    # The file comes first: a list option (--witnesses) would take it for one of its own.
    "$QUINT" run "$file" --backend=typescript --main="$main" --seed="$SEED" \
        --max-samples="$samples" --max-steps="$STEPS" "$@" >"$out" 2>&1
}

seconds() { echo $(( $(date +%s) - $1 )); }

# The protocol keeps every invariant, and reaches every witness.
t0=$(date +%s)
out=out/protocol.txt
# shellcheck disable=SC2086 # INVARIANTS and WITNESSES are lists of names
if run liveness.qnt protocol "$PROTOCOL_SAMPLES" "$out" --invariants $INVARIANTS \
    --witnesses $WITNESSES; then
    never=$(grep -E 'witnessed in 0 trace' "$out" || true)
    if [ -n "$never" ]; then
        echo "FAIL protocol: a witness was never reached in $PROTOCOL_SAMPLES runs:"
        echo "$never"
        failed=1
    else
        echo "ok   protocol keeps every invariant in $PROTOCOL_SAMPLES runs of $STEPS steps ($(seconds "$t0") s)"
        grep -E 'witnessed in' "$out" | sed 's/^/       /'
    fi
else
    cat "$out"
    echo "FAIL protocol: the run above breaks an invariant (or the model does not load): $(
        grep -o '❌ .*' "$out" | tr '\n' ' ')"
    failed=1
fi

# Each variant breaks the invariant it must break.
for check in leaderBounds:healthyKeepJobs leaderBounds:fencedBeforeTaken \
    leaderPromotes:dueJobsClaimable handBackWaits:dueJobsClaimable \
    unfencedOutcomes:outcomesFenced; do
    main=${check%%:*} invariant=${check#*:}
    t0=$(date +%s)
    out=out/$main-$invariant.txt
    if run variants.qnt "$main" "$VARIANT_SAMPLES" "$out" --invariant="$invariant"; then
        echo "FAIL variant $main no longer breaks $invariant in $VARIANT_SAMPLES runs"
        failed=1
    elif grep -q '^\[violation\]' "$out"; then
        steps=$(grep -cE '^\[State [0-9]+\]' "$out" || true)
        echo "ok   variant $main breaks $invariant (a run of $((steps - 1)) steps; $(seconds "$t0") s; $out)"
    else
        echo "FAIL variant $main: quint did not run:"
        cat "$out"
        failed=1
    fi
done

exit "$failed"
