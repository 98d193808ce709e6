#!/bin/sh
# The fixed cost of a kiln run: a 1-step Fashion-MNIST MLP run's CPU seconds
# (user, sys) and wall time under /usr/bin/time, with the start-up caches
# (docs/data.md "idx", docs/plugins.md "The probe's answers are kept") off
# and on, interleaved (each round runs both, in turn); medians.
#   cold   [data] / [data.eval] unzip_cache = none, KILN_PROBE_CACHE=none:
#          every run inflates the IDX files and probes every plugin file
#          in a child (cuDNN and cuBLAS loaded there)
#   warm   the defaults, with caches a first (untimed) run filled, in a
#          scratch XDG_CACHE_HOME
#
#   $KILN train examples/fashion_mnist_mlp.ini train.max_steps=1 train.eval=0
#
# Usage: bench/startup.sh [--runs N] [--short]
#   --runs N    rounds (default 7); --short: 3
# Environment: KILN (default ./kiln).  Run from the top of the source tree.
# Prints a markdown table and the load averages.

set -eu

RUNS=7
while [ $# -gt 0 ]; do
    case $1 in
        --runs) [ $# -ge 2 ] || { echo "startup.sh: --runs needs N" >&2; exit 2; }; RUNS=$2; shift 2 ;;
        --short) RUNS=3; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "startup.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh"
real_kiln # time the binary itself, not libtool's wrapper
[ -x "$KILN" ] || { echo "startup.sh: $KILN not found (set KILN=)" >&2; exit 1; }
bench_tmpdir startup
INI=examples/fashion_mnist_mlp.ini

# one MODE: append "user sys wall" of one run to $TMP/MODE
one() {
    if [ "$1" = cold ]; then
        set -- "$1" env KILN_PROBE_CACHE=none "$KILN" train "$INI" data.unzip_cache=none \
            data.eval.unzip_cache=none
    else
        set -- "$1" env XDG_CACHE_HOME="$TMP/xdg" KILN_PROBE_CACHE= "$KILN" train "$INI"
    fi
    _m=$1
    shift
    /usr/bin/time -f '%U %S %e' -a -o "$TMP/$_m" "$@" train.max_steps=1 train.eval=0 \
        train.overwrite=1 run.out_dir="$TMP/out" >/dev/null 2>"$TMP/err" ||
        { echo "startup.sh: the $_m run failed:" >&2; cat "$TMP/err" >&2; exit 1; }
}

load0=$(cat /proc/loadavg)
one warm && : > "$TMP/warm" # fills the caches; not timed
: > "$TMP/cold"
i=1
while [ "$i" -le "$RUNS" ]; do
    one cold
    one warm
    i=$((i + 1))
done
col() { awk -v c="$2" '{ print $c }' "$TMP/$1" | median; }
cpu() { awk '{ print $1 + $2 }' "$TMP/$1" | median; }
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, median of $RUNS interleaved rounds"
echo "load average before: $load0; after: $(cat /proc/loadavg)"
echo "command: $KILN train $INI train.max_steps=1 train.eval=0 (under /usr/bin/time)"
echo
echo "| start-up caches | user s | sys s | user+sys s | wall s |"
echo "|---|---:|---:|---:|---:|"
for m in cold warm; do
    echo "| $m | $(col $m 1) | $(col $m 2) | $(cpu $m) | $(col $m 3) |"
done
echo
awk -v a="$(cpu cold)" -v b="$(cpu warm)" 'BEGIN { printf "CPU seconds, cold / warm: %.2fx\n", a / b }'
