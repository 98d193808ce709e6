#!/bin/sh
# bench/pipeline_pair.sh [--short] [RUNS]: bench/pipeline.sh's blocks model
# (2 x (linear 1024 + relu) a stage, batch 256, 1f1b) on 2 RANKS, `kiln
# launch -n 2` with [dist] pipeline = 2 (gloo's shared-memory channels, 1
# thread a rank), interleaved: this build with [pipeline] sendrecv = 1
# (pair: a stage's send and the recv from the same stage after it in one
# sendrecv; issue 21, session 13; docs/pipeline.md, docs/PERFORMANCE.md),
# this build with the default 0 (off), and another build (main).
# For M = 4, 8, 16, medians of RUNS rounds (default 3) of each side:
#   bubble   the pipe's bubble at stage 0's rank (every rank's busy time:
#            the log's "pipeline busy ms/step, the pipe's ranks" line)
#   theory   (P-1)/(M+P-1); rel: (bubble - theory) / theory
#   sps      samples/s: the median over a run's steps 2..STEPS of the
#            per-step samples_per_s in rank 0's metrics.jsonl ([train]
#            log_every = 1; step 1, the warm-up, left out), the median of
#            those over the rounds (before session 14: the final event's
#            train_samples_per_s, the whole epoch with its first step, of
#            whichever rank printed it last)
#   paired   a rank's crossing tensors sent paired / all (pair's last run)
# and, per M, where the bubble goes for pair, off and main (the pipe
# replayed at stage 0's rank from every rank's stamps, "the ranks' stamps:"
# lines; session 14; main's since session 17, for the channel's hand-offs:
# its columns are empty for a build without those lines), medians:
#   smooth   every pass at its stage's mean, instant hand-offs: the
#            schedule's bubble plus the stages' imbalance
#   ideal    every pass as measured, instant hand-offs (+ the variation)
#   ho_med   a hand-off's median latency (us): the other stage's pass's
#            end to the start of the pass that waited for it
#   own_us   the mean wall time between a stage's passes where it did not
#            wait for the other stage (its sends and recvs, the stamps)
#   cpu_sm   smooth in the passes' CPU times
#   ends     smooth, but the step's first forward and last backward as
#            measured (their first-touch and tail work; session 16)
#   busiest  the busiest stage's idle fraction (the bubble less the stages'
#            imbalance; "= busiest stage S idle X + imbalance I" in the
#            pipe's ranks' line; session 16)
#   cpu_imb  the stages' imbalance in CPU time, percent: (stage 0 - stage 1)
#            / their mean, of the ranks' stamps' "pipeline CPU ms/step"
#            (session 18; at P = 2 the target at M = 16 needs |cpu_imb|
#            within about 0.5)
# and, per M and side, the ranks' stamps' "pipeline passes' means" line
# (session 18, issue 21: why smooth stays above theory for equal stages),
# medians:
#   f0 b0 f1 b1  stage 0's and stage 1's mean forward and backward, wall ms
#   (cpu)        the same in CPU ms
#   share        smooth with every stage's total kept and split as the
#                stages' forwards and backwards together are (its excess
#                over theory: the stages' unequal totals)
#   total        smooth with every stage's split kept and its total the
#                stages' mean (its excess: their unequal splits)
#   spread       the stages' totals' spread within a step, (max - min) /
#                mean, %, wall (CPU): a step's imbalance, which the means
#                over the steps (f0 ... b1) can hide
# Usage (from the top of the build tree):
#   B=/work/main sh bench/pipeline_pair.sh 3
# pair, off: this build (./kiln, ./plugins/.libs); main: the build tree in
# $B (default /work/main).  --short: one round of 4 steps.
# PAIR_ARGS: more KEY=VALUE for every run (e.g. plugin.gloo.shm_p2p=0).
# (Since session 27 the hand-offs are in place by default: the crossing
# tensors in memory both ranks map, 8-byte tokens through the channel,
# docs/pipeline.md "Hand-offs in place"; PAIR_ARGS=pipeline.zero_copy=0 sends
# the tensors on every side, B=<a build before 8d9f93c> for main alone.)
# PAIR_VALUE: the pair side's [pipeline] sendrecv (default 1; auto: the
# default since session 14, paired on mpi, not on gloo).
# PAIR_COMM=mpi: the 2 ranks under mpirun on kiln-mpi (thread_level =
# multiple) instead of kiln launch on gloo (session 13, point-to-point waits).
# MS: the micro-batch counts (default "4 8 16").
# MODEL=even: a layernorm before the head too, so stage 1 carries what stage
# 0's layernorm costs and the stages are within ~1-2% (the blocks model's
# stage 0 is 3-6% busier in CPU time: session 16).
# MODEL=mirror (session 18): stages equal by construction, to measure the
# schedule's bubble rather than a cut's imbalance: 16 inputs (4 x 4 images)
# that stage 0 widens to 1024 (a linear and a relu) before two 1024-wide
# blocks, stage 1 two blocks and the head narrowing 1024 to 16: each stage
# six 1024 x 1024 GEMMs a micro-batch and a 16-wide linear (stage 0's
# without its input's gradient, stage 1's with it, stage 0 one relu more),
# no layernorm.  The blocks model's figures stay the record of an
# imbalanced cut (docs/PERFORMANCE.md, "Session 18: balancing the
# pipeline's stages").
# STAGES: the [model] stages value (default flat,r2|b3,loss, the two blocks
# a stage that every MODEL has; `auto`: kiln's cut by estimated FLOPs,
# session 18: the same cut for these models; B must then be a build that
# has it, for the main side too).
# The issue-21 commands (session 18; a quiet window: load under 2):
#   MS="4 8 16" BATCH=2048 B=/work/main sh bench/pipeline_pair.sh 3
#   MODEL=mirror MS="4 8 16" BATCH=2048 B=/work/main sh bench/pipeline_pair.sh 3
# BATCH: the global batch (default 256; 2048 gives 128 rows a micro-batch at
# M = 16, session 16); the synthetic set holds BATCH x STEPS samples at least.
set -eu
STEPS=12
BATCH=${BATCH:-256}
if [ "${1:-}" = "--short" ]; then
	shift
	STEPS=4
	RUNS=${1:-1}
else
	RUNS=${1:-3}
fi
A=$(pwd)
B=${B:-/work/main}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# kiln's caches (the CPU tune cache: its timings under this run's load) in
# the scratch directory, shared by this script's runs, not the user's
# ~/.cache (bench/common.sh's rule), unless the caller set XDG_CACHE_HOME
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$tmp/cache}"
export KILN_STORE_TOKEN=${KILN_STORE_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
. "$(dirname "$0")/../tests/config_lib.sh"
{
	ini run seed=1 threads=1 out_dir="$tmp/run"
	_n=$((BATCH * STEPS))
	[ "$_n" -ge 8192 ] || _n=8192
	if [ "${MODEL:-blocks}" = mirror ]; then
		# 16 inputs (4 x 4): stage 0 widens them to 1024, stage 1's head
		# narrows 1024 to the 16 classes; two 1024-wide blocks each
		ini_synthetic "$_n" 4 16 image_channels=1 workers=1
		ini_layers flat:flatten in:linear:out=1024 r0:relu b1:linear:out=1024 r1:relu \
			b2:linear:out=1024 r2:relu b3:linear:out=1024 r3:relu \
			b4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
	else
		ini_synthetic "$_n" 32 16 image_channels=1 workers=1
		ini_layers flat:flatten ln:layernorm b1:linear:out=1024 r1:relu b2:linear:out=1024 r2:relu \
			b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu \
			$([ "${MODEL:-blocks}" = even ] && echo ln2:layernorm) head:linear:out=16 loss:softmax_xent
	fi
	ini train epochs=1 max_steps="$STEPS" batch="$BATCH" lr=0.01 log_every=1 eval=0 \
		checkpoint_last=0 overwrite=1
	ini dist timeout=120
} > "$tmp/p.ini"
# run SIDE(pair|off|main) OUT M: one run of 2 ranks, its output in OUT
run() {
	_d=$A _x=pipeline.sendrecv=${PAIR_VALUE:-1}
	[ "$1" = pair ] || _x=pipeline.sendrecv=0
	[ "$1" = main ] && _d=$B _x=
	# shellcheck disable=SC2086 # _x, PAIR_ARGS: words
	if [ "${PAIR_COMM:-gloo}" = mpi ]; then
		set -- "$1" "$2" "$3" timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 \
			-x KILN_PLUGIN_PATH="$_d/plugins/.libs" \
			-x KILN_MASTER_PORT=$((30000 + ($$ + $3) % 20000)) -x OMP_NUM_THREADS=1 \
			"$_d/kiln" train "$tmp/p.ini" plugin.mpi.thread_level=multiple
	else
		set -- "$1" "$2" "$3" env KILN_PLUGIN_PATH="$_d/plugins/.libs" \
			KILN_MASTER_PORT=$((30000 + ($$ + $3) % 20000)) \
			timeout 600 "$_d/kiln" launch -n 2 -- "$_d/kiln" train "$tmp/p.ini"
	fi
	_o=$2 _s=$1 _m=$3
	shift 3
	rm -rf "$tmp/run"
	"$@" dist.pipeline=2 "model.stages=${STAGES:-flat,r2|b3,loss}" pipeline.micro_batches="$_m" $_x ${PAIR_ARGS:-} > "$_o" 2>&1 ||
		{ echo "$_s M=$_m failed:" >&2; tail -5 "$_o" >&2; }
}
median() { sort -g | awk '{ a[NR] = $1 } END { print NR ? a[int((NR + 1) / 2)] : "-" }'; }
bubble() { sed -n "s/.*the pipe's ranks:.*; bubble \([0-9.-]*\) (schedule.*/\1/p" "$1" | tail -1; }
# sps: the run's median samples/s a step over steps 2.. (rank 0's metrics.jsonl)
sps() {
	sed -n 's/.*"event":"train",.*"step":\([0-9]*\),.*"samples_per_s":\([0-9.e+]*\),.*/\1 \2/p' \
		"$tmp/run/metrics.jsonl" | awk '$1 >= 2 { print $2 }' | median
}
# split LOG K: the ranks' stamps' 1 smooth, 2 ideal, 3 ho_med, 4 own_us, 5 cpu_sm,
# 6 the busiest stage's idle, 7 ends, 8 cpu_imb; 9-16 the passes' means
# (f0 b0 f1 b1 wall, then CPU), 17 share, 18 total, 19 spread, 20 its CPU
split() {
	if [ "$2" -ge 9 ]; then
		sed -n "s/.*the ranks' stamps: pipeline passes' means, ms (CPU): stage 0 forward \([0-9.]*\) (\([0-9.]*\)) backward \([0-9.]*\) (\([0-9.]*\)), stage 1 forward \([0-9.]*\) (\([0-9.]*\)) backward \([0-9.]*\) (\([0-9.]*\)), smooth bubble \([0-9.]*\) with the stages' forward share alike, \([0-9.]*\) with their totals alike.*/\1 \3 \5 \7 \2 \4 \6 \8 \9/p" "$1" |
			tail -1 > "$1.pm"
		# sed has nine groups: the last figure on its own
		sed -n "s/.*the ranks' stamps: pipeline passes' means, .*, \([0-9.]*\) with their totals alike.*/\1/p" "$1" | tail -1 > "$1.pt"
		sed -n "s/.*the ranks' stamps: pipeline passes' means, .*; the totals' spread a step \([0-9.]*\)% (CPU \([0-9.]*\)%).*/\1 \2/p" "$1" | tail -1 > "$1.ps"
		case $2 in
		18) cat "$1.pt" ;;
		19 | 20) cut -d' ' -f$(($2 - 18)) "$1.ps" ;;
		*) cut -d' ' -f$(($2 - 8)) "$1.pm" ;;
		esac
		return
	fi
	if [ "$2" = 8 ]; then
		sed -n "s/.*the ranks' stamps: pipeline CPU ms\/step: stage 0 \([0-9.]*\), stage 1 \([0-9.]*\),.*/\1 \2/p" "$1" |
			tail -1 | awk '{ printf "%+.1f\n", 200 * ($1 - $2) / ($1 + $2) }'
		return
	fi
	if [ "$2" = 7 ]; then
		sed -n "s/.*the ranks' stamps: pipeline smooth replay: bubble [0-9.]* (schedule [^)]*), \([0-9.]*\) with the end passes as measured.*/\1/p" "$1" | tail -1
		return
	fi
	if [ "$2" = 6 ]; then
		sed -n "s/.*the pipe's ranks:.* = busiest stage [0-9]* idle \([0-9.-]*\) + imbalance.*/\1/p" "$1" | tail -1
		return
	fi
	sed -n "s/.*the ranks' stamps: pipeline smooth replay: bubble \([0-9.]*\) (schedule.*, \([0-9.]*\) with every pass as measured, [0-9.]* measured; \([0-9.]*\) in CPU time/\1 \2 \3/p" "$1" |
		tail -1 > "$1.sm"
	sed -n "s/.*the ranks' stamps: pipeline gaps: .*(median \([0-9]*\), 90%.*one after its own stage's previous \([0-9.]*\) us after it.*/\1 \2/p" "$1" |
		tail -1 > "$1.ho"
	case $2 in
	1 | 2) cut -d' ' -f"$2" "$1.sm" ;;
	3 | 4) cut -d' ' -f$(($2 - 2)) "$1.ho" ;;
	5) cut -d' ' -f3 "$1.sm" ;;
	esac
}
paired() { sed -n "s/.*stage 0 (this rank): \([0-9]*\) of \([0-9]*\) crossing tensors sent paired.*/\1\/\2/p" "$1" | tail -1; }
echo "load average: $(cat /proc/loadavg)"
echo "${MODEL:-blocks} model (stages ${STAGES:-flat,r2|b3,loss}), batch $BATCH, 2 stages on 2 ranks (${PAIR_COMM:-gloo}, 1 thread each), 1f1b ${PAIR_ARGS:-}; this build $A, main $B; $RUNS round(s) of $STEPS steps; s_*: samples/s, median of each run's steps 2-$STEPS (rank 0's metrics.jsonl, log_every = 1), median over the rounds"
printf '%4s %6s %6s %5s %6s %5s %6s %5s %6s %6s %6s %7s\n' M theory b_pair rel b_off rel b_main rel \
	s_pair s_off s_main paired
for M in ${MS:-4 8 16}; do
	for s in pair off main; do : > "$tmp/b$s"; : > "$tmp/s$s"; done
	for s in pair off main; do for k in $(seq 20); do : > "$tmp/x$s$k"; done; done
	for r in $(seq "$RUNS"); do
		for s in pair off main; do
			run $s "$tmp/$s.log" "$M"
			bubble "$tmp/$s.log" >> "$tmp/b$s"
			sps "$tmp/$s.log" >> "$tmp/s$s"
			for k in $(seq 20); do split "$tmp/$s.log" $k >> "$tmp/x$s$k"; done
		done
	done
	awk -v M="$M" -v a="$(median < "$tmp/bpair")" -v b="$(median < "$tmp/boff")" \
		-v c="$(median < "$tmp/bmain")" -v sa="$(median < "$tmp/spair")" \
		-v sb="$(median < "$tmp/soff")" -v sc="$(median < "$tmp/smain")" -v p="$(paired "$tmp/pair.log")" '
		BEGIN { t = 1 / (M + 1)
		printf "%4d %6.3f %6.3f %4.0f%% %6.3f %4.0f%% %6.3f %4.0f%% %6.0f %6.0f %6.0f %7s\n", M, t,
			a, 100 * (a - t) / t, b, 100 * (b - t) / t, c, 100 * (c - t) / t, sa, sb, sc,
			p == "" ? "-" : p }'
	for s in pair off main; do
		printf '%4s %4s %6s %6s %6s %6s %6s %6s %6s %6s (%s: smooth ends ideal ho_med own_us cpu_sm busiest cpu_imb)\n' "" "$s" \
			"$(median < "$tmp/x${s}1")" "$(median < "$tmp/x${s}7")" "$(median < "$tmp/x${s}2")" "$(median < "$tmp/x${s}3")" \
			"$(median < "$tmp/x${s}4")" "$(median < "$tmp/x${s}5")" "$(median < "$tmp/x${s}6")" \
			"$(median < "$tmp/x${s}8")" "$s"
	done
	for s in pair off main; do
		printf '%4s %4s %6s %6s %6s %6s (%s %s %s %s) %6s %6s %5s (%s) (%s: f0 b0 f1 b1 wall ms (CPU), smooth with shares alike, totals alike, spread %% (CPU))\n' "" "$s" \
			"$(median < "$tmp/x${s}9")" "$(median < "$tmp/x${s}10")" "$(median < "$tmp/x${s}11")" "$(median < "$tmp/x${s}12")" \
			"$(median < "$tmp/x${s}13")" "$(median < "$tmp/x${s}14")" "$(median < "$tmp/x${s}15")" "$(median < "$tmp/x${s}16")" \
			"$(median < "$tmp/x${s}17")" "$(median < "$tmp/x${s}18")" "$(median < "$tmp/x${s}19")" "$(median < "$tmp/x${s}20")" "$s"
	done
done
