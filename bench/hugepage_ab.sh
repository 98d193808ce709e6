#!/bin/sh
# bench/hugepage_ab.sh - two builds' training samples/s, interleaved, with
# the huge pages each run's process held: made for session 46's CPU buffers
# on transparent huge pages (plugins/cpu/hugepage.c).  Each round runs every
# model on A then B (B then A on even rounds):
#   mlp  KILN train bench/mlp_bench.ini train.epochs=1
#   cnn  KILN train bench/cnn_bench.ini data.limit=12800 train.max_steps=100
#        data.eval.limit=500
# both with run.threads=T run.out_dir= data.path=FMNIST, and keeps each
# run's train_samples_per_s, its CPU seconds (user + sys, /usr/bin/time:
# at --threads 1 far steadier than samples/s on a loaded machine) and the
# most AnonHugePages its process had (/proc/PID/smaps_rollup, read every
# 0.2 s while it runs).  An untimed run
# of each build and model first (the tune cache, common.sh's, then holds
# one set of kernel choices both builds use).  Prints a markdown table of
# medians, B/A, and the load averages.
#
# Usage: A=/path/to/old/kiln B=./kiln sh bench/hugepage_ab.sh [--runs N]
#            [--threads T] [--models mlp,cnn]
#   --runs N      rounds (default 5)   --threads T  run.threads (default 2)
# Run from the top of the source tree.  Environment: A, B (kiln binaries or
# libtool's wrappers), FMNIST (/usr/share/datasets/fashion-mnist).

set -eu
A=${A:?set A to the kiln of the build before}
B=${B:-./kiln}
RUNS=5 THREADS=2 MODELS=mlp,cnn
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--models) MODELS=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/common.sh"
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
bench_tmpdir hugepage-ab

args() { # MODEL -> its config and overrides
	case $1 in
	mlp) echo "bench/mlp_bench.ini train.epochs=1" ;;
	cnn) echo "bench/cnn_bench.ini data.limit=12800 train.max_steps=100 data.eval.limit=500" ;;
	*) echo "hugepage_ab.sh: unknown model $1" >&2; exit 2 ;;
	esac
}

one() { # BINARY MODEL -> "samples/s most-AnonHugePages-kB cpu-s"
	probe_cache "$1"
	# (the words first: a command substitution in the background command
	# would be a child of its own beside time's)
	words=$(run_words "$1")
	cfg=$(args "$2")
	# shellcheck disable=SC2086 # the words of run_words and args
	/usr/bin/time -f '%U %S' -o "$TMP/t" $words train $cfg run.threads="$THREADS" run.out_dir= \
		data.path="$FMNIST" >"$TMP/out" 2>"$TMP/err" &
	tpid=$!
	most=0
	while st=$(cut -d' ' -f3 "/proc/$tpid/stat" 2>/dev/null) && [ "$st" != Z ]; do
		# kiln: time's child (env execs it)
		pid=$(cut -d' ' -f1 "/proc/$tpid/task/$tpid/children" 2>/dev/null || true)
		h=$(awk '/^AnonHugePages:/ { print $2 }' "/proc/${pid:-0}/smaps_rollup" 2>/dev/null || true)
		[ -z "$h" ] || [ "$h" -le "$most" ] || most=$h
		sleep 0.2
	done
	wait "$tpid" || { cat "$TMP/err" >&2; exit 1; }
	echo "$(json_line <"$TMP/out" | field train_samples_per_s) $most $(awk '{ print $1 + $2 }' "$TMP/t")"
}

models=$(echo "$MODELS" | tr ',' ' ')
for m in $models; do
	one "$A" "$m" >/dev/null
	one "$B" "$m" >/dev/null
done
load0=$(cut -d' ' -f1-3 /proc/loadavg)
build_one() { # A|B MODEL
	if [ "$1" = A ]; then one "$A" "$2"; else one "$B" "$2"; fi
}
ab_rounds "$RUNS" "$models" "$TMP/rows" build_one
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "$RUNS rounds, run.threads=$THREADS; load average before $load0, after $load1"
echo "| model | build | samples/s (median) | spread | CPU s a run (median) | spread | AnonHugePages (most, median) | B/A samples/s | B/A CPU s |"
echo "|---|---|---:|---|---:|---|---:|---:|---:|"
col() { awk -v m="$1" -v w="$2" -v c="$3" '$1 == m && $2 == w { print $c }' "$TMP/rows" | sort -g; }
for m in $models; do
	a=$(col "$m" A 3 | median)
	ac=$(col "$m" A 5 | median)
	for w in A B; do
		col "$m" "$w" 3 >"$TMP/v"
		col "$m" "$w" 5 >"$TMP/c"
		h=$(col "$m" "$w" 4 | median)
		s=$(median <"$TMP/v")
		c=$(median <"$TMP/c")
		printf '| %s | %s | %.0f | %.0f-%.0f | %.2f | %.2f-%.2f | %.1f MiB | %s | %s |\n' "$m" "$w" "$s" \
			"$(head -1 "$TMP/v")" "$(tail -1 "$TMP/v")" "$c" "$(head -1 "$TMP/c")" "$(tail -1 "$TMP/c")" \
			"$(echo "$h" | awk '{ print $1 / 1024 }')" \
			"$(awk -v a="$a" -v b="$s" -v w="$w" 'BEGIN { print w == "A" ? "" : sprintf("%.3f", b / a) }')" \
			"$(awk -v a="$ac" -v b="$c" -v w="$w" 'BEGIN { print w == "A" ? "" : sprintf("%.3f", b / a) }')"
	done
done
