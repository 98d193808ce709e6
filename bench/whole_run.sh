#!/bin/sh
# Where kiln's whole CNN run goes besides its steps: the kiln row of
# bench/anchors.sh (bench/cnn_bench.ini, batch 128, --steps + 20 steps,
# train.eval=0, one final checkpoint), timed from exec to exit, split into
#   start    the process before the trainer (exec, libraries, plugins, config)
#            plus its end (freeing, exit): wall - setup - fit
#   setup    setup_s of metrics.jsonl (device, data, model: plans, oneDNN
#            primitives, the tune, initial weights; loaders)
#   steps    the steps at the run's own steady rate (steps after the first 20)
#   warm+ckpt  fit_s - steps: the first steps' extra time and the checkpoint
# with user and sys CPU seconds; a before build (KILN_BEFORE, a built tree)
# interleaved with it (each round runs both, in turn), each with its own
# scratch XDG_CACHE_HOME filled by an untimed first run (tune cache and idx
# cache warm, as in anchors.sh's quiet-window use).  Medians.
#
# Usage: bench/whole_run.sh [--runs N] [--steps N] [--bench LIST]
#   --runs N     rounds (default 5)
#   --steps N    as anchors.sh's --steps (default 60: 80 steps run)
#   --bench LIST cnn-nchw,cnn-nhwc,cnn-bf16 (the default: all three)
# Environment: KILN (./kiln), KILN_BEFORE (a built tree; no before rows if
# unset), PYTHON (python3).  Run from the top of a built source tree.
# Prints a markdown table and the load averages.

set -eu

RUNS=5
STEPS=60
BENCHES=cnn-nchw,cnn-nhwc,cnn-bf16
while [ $# -gt 0 ]; do
    case $1 in
        --runs) [ $# -ge 2 ] || { echo "whole_run.sh: --runs needs N" >&2; exit 2; }; RUNS=$2; shift 2 ;;
        --steps) [ $# -ge 2 ] || { echo "whole_run.sh: --steps needs N" >&2; exit 2; }; STEPS=$2; shift 2 ;;
        --bench) [ $# -ge 2 ] || { echo "whole_run.sh: --bench needs a list" >&2; exit 2; }; BENCHES=$2; shift 2 ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "whole_run.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
for v in "runs:$RUNS" "steps:$STEPS"; do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "whole_run.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
. "$HERE/common.sh"
real_kiln
[ -x "$KILN" ] || { echo "whole_run.sh: $KILN not found (set KILN=)" >&2; exit 1; }
NEW=$KILN
BEFORE=
if [ -n "${KILN_BEFORE:-}" ]; then
    BEFORE=$KILN_BEFORE/.libs/kiln
    [ -x "$BEFORE" ] || { echo "whole_run.sh: no $BEFORE (KILN_BEFORE: a built tree)" >&2; exit 1; }
fi
bench_tmpdir whole
KSTEPS=$((STEPS + 20))

# one VARIANT BENCH ROUND: one kiln run; a line "variant bench wall user sys
# setup fit steady" to $TMP/res (round 0: untimed, fills the caches)
one() {
    layout=nchw prec=fp32
    [ "$2" = cnn-nhwc ] && layout=nhwc
    [ "$2" = cnn-bf16 ] && prec=bf16
    if [ "$1" = before ]; then
        set -- "$@" env KILN_PLUGIN_PATH="$KILN_BEFORE/plugins/.libs" \
            LD_LIBRARY_PATH="$KILN_BEFORE/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BEFORE"
    else
        set -- "$@" env "$NEW"
    fi
    v=$1 b=$2 r=$3
    shift 3
    rm -rf "$TMP/out"
    mkdir -p "$TMP/xdg-$v"
    XDG_CACHE_HOME="$TMP/xdg-$v" /usr/bin/time -f '%e %U %S' -o "$TMP/time" "$@" train \
        "$HERE/cnn_bench.ini" run.threads=2 train.eval=0 run.out_dir="$TMP/out" train.log_every=20 \
        model.layout=$layout run.precision=$prec train.batch=128 data.limit=$((KSTEPS * 128)) \
        train.max_steps=$KSTEPS > /dev/null 2> "$TMP/err" ||
        { echo "whole_run.sh: $v $b failed: $(tail -n 1 "$TMP/err")" >&2; return 0; }
    [ "$r" = 0 ] && return 0
    "$PYTHON" - "$TMP/out/metrics.jsonl" "$v $b $(cat "$TMP/time")" >> "$TMP/res" <<'EOF'
import json, sys
pts, fin = {}, {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("event") == "train":
        pts[d["step"]] = d["time"]
    if d.get("event") == "final":
        fin = d
last = max(pts)
steady = (last - 20) * 128 / (pts[last] - pts[20])
print(sys.argv[2], fin["setup_s"], fin["fit_s"], steady)
EOF
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for b in $(echo "$BENCHES" | tr ',' ' '); do
    r=0
    while [ "$r" -le "$RUNS" ]; do
        one new "$b" "$r"
        [ -z "$BEFORE" ] || one before "$b" "$r"
        r=$((r + 1))
    done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), 2 threads, $KSTEPS steps of 128, median of $RUNS interleaved rounds"
echo "load average before: $LOAD0, after: $LOAD1"
"$PYTHON" - "$TMP/res" "$KSTEPS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, b, wall, user, sys_, setup, fit, steady = line.split()
    rows.setdefault((b, v), []).append([float(x) for x in (wall, user, sys_, setup, fit, steady)])
n = int(sys.argv[2])
print("\n| bench | build | wall s | start+exit | setup | steps (steady) | warm-up+ckpt | "
      "user+sys s | whole samples/s | steady samples/s |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for (b, v), rs in sorted(rows.items()):
    m = lambda f: statistics.median(f(r) for r in rs)
    steps = n * 128 / m(lambda r: r[5])
    print(f"| {b} | {v} | {m(lambda r: r[0]):.3f} | {m(lambda r: r[0] - r[3] - r[4]):.3f} | "
          f"{m(lambda r: r[3]):.3f} | {steps:.3f} | {m(lambda r: r[4]) - steps:.3f} | "
          f"{m(lambda r: r[1] + r[2]):.2f} | {n * 128 / m(lambda r: r[0]):,.0f} | "
          f"{m(lambda r: r[5]):,.0f} |")
EOF
