#!/bin/sh
# bench/mlp_step.sh - the MLP's training step in CPU seconds, which a
# loaded machine disturbs far less than wall time: the user+sys CPU of
#   $KILN train bench/mlp_bench.ini train.eval=0 train.max_steps=S+1
# less that of the same run with 1 step (start-up, data, checkpoint), over
# S, for each variant, interleaved (every variant once per round), medians
# of the rounds.  Variants:
#   fuse0   run.fuse=0: ReLU layers of their own
#   fuse1   run.fuse=1 (the CPU's default, fuse = auto): the ReLU as the GEMM's epilogue; its backward one
#           pass with the bias gradient (RELU_BWD's out1, ABI 2.9)
# and with KILN_BASE set (another kiln, e.g. a build of the commit before
# a change), base-fuse0 and base-fuse1 the same way.  Also the whole step's
# GFLOP per CPU second (308.1 MFLOP a step: the forward's 137.0, the weight
# gradients' 137.0 and the input gradients of fc2 and fc3, 34.2) against
# bench/gemm_peak on as many threads, and the load averages.
#
# Usage: sh bench/mlp_step.sh [--runs N] [--steps S] [--threads T] [--short]
#   --runs N     rounds (default 5)   --steps S  timed steps (default 1000)
#   --threads T  [run] threads (default 1)   --short: --runs 3 --steps 300
# From the top of the build tree.  Environment: KILN (./kiln), KILN_BASE,
# GEMM (./bench/gemm_peak), PEAK (GFLOP/s: instead of running GEMM), FMNIST (/usr/share/datasets/fashion-mnist).
set -eu
RUNS=5 STEPS=1000 THREADS=1
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--short) RUNS=3 STEPS=300; shift ;;
	*) echo "usage: $0 [--runs N] [--steps S] [--threads T] [--short]" >&2; exit 2 ;;
	esac
done
HERE=$(dirname "$0")
peak=${PEAK:-} # before common.sh, which sets PEAK
. "$HERE/common.sh"
KILN=${KILN:-./kiln}
GEMM=${GEMM:-./bench/gemm_peak}
PYTHON=${PYTHON:-python3} # measure_peak reads its JSON
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
bench_tmpdir mlp-step

variants="fuse0 fuse1"
[ -z "${KILN_BASE:-}" ] || variants="$variants base-fuse0 base-fuse1"

timed() { # BINARY STEPS FUSE -> "cpu seconds" (user + sys)
	# shellcheck disable=SC2046 # run_words's words: env, its variable, the path
	/usr/bin/time -f '%U %S' -o "$TMP/t" $(run_words "$1") train "$HERE/mlp_bench.ini" \
		data.path="$FMNIST" run.threads="$THREADS" run.fuse="$3" train.eval=0 \
		train.max_steps="$2" run.out_dir="$TMP/run" --overwrite >/dev/null 2>"$TMP/err" ||
		{ cat "$TMP/err" >&2; exit 1; }
	rm -rf "$TMP/run"
	awk '{ print $1 + $2 }' "$TMP/t"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for _ in $(seq "$RUNS"); do
	for v in $variants; do
		case $v in base-*) bin=$KILN_BASE ;; *) bin=$KILN ;; esac
		probe_cache "$bin"
		f=${v#base-}; f=${f#fuse}
		one=$(timed "$bin" 1 "$f")
		all=$(timed "$bin" $((STEPS + 1)) "$f")
		echo "$v $one $all" >>"$TMP/rows"
	done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
# PEAK: a quiet window's figure (bench/gemm_peak times wall clock, which a
# loaded machine lowers)
[ -n "$peak" ] || { measure_peak; peak=$PEAK; }

echo "MLP step (bench/mlp_bench.ini, batch 128), $THREADS thread(s), $STEPS steps, $RUNS rounds; load before $load0, after $load1"
echo "| variant | CPU ms per step (median) | spread | GFLOP per CPU s | % of the GEMM peak (${peak:-?} GFLOP/s, $THREADS thread(s)) |"
echo "|---|---:|---|---:|---:|"
for v in $variants; do
	grep "^$v " "$TMP/rows" | awk -v s="$STEPS" '{ print 1000 * ($3 - $2) / s }' | sort -n >"$TMP/v"
	awk -v v="$v" -v peak="${peak:-0}" -v t="$THREADS" '
		{ x[NR] = $1 }
		END {
			m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
			g = 308.1 / m  # MFLOP per ms = GFLOP per s, per CPU second
			printf "| %s | %.3f | %.3f-%.3f | %.1f | %s |\n", v, m, x[1], x[NR], g,
				(peak > 0 ? sprintf("%.1f%%", 100 * g * t / peak) : "?")
		}' "$TMP/v"
done
