#!/bin/sh
# bench/mlp_fill_ab.sh - two builds' Fashion-MNIST MLP epoch, interleaved,
# for the batch fill on the training thread (session 49): each run is one
# epoch of examples/fashion_mnist_mlp.ini (run.threads=T) with
# KILN_LOG_LEVEL=debug, and keeps
#   samples/s  train_samples_per_s of the last stdout JSON line
#   setup_s    the final JSON line's setup_s (includes the idx open)
#   fill_us    the consumer-fill rule's "a batch's fill took X us of CPU"
#              (the workers' fills in the rule's first window)
#   own_us     the training thread's fills, "by the training thread (X us
#              of CPU a fill)" at the end (0: a build without the figure)
#   wait       the median data_wait of metrics.jsonl's train lines
#   c2c_ns     bench/c2c_latency --rounds 1 just before the run (the VM's
#              two speeds: ~55-130 ns when both vCPUs share an L3, ~300+
#              when not; docs/PERFORMANCE.md, session 48)
# An untimed run of each build first (the tune cache, the inflated IDX
# copy).  Prints every run, then the medians of the runs whose probe read
# under FAST ns (default 150) and how many were dropped, and the load.
#
# Usage: A=/path/to/old/kiln B=./kiln sh bench/mlp_fill_ab.sh [--runs N]
#            [--threads T] [--fast NS]
#   --runs N   rounds (default 8)   --threads T  run.threads (default 2)
# Run from the top of the build tree (bench/c2c_latency built).
# Environment: A, B (kiln binaries or libtool's wrappers), FMNIST.

set -eu
A=${A:?set A to the kiln of the build before}
B=${B:-./kiln}
RUNS=8 THREADS=2 FAST=150
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--fast) FAST=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/common.sh"
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
C2C=$(dirname "$0")/c2c_latency
[ -x "$C2C" ] || { echo "mlp_fill_ab.sh: build $C2C first (make bench/c2c_latency)" >&2; exit 2; }
bench_tmpdir mlp-fill-ab

one() { # BINARY -> "samples/s setup_s fill_us wait c2c_ns own_us"
	probe_cache "$1"
	words=$(run_words "$1")
	p=$("$C2C" --rounds 1 | sed -n 's/.*"round_trip_ns_median": \([0-9.]*\).*/\1/p')
	rm -rf "$TMP/o"
	# shellcheck disable=SC2086 # the words of run_words
	KILN_LOG_LEVEL=debug $words train examples/fashion_mnist_mlp.ini train.epochs=1 \
		run.threads="$THREADS" run.out_dir="$TMP/o" data.path="$FMNIST" \
		>"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
	s=$(json_line <"$TMP/out" | field train_samples_per_s)
	su=$(grep '"event":"final"' "$TMP/o/metrics.jsonl" | sed -n 's/.*"setup_s":\([0-9.e+-]*\).*/\1/p')
	f=$(sed -n "s/.*a batch's fill took \([0-9.]*\) us of CPU.*/\1/p" "$TMP/err" | head -1)
	w=$(grep '"event":"train"' "$TMP/o/metrics.jsonl" |
		sed -n 's/.*"data_wait":\([0-9.e+-]*\).*/\1/p' | median)
	o=$(sed -n 's/.*loader (train): .*by the training thread (\([0-9.]*\) us of CPU a fill).*/\1/p' "$TMP/err")
	echo "$s ${su:-0} ${f:-0} ${w:-0} $p ${o:-0}"
}

one "$A" >/dev/null
one "$B" >/dev/null
load0=$(cut -d' ' -f1-3 /proc/loadavg)
build_one() { # A|B ITEM
	if [ "$1" = A ]; then one "$A"; else one "$B"; fi
}
ab_rounds "$RUNS" mlp "$TMP/rows" build_one
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "$RUNS rounds, run.threads=$THREADS; load average before $load0, after $load1"
echo "rows (item build samples/s setup_s fill_us data_wait c2c_ns own_us):"
cat "$TMP/rows"
echo "| build | fast runs | samples/s | setup_s | fill us | data_wait | c2c ns | own fill us |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for w in A B; do
	awk -v w="$w" -v f="$FAST" '$2 == w && $7 < f' "$TMP/rows" >"$TMP/fast"
	n=$(wc -l <"$TMP/fast")
	all=$(awk -v w="$w" '$2 == w' "$TMP/rows" | wc -l)
	col() { awk -v c="$1" '{ print $c }' "$TMP/fast" | median; }
	if [ "$n" -gt 0 ]; then
		printf '| %s | %d of %d | %.0f | %.3f | %.1f | %.4f | %.0f | %.1f |\n' "$w" "$n" "$all" \
			"$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)" "$(col 7)" "$(col 8)"
	else
		echo "| $w | 0 of $all | | | | | | |"
	fi
done
