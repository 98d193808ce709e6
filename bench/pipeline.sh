#!/bin/sh
# Pipeline bubble and activation memory (docs/pipeline.md), on an MLP of
# four equal 1024x1024 linear layers (synthetic 32x32 images), batch 256,
# one thread per stage.  For M = 4, 8, 16 micro-batches:
#   serial  the model on one stage, M micro-batches, [plugin.cpu] async = 0:
#           the work of a step, T1 = 1 / its steps/s
#   pipe    2 stages (fc1..r2 | fc3..loss), async = 1: each stage's stream a
#           worker thread of its own, T2
#   bubble  measured 1 - T1 / (P T2) beside the schedule's (P-1)/(M+P-1)
#   memory  the activation arenas of gpipe and 1f1b (from the pipeline's log)
# Medians of RUNS interleaved runs.  Needs P idle cores to mean anything.
# Usage: bench/pipeline.sh [RUNS]  (from the top of the build tree)
set -eu
RUNS=${1:-3}
KILN=${KILN:-./kiln}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/p.ini" <<EOF
[run]
seed = 1
threads = 1
out_dir = $tmp/run
[data]
source = synthetic
samples = 8192
image_size = 32
classes = 16
workers = 1
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 1024
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 1024
[layer.r2]
type = relu
[layer.fc3]
type = linear
out = 1024
[layer.r3]
type = relu
[layer.fc4]
type = linear
out = 16
[layer.loss]
type = softmax_xent
[train]
epochs = 1
max_steps = 24
batch = 256
lr = 0.01
log_every = 1000
eval = 0
checkpoint_last = 0
overwrite = 1
EOF
sps() { # sps ARGS...: samples/s of one run
	"$KILN" train "$tmp/p.ini" "$@" 2>"$tmp/err" | sed -n 's/.*"train_samples_per_s": *\([0-9.]*\).*/\1/p' | tail -1
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "load average: $(cat /proc/loadavg)"
printf '%4s %10s %10s %10s %10s %12s %12s\n' M serial_sps pipe_sps bubble theory gpipe_MiB 1f1b_MiB
for M in 4 8 16; do
	: > "$tmp/s"; : > "$tmp/p"
	for r in $(seq "$RUNS"); do
		sps pipeline.micro_batches=$M >> "$tmp/s"
		sps pipeline.micro_batches=$M model.stages="flat,r2|fc3,loss" plugin.cpu.async=1 >> "$tmp/p"
	done
	s=$(median < "$tmp/s"); p=$(median < "$tmp/p")
	mem() { "$KILN" train "$tmp/p.ini" train.max_steps=1 pipeline.micro_batches=$M model.stages="flat,r2|fc3,loss" pipeline.schedule=$1 2>&1 >/dev/null |
		sed -n 's/.*activation sets (\([0-9.]*\) MiB).*/\1/p'; }
	g=$(mem gpipe); f=$(mem 1f1b)
	awk -v M=$M -v s="$s" -v p="$p" -v g="$g" -v f="$f" 'BEGIN {
		printf "%4d %10.0f %10.0f %10.3f %10.3f %12.2f %12.2f\n", M, s, p, 1 - p / (2 * s), 1 / (M + 1), g, f }'
done
