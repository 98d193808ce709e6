#!/bin/sh
# bench/gemm_blocks.sh [RUNS]: bench/pipeline_pair.sh's blocks model (4 x
# (linear 1024 + relu), 32x32 synthetic inputs, 16 classes) in ONE process
# on 1 thread, at batch 128, 256 and 512, this build against another ($B,
# default /work/main), interleaved: the f32 GEMMs of a 1024-wide MLP at the
# row counts where oneDNN 2.6's AVX2 sgemm is slow (issue 22; docs/
# PERFORMANCE.md, "Session 16: small GEMMs on AVX2").  Per batch and side:
# samples/s, the median of a run's per-step figures over steps 2..STEPS
# (metrics.jsonl, log_every = 1), the median of those over RUNS rounds
# (default 3), and GFLOP/s (6 x the linear layers' multiply-adds a sample,
# the loss and layernorm left out).  Each side has its own tune cache
# (XDG_CACHE_HOME under a temporary directory), warmed by a first round
# that is not counted.  EXTRA: more KEY=VALUE for this build's runs (e.g.
# plugin.cpu.gemm_impl=onednn).  From the top of the build tree:
#   B=/work/main sh bench/gemm_blocks.sh 3
set -eu
STEPS=${STEPS:-10}
RUNS=${1:-3}
A=$(pwd)
B=${B:-/work/main}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../tests/config_lib.sh"
median() { sort -g | awk '{ a[NR] = $1 } END { print NR ? a[int((NR + 1) / 2)] : "-" }'; }
# one BATCH SIDE: a run's median samples/s over steps 2..
one() {
	_d=$A _x=${EXTRA:-}
	[ "$2" = base ] && _d=$B _x=
	rm -rf "$tmp/run"
	# shellcheck disable=SC2086 # _x: words
	XDG_CACHE_HOME="$tmp/cache_$2" OMP_NUM_THREADS=1 KILN_PLUGIN_PATH="$_d/plugins/.libs" \
		"$_d/kiln" train "$tmp/b$1.ini" $_x > "$tmp/out" 2>&1 ||
		{ echo "$2 batch $1 failed:" >&2; tail -5 "$tmp/out" >&2; return 1; }
	sed -n 's/.*"event":"train",.*"step":\([0-9]*\),.*"samples_per_s":\([0-9.e+]*\),.*/\1 \2/p' \
		"$tmp/run/metrics.jsonl" | awk '$1 >= 2 { print $2 }' | median
}
for bt in 128 256 512; do
	{
		ini run seed=1 threads=1 out_dir="$tmp/run"
		ini_synthetic $((bt * STEPS)) 32 16 image_channels=1 workers=1
		ini_layers flat:flatten ln:layernorm b1:linear:out=1024 r1:relu b2:linear:out=1024 r2:relu \
			b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
		ini train epochs=1 max_steps="$STEPS" batch="$bt" lr=0.01 log_every=1 eval=0 \
			checkpoint_last=0 overwrite=1
	} > "$tmp/b$bt.ini"
done
# multiply-adds a sample: 4 x 1024x1024 + 1024x16 (32x32 inputs); x 6 (fwd, 2 bwd)
flop=$(awk 'BEGIN { print 6 * (4 * 1024 * 1024 + 1024 * 16) }')
echo "blocks model, 1 process, 1 thread; this build $A ${EXTRA:-}, base $B; $RUNS round(s) of $STEPS steps; load $(cut -d' ' -f1-3 /proc/loadavg)"
for bt in 128 256 512; do
	one "$bt" this > /dev/null && one "$bt" base > /dev/null # warm the tune caches
	: > "$tmp/s_this" && : > "$tmp/s_base"
	r=0
	while [ "$r" -lt "$RUNS" ]; do
		one "$bt" this >> "$tmp/s_this"
		one "$bt" base >> "$tmp/s_base"
		r=$((r + 1))
	done
	t=$(median < "$tmp/s_this") b=$(median < "$tmp/s_base")
	awk -v bt="$bt" -v t="$t" -v b="$b" -v f="$flop" -v tl="$(tr '\n' ' ' < "$tmp/s_this")" \
		-v bl="$(tr '\n' ' ' < "$tmp/s_base")" 'BEGIN {
		printf "batch %d: this %.0f samples/s (%.1f GFLOP/s), base %.0f (%.1f): %+.1f%%  [this: %s base: %s]\n",
			bt, t, t * f / 1e9, b, b * f / 1e9, 100 * (t / b - 1), tl, bl }'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
