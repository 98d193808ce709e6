#!/bin/sh
# Where a CNN training step's convolution time goes, at 1 thread (--threads T:
# T threads): oneDNN's
# primitives (ONEDNN_VERBOSE=2: each reorder and convolution of a step, the
# median over steps 3..S of its wall ms) and the CPU seconds a step (user +
# sys of a run of S+3 steps minus a run of 3, over S), for this build and,
# with --before DIR, a second cpu plugin (DIR/kiln-cpu.so, loaded through
# KILN_PLUGIN_PATH: e.g. the plugin built before a change), alternated; with
# --pytorch ARGS, PyTorch eager's CPU seconds a step of the same model
# (bench/pytorch_cnn.py ARGS: the difference of the train_cpu_s it prints,
# its steps' process CPU time, of runs of S+4 and 4 steps, over S; not the
# whole process's, whose start-up varies by more than S steps take), in
# the same rounds.  Every CPU-seconds run has OMP_WAIT_POLICY=PASSIVE, so that
# at 2 or more threads an idle thread's spinning is not counted: the figure
# is the work a step takes, which a neighbour's load inflates little.
#
# Usage: bench/conv_steps.sh [--ini INI] [--runs N] [--steps S] [--threads T] [--before DIR]
#                            [section.key=value ...]
#   --ini INI     model (default bench/cnn_bench.ini, batch 128)
#   --runs N      rounds of the CPU-seconds runs (default 3; medians)
#   --steps S     steps a run adds over the 3-step run (default 20)
#   --threads T   threads of every run (default 1)
#   --before DIR  a directory holding another kiln-cpu.so to compare
#   --pytorch ARGS  also PyTorch eager, bench/pytorch_cnn.py ARGS (one word:
#                 e.g. --pytorch "--layout nhwc"; --threads is added)
#   overrides     given to every run, e.g. model.layout=nchw (no spaces)
# Environment: KILN (default ./kiln); PYTHON (default python3; with
#   --pytorch a Python with PyTorch, e.g. $KILN_VENV/bin/python).  Run from the top of the source tree.

set -eu
INI=bench/cnn_bench.ini
RUNS=3
STEPS=20
THREADS=1
BEFORE=
PYTORCH=
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
. "$HERE/common.sh"

while [ $# -gt 0 ]; do
    case $1 in
        --ini) [ $# -ge 2 ] || usage; INI=$2; shift 2 ;;
        --before) [ $# -ge 2 ] || usage; BEFORE=$2; shift 2 ;;
        --pytorch) [ $# -ge 2 ] || usage; PYTORCH=$2; shift 2 ;;
        -h|--help) usage ;;
        --*) bench_opt "$@" || { echo "conv_steps.sh: unknown argument: $1" >&2; usage; }
             shift "$NSHIFT" ;;
        *) break ;;
    esac
done
case "$RUNS:$STEPS:$THREADS" in *[!0-9:]*|:*|*:|*::*|0:*|*:0|*:0:*) echo "conv_steps.sh: --runs, --steps and --threads are positive integers" >&2; exit 2 ;; esac
if [ -n "$BEFORE" ] && [ ! -f "$BEFORE/kiln-cpu.so" ]; then
    echo "conv_steps.sh: no $BEFORE/kiln-cpu.so" >&2; exit 1
fi
bench_tmpdir conv-steps
BUILDS="this${BEFORE:+ before}"

# run BUILD N PREFIX...: PREFIX (a command that runs the rest, e.g. env
# VAR=1) running N steps of INI on one thread with BUILD's plugin; BUILD
# pytorch: PyTorch's N-2 steps after its 3 warm-up steps
run() {
    b=$1 n=$2; shift 2
    if [ "$b" = pytorch ]; then
        # shellcheck disable=SC2086 # PYTORCH: pytorch_cnn.py's words as given
        "$@" "$PYTHON" "$HERE/pytorch_cnn.py" $PYTORCH --threads "$THREADS" --warmup-steps 3 \
            --steps $((n - 2)) --eval-samples 0
        return
    fi
    pp=; [ "$b" = this ] || pp=$BEFORE
    # shellcheck disable=SC2086 # OVERRIDES: the key=value words as given
    "$@" env ${pp:+KILN_PLUGIN_PATH=$pp} "$KILN" train "$INI" train.batch=128 run.threads="$THREADS" \
        train.eval=0 train.max_steps="$n" data.limit=$((n * 128)) run.out_dir= $OVERRIDES
}
OVERRIDES="$*"

echo "start: $(date -u +%H:%M:%S) loadavg $(cat /proc/loadavg)"
for b in $BUILDS; do
    run "$b" $((STEPS + 3)) env ONEDNN_VERBOSE=2 2>/dev/null | grep '_verbose,exec' > "$TMP/verbose-$b" || true
    echo
    echo "$b build: oneDNN primitives of a step (wall ms, median over steps 3..$((STEPS + 2)))"
    "$PYTHON" - "$TMP/verbose-$b" <<'PY'
import statistics, sys
steps, first = [], None
for line in open(sys.argv[1]):
    f = line.rstrip().split(",")
    if len(f) < 8:
        continue
    # a step starts at the first forward convolution's shape
    if f[3] == "convolution" and f[5] == "forward_training" and first in (None, f[-2]):
        first = f[-2]
        steps.append([])
    if steps and f[3] in ("reorder", "convolution"):
        fmt = f[6].split()
        what = f[5] if f[3] == "convolution" else \
            fmt[0].split(":")[-2] + ">" + fmt[1].split(":")[-2] if len(fmt) > 1 else ""
        steps[-1].append((f[3], f[-2].split("_iw")[0], what, float(f[-1])))
steps = [s for s in steps[2:-1] if len(s) == len(steps[2])] if len(steps) > 3 else steps
if not steps:
    sys.exit("no oneDNN steps found (is ONEDNN_VERBOSE honoured?)")
med = lambda k: statistics.median(s[k][3] for s in steps)
for k, (kind, shape, what, _) in enumerate(steps[0]):
    print("  %-11s %-38s %-18s %8.2f" % (kind, shape, what, med(k)))
for kind in ("reorder", "convolution"):
    ks = [k for k, r in enumerate(steps[0]) if r[0] == kind]
    print("  %d %ss a step, %.2f ms (sum of the medians)" % (len(ks), kind, sum(med(k) for k in ks)))
PY
done

echo
BUILDS="$BUILDS${PYTORCH:+ pytorch}"
r=1
while [ "$r" -le "$RUNS" ]; do
    for b in $BUILDS; do
        for n in 3 $((STEPS + 3)); do
            if [ "$b" = pytorch ]; then
                run "$b" "$n" env OMP_WAIT_POLICY=PASSIVE 2> /dev/null | grep '^{' | tail -n 1 |
                    "$PYTHON" -c 'import json, sys; print(sys.argv[1], json.load(sys.stdin)["train_cpu_s"])' \
                        "$n" >> "$TMP/cpu-$b-$r" || true
                continue
            fi
            run "$b" "$n" env OMP_WAIT_POLICY=PASSIVE /usr/bin/time -f '%U %S' -o "$TMP/t" > /dev/null 2>&1 || true
            awk -v n="$n" '{ print n, $1 + $2 }' "$TMP/t" >> "$TMP/cpu-$b-$r"
        done
        awk -v s="$STEPS" '{ t[NR] = $2 } END { printf "%.4f\n", (t[2] - t[1]) / s }' \
            "$TMP/cpu-$b-$r" >> "$TMP/cpu-$b"
    done
    r=$((r + 1))
done
echo "CPU seconds a step at $THREADS thread(s) ($RUNS rounds of ${STEPS}-step differences; end loadavg $(cut -d' ' -f1-3 /proc/loadavg)):"
for b in $BUILDS; do
    printf '  %-7s median %s  (rounds: %s)\n' "$b" "$(median < "$TMP/cpu-$b")" "$(tr '\n' ' ' < "$TMP/cpu-$b")"
done
