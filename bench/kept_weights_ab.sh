#!/bin/sh
# bench/kept_weights_ab.sh - two builds' frozen 3x3 convolutions, whose
# kept weights are the large buffers session 47 moved onto huge pages
# (plugins/cpu/hugepage.c): wino.c's transformed U (36 C O floats) and
# oneDNN's copy in its kernel's layout (9 C O floats).  Runs each build's
# bench/wino_ops (A's and B's libtool wrappers, each with its own libkiln
# and plugins) on each shape, A then B (B then A on even rounds), and keeps
# each invocation's least wall and CPU ms of a run (wino and oneDNN's
# direct kernel).  Prints a markdown table of medians over the rounds, B/A,
# and the load averages.
#
# Usage: A=/path/to/old/tree B=. sh bench/kept_weights_ab.sh [--runs N]
#            [--threads T] [--batch B] [--iters I] [--shapes C,H,O,P;...]
#   --runs N     rounds (default 7)     --threads T  run.threads (default 1)
#   --batch B    samples (default 1)    --iters I    runs an invocation (default 30)
#   --shapes     default "256,7,256,1;256,14,256,1" (U 9.0 MiB, oneDNN's 2.25 MiB)
# A and B are built trees (their bench/wino_ops).  Run from the top of B.

set -eu
A=${A:?set A to the built tree before}
B=${B:-.}
RUNS=7 THREADS=1 BATCH=1 ITERS=30 SHAPES="256,7,256,1;256,14,256,1"
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--batch) BATCH=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--shapes) SHAPES=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/common.sh"
bench_tmpdir kept-weights-ab

one() { # TREE SHAPE -> "wino-wall dnn-wall wino-cpu dnn-cpu" (ms)
	"$1/bench/wino_ops" --threads "$THREADS" --batch "$BATCH" --iters "$ITERS" --shape "$2" |
		awk 'NR > 2 { print $3, $4, $5, $6 }'
}

shapes=$(echo "$SHAPES" | tr ';' ' ')
for s in $shapes; do # untimed: page cache, JIT
	one "$A" "$s" >/dev/null
	one "$B" "$s" >/dev/null
done
load0=$(cut -d' ' -f1-3 /proc/loadavg)
build_one() { # A|B SHAPE
	if [ "$1" = A ]; then one "$A" "$2"; else one "$B" "$2"; fi
}
ab_rounds "$RUNS" "$shapes" "$TMP/rows" build_one
load1=$(cut -d' ' -f1-3 /proc/loadavg)

col() { # SHAPE BUILD COLUMN -> median
	awk -v s="$1" -v w="$2" -v c="$3" '$1 == s && $2 == w { print $(c + 2) }' "$TMP/rows" | median
}
echo "frozen f32 3x3 conv, batch $BATCH, $THREADS thread(s), least of $ITERS runs an invocation; medians of $RUNS rounds (ms)"
echo
echo "| shape C,H,O,P | kernel | A wall | B wall | B/A wall | A CPU | B CPU | B/A CPU |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for s in $shapes; do
	for k in wino dnn; do
		if [ $k = wino ]; then cw=1 cc=3; else cw=2 cc=4; fi
		aw=$(col "$s" A $cw) bw=$(col "$s" B $cw) ac=$(col "$s" A $cc) bc=$(col "$s" B $cc)
		echo "| $s | $k | $aw | $bw | $(echo "$bw $aw" | awk '{ printf "%.3f", $1 / $2 }') | $ac | $bc | $(echo "$bc $ac" | awk '{ printf "%.3f", $1 / $2 }') |"
	done
done
echo
echo "load average: $load0 before, $load1 after"
