#!/bin/sh
# Where a kiln train run's time outside its fit goes, two builds A/B: runs of
# bench/mlp_bench.ini (train.eval=0) alternate A and B, the order swapped
# every round; each run's process wall (date around it), set-up phases
# (KILN_LOG_LEVEL=debug's "set-up" line: device, data, model) and fit_s
# (metrics.jsonl's final line); medians.  The caches are common.sh's (idx
# the user's) but for the plugin probe's, one a build (one shared file would
# be rewritten by each build's run in turn: every run would probe); an
# untimed run of each build fills them first.
#
#   A/kiln train bench/mlp_bench.ini train.eval=0 train.max_steps=STEPS
#
# Usage: bench/setup_ab.sh A_DIR B_DIR [--runs N] [--steps S]
#   A_DIR, B_DIR  build trees (their kiln, or .libs/kiln with .libs first
#                 on LD_LIBRARY_PATH when kiln is libtool's wrapper)
#   --runs N      rounds (default 10); --steps S: max_steps (default 1:
#                 the set-up and one step; 0: the whole epoch)
# Run from the top of the source tree.  Prints a markdown table and the
# load averages.

set -eu

[ $# -ge 2 ] || { sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2; }
A=$1 B=$2
shift 2
RUNS=10 STEPS=1
while [ $# -gt 0 ]; do
    case $1 in
        --runs) [ $# -ge 2 ] || { echo "setup_ab.sh: --runs needs N" >&2; exit 2; }; RUNS=$2; shift 2 ;;
        --steps) [ $# -ge 2 ] || { echo "setup_ab.sh: --steps needs S" >&2; exit 2; }; STEPS=$2; shift 2 ;;
        *) echo "setup_ab.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
. "$(dirname "$0")/common.sh"
bench_tmpdir setup_ab
INI=bench/mlp_bench.ini
LD0=${LD_LIBRARY_PATH:-}

# one NAME DIR: append "wall setup device data model fit" of a run to $TMP/NAME
one() {
    KILN=$2/kiln
    LD_LIBRARY_PATH=$LD0
    real_kiln
    [ -x "$KILN" ] || { echo "setup_ab.sh: no kiln in $2" >&2; exit 1; }
    t0=$(date +%s%N)
    KILN_PROBE_CACHE=$TMP/probe-$1 KILN_LOG_LEVEL=debug "$KILN" train "$INI" train.eval=0 train.max_steps="$STEPS" \
        train.overwrite=1 run.out_dir="$TMP/out-$1" >/dev/null 2>"$TMP/err" ||
        { echo "setup_ab.sh: the $1 run failed:" >&2; cat "$TMP/err" >&2; exit 1; }
    t1=$(date +%s%N)
    ph=$(sed -n 's/.*set-up \([0-9.]*\) s:.*device \([0-9.]*\), data \([0-9.]*\), model \([0-9.]*\),.*/\1 \2 \3 \4/p' "$TMP/err")
    fit=$(tail -1 "$TMP/out-$1/metrics.jsonl" | sed -n 's/.*"fit_s":\([0-9.e+-]*\).*/\1/p')
    [ -n "$ph" ] && [ -n "$fit" ] || { echo "setup_ab.sh: no set-up line or fit_s from $2" >&2; exit 1; }
    echo "$(awk -v ns=$((t1 - t0)) 'BEGIN { print ns / 1e9 }') $ph $fit" >> "$TMP/$1"
}

load0=$(cat /proc/loadavg)
one A "$A" && one B "$B" && : > "$TMP/A" && : > "$TMP/B" # fill the caches; not timed
i=1
while [ "$i" -le "$RUNS" ]; do
    if [ $((i % 2)) = 1 ]; then one A "$A"; one B "$B"; else one B "$B"; one A "$A"; fi
    i=$((i + 1))
done
col() { awk -v c="$2" '{ print $c }' "$TMP/$1" | median; }
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, medians of $RUNS interleaved rounds"
echo "load average before: $load0; after: $(cat /proc/loadavg)"
echo "command: KILN_LOG_LEVEL=debug kiln train $INI train.eval=0 train.max_steps=$STEPS"
echo "A = $A, B = $B"
echo
echo "| build | wall s | set-up s | device | data | model | fit_s | wall - fit s |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for m in A B; do
    echo "| $m | $(col $m 1) | $(col $m 2) | $(col $m 3) | $(col $m 4) | $(col $m 5) | $(col $m 6) | $(awk '{ print $1 - $6 }' "$TMP/$m" | median) |"
done
