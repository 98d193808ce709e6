#!/bin/sh
# bench/tune_measure.sh - the CPU tuner's choices and the step rate they
# give, a base build against this one, interleaved: the bf16 CNN of
# bench/cnn_bench.ini at 2 threads, every choice timed (tune_cache=none),
# STEPS steps at batch 128, RUNS rounds.  Each run prints its samples/s, its
# 11 bf16 choices in prepare order (bf16, f32, b2: oneDNN's second bf16
# GEMM) and how many were timed by wall time (quiet) / provisional
# (contended) (plugins/cpu/tune.c, tune_choose); then the medians.
# Usage: bench/tune_measure.sh BASE_TREE [RUNS (5)] [STEPS (200)]
#   BASE_TREE: a built kiln tree (e.g. a worktree of integ); run from the
#   top of this built tree.
BASE=${1:?usage: bench/tune_measure.sh BASE_TREE [RUNS] [STEPS]}
RUNS=${2:-5}
STEPS=${3:-200}
. "$(dirname "$0")/common.sh"
bench_tmpdir tune-measure
echo "# bench/tune_measure.sh $BASE $RUNS $STEPS; loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
r=1
while [ "$r" -le "$RUNS" ]; do
	for b in base this; do
		if [ $b = base ]; then
			set -- env KILN_PLUGIN_PATH="$BASE/plugins/.libs" "$BASE/kiln"
			probe_cache "$BASE/kiln" # bench/common.sh: each build its probe cache
		else
			set -- ./kiln
			probe_cache ./kiln
		fi
		KILN_LOG_LEVEL=info "$@" train bench/cnn_bench.ini run.precision=bf16 run.threads=2 \
			train.batch=128 data.limit=$((128 * STEPS)) train.max_steps="$STEPS" data.eval.limit=0 \
			train.eval=0 plugin.cpu.tune_cache=none >"$TMP/out" 2>"$TMP/err" || exit 1
		sps=$(sed -n 's/.*"train_samples_per_s": \([0-9.]*\).*/\1/p' "$TMP/out")
		echo "$sps" >>"$TMP/$b"
		ch=$(sed -n 's/.*: the \([a-z0-9 ]*\) kernel.*/\1/p' "$TMP/err" | sed 's/second bf16/b2/' | tr '\n' ',')
		echo "$b $r: $sps samples/s; choices $ch wall $(grep -c 'medians of wall time' "$TMP/err")" \
			"provisional $(grep -c 'provisional (timed' "$TMP/err"); load $(cut -d' ' -f1 /proc/loadavg)"
	done
	r=$((r + 1))
done
for b in base this; do
	echo "$b median samples/s: $(sort -n "$TMP/$b" | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')"
done
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
