#!/bin/sh
# bench/stage_cut_ab.sh [RUNS]: [model] stages = auto's cut and what each
# stage measures, this build against another (B), interleaved (session 20,
# issue 21: the auto cut counts memory traffic; docs/pipeline.md,
# "Balanced stages").  For each model, 2 stages on 2 ranks (`kiln launch
# -n 2`, [dist] pipeline = 2, gloo, 1 thread a rank, 1f1b), RUNS rounds
# (default 3) of this build then B:
#   blocks, even, mirror  bench/pipeline_pair.sh's models, batch 2048, M = 16
#   gpt                   examples/gpt_char_split.ini (M = 8), its data made
#                         by scripts/make-gpt-char-data in the scratch dir
#   seq2seq               examples/seq2seq_split.ini (M = 4)
#   resnet                examples/fashion_mnist_resnet.ini on synthetic
#                         28 x 28 images, batch 128, M = 4 (here the bytes
#                         move the cut: s2_bn1, s2_relu1 to stage 1)
# and prints each side's cut (the log's `[model] stages = auto:` line) and
# the medians of the ranks' stamps' "pipeline passes' means" (CPU ms):
# f0 b0 f1 b1, each stage's forward and backward a micro-batch, and imb,
# the busiest stage's f + b over the stages' mean, percent; bubble, the
# pipe's bubble at stage 0's rank (the "pipe's ranks" line; wall time:
# judge it only in a quiet window), and cpu, the same in CPU time with a
# core each and instant hand-offs (the ranks' stamps' "pipeline CPU
# ms/step" line: what the stages' imbalance adds to the schedule's), both
# against (P-1)/(M+P-1).
# Usage (top of the build tree): B=/work/main MODELS="blocks gpt" sh bench/stage_cut_ab.sh 3
set -eu
RUNS=${1:-3}
A=$(pwd)
B=${B:-/work/main}
STEPS=${STEPS:-12}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$tmp/cache}"
. "$A/tests/config_lib.sh"
for MODEL in blocks even mirror; do
	{
		ini run seed=1 threads=1
		if [ $MODEL = mirror ]; then
			ini_synthetic $((2048 * STEPS)) 4 16 image_channels=1 workers=1
			ini_layers flat:flatten in:linear:out=1024 r0:relu b1:linear:out=1024 r1:relu \
				b2:linear:out=1024 r2:relu b3:linear:out=1024 r3:relu \
				b4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
		else
			ini_synthetic $((2048 * STEPS)) 32 16 image_channels=1 workers=1
			# shellcheck disable=SC2046 # ln2: a word or none
			ini_layers flat:flatten ln:layernorm b1:linear:out=1024 r1:relu b2:linear:out=1024 \
				r2:relu b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu \
				$([ "$MODEL" = even ] && echo ln2:layernorm) head:linear:out=16 loss:softmax_xent
		fi
		ini train epochs=1 max_steps="$STEPS" batch=2048 lr=0.01 log_every=100 eval=0 \
			checkpoint_last=0 overwrite=1
		ini pipeline micro_batches=16
		ini dist timeout=120
	} > "$tmp/$MODEL.ini"
done
# args MODEL: the config and its keys
args() {
	case $1 in
	gpt) echo "$A/examples/gpt_char_split.ini data.path=$tmp/gpt_char run.devices= train.eval=0 train.max_steps=$STEPS train.checkpoint_every=0" ;;
	seq2seq) echo "$A/examples/seq2seq_split.ini run.devices= train.eval=0 train.max_steps=$STEPS data.samples=4096" ;;
	resnet) echo "$A/examples/fashion_mnist_resnet.ini data.source=synthetic data.samples=$((128 * STEPS)) data.image_size=28 data.image_channels=1 data.classes=10 pipeline.micro_batches=4 train.eval=0 train.max_steps=$STEPS train.log_every=100 dist.timeout=120" ;;
	*) echo "$tmp/$1.ini" ;;
	esac
}
case " ${MODELS:-blocks mirror gpt seq2seq resnet} " in
*" gpt "*) KILN="$A/kiln" "$A/scripts/make-gpt-char-data" "$tmp/gpt_char" > /dev/null 2>&1 ;;
esac
median() { sort -g | awk '{ a[NR] = $1 } END { print NR ? a[int((NR + 1) / 2)] : "-" }'; }
echo "load average: $(cat /proc/loadavg)"
for MODEL in ${MODELS:-blocks mirror gpt seq2seq resnet}; do
	for s in A B; do : > "$tmp/$s.fig"; : > "$tmp/$s.bub"; : > "$tmp/$s.cbub"; done
	for r in $(seq "$RUNS"); do
		for s in A B; do
			d=$A
			[ $s = B ] && d=$B
			rm -rf "$tmp/run"
			# shellcheck disable=SC2046 # args: words
			env KILN_PLUGIN_PATH="$d/plugins/.libs" KILN_MASTER_PORT=$((30000 + ($$ + r) % 20000)) \
				timeout 600 "$d/kiln" launch -n 2 -- "$d/kiln" train $(args "$MODEL") \
				run.out_dir="$tmp/run" run.threads=1 dist.pipeline=2 model.stages=auto \
				> "$tmp/$s.log" 2>&1 || { echo "$s $MODEL failed:" >&2; tail -5 "$tmp/$s.log" >&2; }
			grep -o "stages = auto: [^(]*" "$tmp/$s.log" | head -1 > "$tmp/$s.cut"
			sed -n "s/.*the ranks' stamps: pipeline passes' means, ms (CPU): stage 0 forward [0-9.]* (\([0-9.]*\)) backward [0-9.]* (\([0-9.]*\)), stage 1 forward [0-9.]* (\([0-9.]*\)) backward [0-9.]* (\([0-9.]*\)).*/\1 \2 \3 \4/p" \
				"$tmp/$s.log" | tail -1 >> "$tmp/$s.fig"
			sed -n "s/.*the pipe's ranks:.*; bubble \([0-9.-]*\) (schedule.*/\1/p" "$tmp/$s.log" | tail -1 >> "$tmp/$s.bub"
			sed -n "s/.*the ranks' stamps: pipeline CPU ms\/step: .* and bubble \([0-9.-]*\) with a core each.*/\1/p" "$tmp/$s.log" | tail -1 >> "$tmp/$s.cbub"
		done
	done
	for s in A B; do
		printf '%-8s %s %-40s' "$MODEL" "$s" "$(cat "$tmp/$s.cut")"
		for k in 1 2 3 4; do printf ' %7s' "$(cut -d' ' -f$k "$tmp/$s.fig" | median)"; done
		awk '{ a = $1 + $2; b = $3 + $4; m = a > b ? a : b; print 100 * (2 * m / (a + b) - 1) }' "$tmp/$s.fig" |
			median | awk '{ printf "  imb %.1f%%", $1 }'
		printf '  bubble %s cpu %s\n' "$(median < "$tmp/$s.bub")" "$(median < "$tmp/$s.cbub")"
	done
done
echo "A: $A, B: $B; columns: f0 b0 f1 b1 CPU ms a micro-batch (medians of $RUNS), imb: the busiest stage over the mean (median), bubble, cpu (medians)"
echo "load average: $(cat /proc/loadavg)"
