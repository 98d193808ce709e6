#!/bin/sh
# bench/cnn_bf16_ab.sh - two builds' bf16 CNN (issue 22's cnn-bf16 row:
# bench/cnn_bench.ini, run.precision=bf16, nchw, batch 128, run.threads=T),
# interleaved (common.sh's ab_rounds), for session 50's kernels.  Each run
# trains 120 steps as anchors.sh's kiln row does and keeps
#   steady   samples/s after the first 20 steps (anchors_table.py --steady)
#   whole    the run's train_samples_per_s
#   cpu_s    the run's user + sys CPU seconds (set-up included)
#   c2c_ns   bench/c2c_latency --rounds 1 just before the run (the VM's two
#            speeds, docs/PERFORMANCE.md, session 48)
# An untimed run of each build first (the tune cache).  Prints every run,
# then the medians of the runs whose probe read under FAST ns (default
# 200, common.sh's C2C_FAST_NS) and how many were dropped, the medians of
# every run, and the load average before and after.
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
RUNS=6 THREADS=2 FAST=$C2C_FAST_NS
while [ $# -gt 0 ]; do
	if bench_opt "$@"; then shift "$NSHIFT"; continue; fi
	case $1 in
	--fast) [ $# -ge 2 ] || usage; FAST=$2; shift 2 ;;
	*) usage ;;
	esac
done
C2C=$HERE/c2c_latency
[ -x "$C2C" ] || { echo "cnn_bf16_ab.sh: build $C2C first (make bench/c2c_latency)" >&2; exit 2; }
bench_tmpdir cnn-bf16-ab

one() { # BINARY -> "steady whole cpu_s c2c_ns"
	probe_cache "$1"
	words=$(run_words "$1")
	p=$("$C2C" --rounds 1 | sed -n 's/.*"round_trip_ns_median": \([0-9.]*\).*/\1/p')
	rm -rf "$TMP/o"
	# shellcheck disable=SC2086 # the words of run_words
	/usr/bin/time -f '%U %S' -o "$TMP/time" $words train "$HERE/cnn_bench.ini" run.precision=bf16 \
		model.layout=nchw run.threads="$THREADS" train.eval=0 run.out_dir="$TMP/o" \
		train.log_every=20 train.batch=128 data.limit=15360 train.max_steps=120 \
		>"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
	line=$(json_line <"$TMP/out")
	w=$(printf '%s\n' "$line" | field train_samples_per_s)
	s=$("$PYTHON" "$HERE/anchors_table.py" --steady "$TMP/o/metrics.jsonl" 20 128 "$line" | field train_samples_per_s)
	c=$(awk '{printf "%.2f", $1 + $2}' "$TMP/time")
	echo "$s $w $c $p"
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
echo "rows (item build steady whole cpu_s c2c_ns):"
cat "$TMP/rows"
echo "| build | fast runs | steady samples/s | whole-run samples/s | CPU s | c2c ns |"
echo "|---|---:|---:|---:|---:|---:|"
m() { awk -v k="$1" '{print $k}' "$TMP/fast" | median; }
for w in A B; do
	awk -v w="$w" -v f="$FAST" '$2 == w && $6 < f' "$TMP/rows" >"$TMP/fast"
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
