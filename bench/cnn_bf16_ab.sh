#!/bin/sh
# bench/cnn_bf16_ab.sh - two builds' bf16 CNN (issue 22's cnn-bf16 row:
# bench/cnn_bench.ini, run.precision=bf16, nchw, batch 128, run.threads=T),
# interleaved (common.sh's ab_rounds), for session 50's kernels.  Each run
# is anchors.sh's cnn-bf16 kiln row at its defaults: the same ini and keys
# (120 steps, data.limit 15360, train.log_every 20, train.eval 0), the
# binary itself (not libtool's wrapper), env $BLAS_ENV (common.sh: OpenBLAS
# SkylakeX's kernels, not the Cooperlake ones it picks on this Zen 4 by
# itself), OMP_WAIT_POLICY and OMP_NUM_THREADS unset.  What differs: no
# KILN_MASTER_PORT (one process), /usr/bin/time around it, and the probes
# beside each run.  Each run keeps
#   steady   samples/s after the first 20 steps (anchors_table.py --steady)
#   whole    the run's train_samples_per_s
#   cpu_s    the run's user + sys CPU seconds (set-up included)
#   c2c      bench/c2c_latency --rounds 1 before and after the run and the
#            run's placement (common.sh's place_before / place_after: fast
#            only when both probes read under FAST ns; the VM's two speeds,
#            docs/PERFORMANCE.md, session 48)
# An untimed run of each build first (the tune cache).  Prints every run,
# then the medians of the fast runs (FAST, default 200 ns: common.sh's
# C2C_FAST_NS) and how many were dropped, the medians of every run, and
# the load average before and after.
#
# Usage: A=/path/to/old/kiln B=./kiln sh bench/cnn_bf16_ab.sh [--runs N]
#            [--threads T] [--fast NS]
#   --runs N   rounds (default 6)   --threads T  run.threads (default 2)
# Run from the top of the build tree (bench/c2c_latency built).

set -eu
A=${A:?set A to the kiln of the build before}
B=${B:-./kiln}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
. "$HERE/common.sh"
RUNS=6 THREADS=2
while [ $# -gt 0 ]; do
	if bench_opt "$@"; then shift "$NSHIFT"; continue; fi
	case $1 in
	--fast) [ $# -ge 2 ] || usage; C2C_FAST_NS=$2; shift 2 ;;
	*) usage ;;
	esac
done
C2C=$HERE/c2c_latency
[ -x "$C2C" ] || { echo "cnn_bf16_ab.sh: build $C2C first (make bench/c2c_latency)" >&2; exit 2; }
bench_tmpdir cnn-bf16-ab

one() { # BINARY -> "steady whole cpu_s c2c_before c2c_after place"
	probe_cache "$1"
	words=$(run_words "$1")
	# one runs in a command substitution: a probe the parent kept is stale
	place_fresh
	place_before
	rm -rf "$TMP/o"
	# shellcheck disable=SC2086 # BLAS_ENV's and run_words' words
	/usr/bin/time -f '%U %S' -o "$TMP/time" env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS $BLAS_ENV $words train "$HERE/cnn_bench.ini" run.precision=bf16 \
		model.layout=nchw run.threads="$THREADS" train.eval=0 run.out_dir="$TMP/o" \
		train.log_every=20 train.batch=128 data.limit=15360 train.max_steps=120 \
		>"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
	line=$(json_line <"$TMP/out")
	w=$(printf '%s\n' "$line" | field train_samples_per_s)
	s=$("$PYTHON" "$HERE/anchors_table.py" --steady "$TMP/o/metrics.jsonl" 20 128 "$line" | field train_samples_per_s)
	c=$(awk '{printf "%.2f", $1 + $2}' "$TMP/time")
	place_after
	echo "$s $w $c $C2C_BEFORE $C2C_AFTER $(printf '%s' "$PLACE" | tr ' ' -)"
}

one "$A" >/dev/null
one "$B" >/dev/null
load0=$(cut -d' ' -f1-3 /proc/loadavg)
build_one() { # A|B ITEM
	if [ "$1" = A ]; then one "$A"; else one "$B"; fi
}
ab_rounds "$RUNS" cnn-bf16 "$TMP/rows" build_one
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "$RUNS rounds, run.threads=$THREADS; load average before $load0, after $load1"
echo "rows (item build steady whole cpu_s c2c_before c2c_after place):"
cat "$TMP/rows"
echo "| build | fast runs | steady samples/s | whole-run samples/s | CPU s | c2c ns before |"
echo "|---|---:|---:|---:|---:|---:|"
m() { awk -v k="$1" '{print $k}' "$TMP/fast" | median; }
for w in A B; do
	awk -v w="$w" '$2 == w && $8 == "fast"' "$TMP/rows" >"$TMP/fast"
	n=$(wc -l <"$TMP/fast")
	all=$(awk -v w="$w" '$2 == w' "$TMP/rows" | wc -l)
	if [ "$n" -eq 0 ]; then
		echo "| $w | 0 of $all | - | - | - | - |"
	else
		echo "| $w | $n of $all | $(m 3) | $(m 4) | $(m 5) | $(m 6) |"
	fi
done
# every run, fast or not (a busy machine's rates; the CPU seconds are the
# steadier figure there)
for w in A B; do
	awk -v w="$w" '$2 == w' "$TMP/rows" >"$TMP/fast"
	echo "| $w, every run | $(wc -l <"$TMP/fast") | $(m 3) | $(m 4) | $(m 5) | $(m 6) |"
done
