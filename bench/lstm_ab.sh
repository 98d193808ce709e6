#!/bin/sh
# bench/lstm_ab.sh - two kiln builds on bench/lstm.sh's LSTM models (its
# INI, token shard and PyTorch's initial weights), interleaved: RUNS rounds,
# A then B (B then A in even rounds; common.sh's ab_rounds), each thread
# count in turn.  A run trains WARM + STEPS steps; its rate is over the
# steps after the WARM-th (metrics.jsonl), its CPU ms a step is (CPU of that
# run - CPU of a WARM-step run) / STEPS, from /usr/bin/time.  No PyTorch
# rows (bench/lstm.sh has them).  Prints the medians, B/A and the load.
#
# Usage: A=/path/to/old/kiln B=./kiln sh bench/lstm_ab.sh [--runs N]
#            [--threads "1 2"] [--model lm|seq2seq] [--steps N]
#   --runs N      rounds (default 3)        --threads  default "1 2"
#   --model M     default lm (T 64; seq2seq: T 8, masked, reverse)
#   --steps N     timed steps (default 20 for lm, 200 for seq2seq)
# Environment: KILN_VENV (/work/scratch/venv) for bench/pytorch_lstm.py.
# Run from the top of a built source tree.

set -eu
A=${A:?set A to the kiln before}
B=${B:-./kiln}
RUNS=3 THREADS_LIST="1 2" MODEL=lm STEPS=
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS_LIST=$(echo "$2" | tr ',' ' '); shift 2 ;;
	--model) MODEL=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
case $MODEL in
lm) CTX=64 WARM=3 STEPS=${STEPS:-20} ;;
seq2seq) CTX=8 WARM=20 STEPS=${STEPS:-200} ;;
*) echo "lstm_ab.sh: unknown model $MODEL (lm, seq2seq)" >&2; exit 2 ;;
esac
KILN_VENV=${KILN_VENV:-/work/scratch/venv}
PYTHON=$KILN_VENV/bin/python
HERE=$(dirname "$0")
. "$HERE/common.sh"
bench_tmpdir lstm-ab
[ -x /usr/bin/time ] || { echo "lstm_ab.sh: needs /usr/bin/time" >&2; exit 1; }

KILN=$B sh "$HERE/lstm.sh" --ini "$MODEL" > "$TMP/m.ini"
"$PYTHON" "$HERE/pytorch_lstm.py" --model "$MODEL" --write-shard "$TMP/m.bin" \
	--tokens $(((STEPS + WARM + 2) * 64 * CTX + 1)) --seed 1
"$PYTHON" "$HERE/pytorch_lstm.py" --model "$MODEL" --init "$TMP/m.safetensors"

train() { # KILN THREADS STEPS -> CPU seconds; metrics in $TMP/out
	rm -rf "$TMP/out"
	# shellcheck disable=SC2046 # run_words's words: env, its variable, the path
	/usr/bin/time -f '%U %S' -o "$TMP/time" $(run_words "$1") train "$TMP/m.ini" \
		run.threads="$2" run.out_dir="$TMP/out" data.path="$TMP/m.bin" \
		model.init_from="$TMP/m.safetensors" train.max_steps="$3" > "$TMP/log" 2>&1 ||
		{ tail -3 "$TMP/log" >&2; return 1; }
	awk '{ print $1 + $2 }' "$TMP/time"
}

one() { # A|B THREADS -> "samples/s cpu-ms-a-step last-loss"
	if [ "$1" = A ]; then k=$A; else k=$B; fi
	probe_cache "$k"
	c0=$(train "$k" "$2" "$WARM")
	c1=$(train "$k" "$2" $((WARM + STEPS)))
	"$PYTHON" - "$TMP/out/metrics.jsonl" "$WARM" "$c0" "$c1" <<'PY'
import json, sys
tr = [r for r in map(json.loads, filter(str.strip, open(sys.argv[1]))) if r.get("event") == "train"]
warm, last = int(sys.argv[2]), tr[-1]["step"]
t = {r["step"]: r["time"] for r in tr}
print("%.1f %.1f %.6f" % ((last - warm) * 64 / (t[last] - t[warm]),
      1000 * (float(sys.argv[4]) - float(sys.argv[3])) / (last - warm), tr[-1]["loss"]))
PY
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
ab_rounds "$RUNS" "$THREADS_LIST" "$TMP/rows" one
load1=$(cut -d' ' -f1-3 /proc/loadavg)

col() { # THREADS BUILD COLUMN -> median
	awk -v t="$1" -v w="$2" -v c="$3" '$1 == t && $2 == w { print $(c + 2) }' "$TMP/rows" | median
}
echo "$MODEL, $STEPS timed steps after $WARM; medians of $RUNS interleaved rounds"
echo "A = $A, B = $B"
echo
echo "| threads | A samples/s | B samples/s | B/A | A CPU ms/step | B CPU ms/step | B/A CPU | last loss A / B |"
echo "|---:|---:|---:|---:|---:|---:|---:|---|"
for t in $THREADS_LIST; do
	as=$(col "$t" A 1) bs=$(col "$t" B 1) ac=$(col "$t" A 2) bc=$(col "$t" B 2)
	echo "| $t | $as | $bs | $(echo "$bs $as" | awk '{ printf "%.3f", $1 / $2 }') | $ac | $bc |" \
		"$(echo "$bc $ac" | awk '{ printf "%.3f", $1 / $2 }') | $(col "$t" A 3) / $(col "$t" B 3) |"
done
echo
echo "load average: $load0 before, $load1 after"
