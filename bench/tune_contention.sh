#!/bin/sh
# bench/tune_contention.sh - what a first run on a busy machine leaves in the
# CPU plugin's tune cache for the runs after it (plugins/cpu/tune.c; issue
# 22; docs/PERFORMANCE.md, "Session 14: tune cache under contention").
#
# Each round, for each build (KILN, and KILN_BEFORE when set, interleaved):
# a fresh tune cache file; one cold bf16 CNN run while a shell busy loop
# (`while :; do :; done`) keeps a core busy: it times the kernel choices and
# caches them; the loop killed; then --quiet runs on that cache.  Reported
# per build: how many choices the cold run timed and marked provisional,
# how many the quiet runs re-timed, and the median samples/s of the quiet
# runs (train_samples_per_s).  /proc/loadavg before and after.
#
# Usage: bench/tune_contention.sh [--runs N] [--quiet N] [--steps N]
#   --runs N    rounds (default 3)
#   --quiet N   quiet runs after each cold one (default 2; the last counts)
#   --steps N   steps of each run (default 60)
# Environment: KILN (default ./kiln), KILN_BEFORE (e.g. main's build, with
# KILN_PLUGIN_PATH_BEFORE its plugins/.libs), TMPDIR, XDG_CACHE_HOME (kiln's
# IDX data and plugin probe; default: the run's own directory, removed on exit).
set -eu
RUNS=3 QUIET=2 STEPS=60
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --quiet) QUIET=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--quiet N] [--steps N]" >&2; exit 2 ;;
    esac
done
KILN=${KILN:-./kiln}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/tune_contention.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
# kiln's other caches (inflated IDX data, the plugin probe) in DIR too, not
# the user's ~/.cache (as bench/common.sh does), unless the caller set one
if [ -z "${XDG_CACHE_HOME:-}" ]; then
    XDG_CACHE_HOME=$DIR/cache
    export XDG_CACHE_HOME
fi
ARGS="bench/cnn_bench.ini model.layout=nchw run.precision=bf16 train.batch=128 data.limit=$((128 * STEPS)) train.max_steps=$STEPS train.eval=0 run.out_dir="

# one NAME BIN PLUGINPATH CACHE LOG: a run, its log in LOG, samples/s out
one() {
    # shellcheck disable=SC2086
    KILN_PLUGIN_PATH=$3 "$2" train $ARGS "plugin.cpu.tune_cache=$4" >"$5" 2>&1 || {
        echo "$1: run failed: $(tail -3 "$5")" >&2; exit 1; }
    sed -n 's/.*"train_samples_per_s": \([0-9.e+-]*\).*/\1/p' "$5" | tail -1
}

echo "start: loadavg $(cat /proc/loadavg)"
builds="new"
[ -n "${KILN_BEFORE:-}" ] && builds="before new"
for r in $(seq 1 "$RUNS"); do
    for b in $builds; do
        if [ "$b" = new ]; then bin=$KILN pp=${KILN_PLUGIN_PATH:-}; else bin=$KILN_BEFORE pp=${KILN_PLUGIN_PATH_BEFORE:-}; fi
        cache="$DIR/$b-$r.bin"
        sh -c 'while :; do :; done' &
        spin=$!
        cold=$(one "$b cold" "$bin" "$pp" "$cache" "$DIR/$b-$r-cold.log")
        kill "$spin"
        wait "$spin" 2>/dev/null || true
        timed=$(grep -cE 'kernel [0-9.]+ ms, f32 kernel' "$DIR/$b-$r-cold.log" || true)
        prov=$(grep -E 'kernel [0-9.]+ ms, f32 kernel' "$DIR/$b-$r-cold.log" | grep -c provisional || true)
        conv1=$(grep -F 'bf16 CONV bf16[128, 1, 28, 28]' "$DIR/$b-$r-cold.log" | sed 's/.*: the \([a-z0-9]*\) kernel.*/\1/' | head -1)
        for q in $(seq 1 "$QUIET"); do
            rate=$(one "$b quiet" "$bin" "$pp" "$cache" "$DIR/$b-$r-q$q.log")
            re=$(grep -cE 'kernel [0-9.]+ ms, f32 kernel' "$DIR/$b-$r-q$q.log" || true)
            probe=$(sed -n 's/.*provisional choices; \(waited [0-9.]* s a second\).*: \([a-z]*\),.*/\1: \2/p' "$DIR/$b-$r-q$q.log" | head -1)
            c1=$(grep -F 'bf16 CONV bf16[128, 1, 28, 28]' "$DIR/$b-$r-q$q.log" | sed 's/.*: the \([a-z0-9]*\) kernel.*/\1/' | head -1)
            echo "round $r $b: cold $cold samples/s, timed $timed ($prov provisional, conv1 fwd ${conv1:-?}); quiet $q: $rate samples/s, re-timed $re${c1:+ (conv1 fwd $c1)}${probe:+, probe $probe}; loadavg $(cut -d' ' -f1 /proc/loadavg)"
            echo "$rate" >>"$DIR/$b-q$q.rates"
        done
    done
done
for b in $builds; do
    echo "$b: median samples/s of quiet run $QUIET: $(sort -g "$DIR/$b-q$QUIET.rates" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}') ($(tr '\n' ' ' <"$DIR/$b-q$QUIET.rates"))"
done
echo "end: loadavg $(cat /proc/loadavg)"
