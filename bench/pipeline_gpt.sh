#!/bin/sh
# The GPT example in 2 pipeline stages against one thread (issue 21: "a
# 2-stage run of the GPT example on 2 ranks of 1 thread each reaches at
# least 1.6x the tokens/s of 1 rank of 1 thread"; docs/pipeline.md,
# docs/PERFORMANCE.md).
#
# Model: examples/gpt_char_split.ini (4 blocks of 128, 4 heads, context
# 128, vocab 256, batch 16 = 2,048 tokens a step, AdamW, clip 1.0; stage 0:
# the embeddings and blocks 0-1, stage 1: blocks 2-3, ln_f, the lm_head
# tied to the embedding, the loss) on Debian's fortunes
# (scripts/make-gpt-char-data, made here when DATA has no shard).  Rows:
#   1x1      one process, one thread, the model unsplit (no micro-batches)
#   ranks    `kiln launch -n 2`, [dist] pipeline = 2: each stage a rank of
#            one thread (gloo: the crossing tensors through its shared-memory
#            channels, the pipe's small allreduce in shared memory), M
#            micro-batches
#   devices  one process, [run] devices = cpu:0, cpu:1: each stage a CPU
#            device instance of one thread, M micro-batches
# for M = 4 and 8 (1f1b; 8 is the example's default), and
#   ranks+e  ranks at M = 8 with [pipeline] early_forwards = 1 (stage 0 one
#            forward further ahead: a hand-off's latency hidden behind a pass)
#   rank/tcp ranks at M = 8 with [plugin.gloo] shm_p2p = 0: the crossing
#            tensors by Gloo's TCP point-to-point (before session 9)
# Columns:
#   tok/s    tokens per second from step WARM to the last step (the
#            log's step times: start-up and the first steps left out);
#            median of RUNS interleaved rounds
#   x1x1     tok/s over the 1x1 row's (the issue asks >= 1.6 for ranks)
#   step_ms  wall ms a step (from tok/s); span: the pipeline's span a step
#            (the step's first pass to its last; ranks: stage 0's, logged by
#            its rank): step_ms - span is what a step spends outside the
#            passes (optimizer, clipping's allreduce, the tied weight's
#            send, the batch)
#   cpu_ms   user + sys CPU ms per step, all processes of the run: the
#            run's CPU seconds less those of the same run stopped at step
#            WARM, over the steps between (start-up left out): the work the
#            stages' overlap must not add to
#   s0_ms, s1_ms  each stage's busy ms per step (the pipeline's stamps:
#            the sum of its forwards and backwards; on ranks each rank's log)
#   s0_cpu, s1_cpu  the same in CPU time (the stage's stream thread): load
#            does not stretch these; their balance is the cut's
#   bubble   the measured bubble, 1 - busy / (2 x span) (ranks: stage 0's
#            rank's, from every rank's busy time); theory (P-1)/(M+P-1)
#   busiest  its first part, the busiest stage's idle share of the span (the
#            rest is the imbalance; docs/pipeline.md, "The measured bubble")
#   cpu0     devices: the bubble with the passes' CPU times, a core each and
#            instant hand-offs (docs/pipeline.md, "The measured bubble")
# Needs 2 idle cores: under other load the wall-clock figures are noise
# (compare the CPU and busy columns then).
#
# Usage: bench/pipeline_gpt.sh [--short] [RUNS]   (from the top of the build tree)
#   --short: one round of 8 steps (the first 4 untimed): a smoke test.
#   Default: 3 rounds of 24 steps (the first 4 untimed).
# Environment: KILN (default ./kiln), DATA (default data/gpt_char).
set -eu
STEPS=24
WARM=4
if [ "${1:-}" = "--short" ]; then
	shift
	STEPS=8
	RUNS=${1:-1}
else
	RUNS=${1:-3}
fi
KILN=${KILN:-./kiln}
. "$(dirname "$0")/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
DATA=${DATA:-data/gpt_char}
INI=${INI:-examples/gpt_char_split.ini}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-pipegpt.XXXXXX")
trap 'rm -rf "$tmp"; bench_cache_rm' EXIT
[ -f "$DATA/train-000000.bin" ] || KILN="$KILN" scripts/make-gpt-char-data "$DATA" > /dev/null
port=${KILN_MASTER_PORT:-29547}
# run NAME CMD...: one training run of N steps (default STEPS), its log in
# NAME.err, CPU seconds in NAME.cpu
run() {
	o=$1
	shift
	/usr/bin/time -f '%U %S' -o "$o.cpu" "$@" data.path="$DATA" train.max_steps=${N:-$STEPS} \
		train.log_every=$WARM train.eval=0 train.checkpoint_every=0 train.checkpoint_last=0 \
		train.overwrite=1 run.out_dir="$o" > "$o.out" 2> "$o.err" ||
		{ tail -20 "$o.err" >&2; exit 1; }
}
one() { run "$1" "$KILN" train "$INI" run.threads=1 run.devices= model.stages= pipeline.micro_batches=1; }
ranks() { # ranks NAME M [KEY=VALUE...]
	o=$1 m=$2
	shift 2
	run "$o" env KILN_MASTER_PORT=$port "$KILN" launch -n 2 -- "$KILN" train "$INI" \
		run.threads=1 run.devices= dist.pipeline=2 pipeline.micro_batches="$m" "$@"
}
devices() { run "$1" "$KILN" train "$INI" run.threads=2 pipeline.micro_batches="$2"; }
# tokens/s from step WARM to the last step (metrics.jsonl: rank 0's)
tps() {
	awk -v w=$WARM -v n=$STEPS -v tok=2048 -F'[,:]' '/"event":"train"/ {
		s = t = ""
		for (i = 1; i < NF; i++) {
			if ($i ~ /"step"$/) s = $(i + 1)
			if ($i ~ /"time"$/) t = $(i + 1)
		}
		if (s == w) t0 = t
		if (s == n) t1 = t
	} END { if (t1 > t0) printf "%.0f\n", (n - w) * tok / (t1 - t0) }' "$1/metrics.jsonl"
}
cpu_ms() {
	awk -v n=$((STEPS - WARM)) 'FNR == 1 { c[NR] = $1 + $2 } END { printf "%.0f\n", (c[1] - c[2]) * 1000 / n }' \
		"$1.cpu" "$1.w.cpu"
}
# a stage's busy ms per step from the pipeline's line (either form)
busy() { sed -n "s/.*busy ms\/step:.* stage $2 \(([a-z ]*) \)\{0,1\}\([0-9.]*\).*/\2/p" "$1.err" | head -1; }
cpu() {
	sed -n -e "s/.*pipeline CPU ms\/step:.* stage $2 \([0-9.]*\).*/\1/p" \
		-e "s/.*busy ms\/step: stage $2 (this rank) [0-9.]* (CPU \([0-9.]*\)).*/\1/p" "$1.err" | head -1
}
cpu0() { sed -n 's/.*pipeline CPU ms\/step:.* bubble \([0-9.-]*\) with a core each.*/\1/p' "$1.err" | head -1; }
# the pipeline's span in ms a step (ranks: stage 0's, from stage 0's rank)
span() {
	sed -n -e 's/.*pipeline busy ms\/step:.* span \([0-9.]*\); bubble.*/\1/p' \
		-e "s/.*the pipe's ranks:.* span \([0-9.]*\) (stage [0-9]*'s).*/\1/p" "$1.err" | head -1
}
# the bubble's first part: the busiest stage's idle share of the span
busiest() { sed -n 's/.*busiest stage [0-9]* idle \([0-9.-]*\).*/\1/p' "$1.err" | head -1; }
# wall ms a step from tok/s
step_ms() { tps "$1" | awk '{ if ($1 > 0) printf "%.1f\n", 2048000 / $1 }'; }
bubble() { sed -n 's/.*; bubble \([0-9.-]*\) (schedule.*/\1/p' "$1.err" | head -1; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "n/a" }'; }

echo "load average: $(cat /proc/loadavg)"
echo "$INI: 2,048 tokens a step, $RUNS round(s) of $STEPS steps (tok/s from step $WARM)"
for r in $(seq "$RUNS"); do
	for w in "" .w; do # the whole run, and the same stopped at step WARM
		[ -z "$w" ] || export N=$WARM
		one "$tmp/one.$r$w"
		for M in 4 8; do
			ranks "$tmp/ranks$M.$r$w" $M
			devices "$tmp/devices$M.$r$w" $M
		done
		ranks "$tmp/ranks8e.$r$w" 8 pipeline.early_forwards=1
		ranks "$tmp/ranks8t.$r$w" 8 plugin.gloo.shm_p2p=0
		unset N
	done
done
# col NAME FN [ARG]: the median over the rounds of FN NAME.r ARG
col() { for r in $(seq "$RUNS"); do $2 "$tmp/$1.$r" ${3:-}; done | median; }
base=$(col one tps)
printf '%-8s %3s %8s %6s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n' run M tok/s x1x1 step_ms span cpu_ms \
	s0_ms s1_ms s0_cpu s1_cpu bubble busiest cpu0 theory
row() { # row NAME LABEL M
	t=$(col "$1" tps)
	printf '%-8s %3s %8s %6s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n' "$2" "$3" "$t" \
		"$(awk -v a="$t" -v b="$base" 'BEGIN { if (b > 0 && a > 0) printf "%.2f", a / b; else print "n/a" }')" \
		"$(col "$1" step_ms)" "$(col "$1" span)" \
		"$(col "$1" cpu_ms)" "$(col "$1" busy 0)" "$(col "$1" busy 1)" "$(col "$1" cpu 0)" \
		"$(col "$1" cpu 1)" "$(col "$1" bubble)" "$(col "$1" busiest)" "$(col "$1" cpu0)" \
		"$(awk -v m="$3" 'BEGIN { if (m > 0) printf "%.3f", 1 / (m + 1); else print "-" }')"
}
row one 1x1 -
for M in 4 8; do
	row ranks$M ranks $M
	row devices$M devices $M
done
row ranks8e ranks+e 8
row ranks8t rank/tcp 8
