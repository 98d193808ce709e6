#!/bin/sh
# bench/pipeline_ranks.sh [--short] [RUNS]: what a rank of a pipeline on
# ranks averages and holds (issue 21, items 1 and 4; docs/pipeline.md,
# "Stages on ranks"; docs/PERFORMANCE.md).  bench/overlap.sh's MLP
# (784-1024-1024-10, synthetic 28x28 samples, 1 thread a rank, async CPU
# streams, 1 MiB buckets, [dist] timing = 1), 4 ranks of gloo:
#   ddp    plain DDP over the 4 ranks, batch 64 a rank
#   pipe   [dist] pipeline = 2 (P = 2 x D = 2; fc2 onward on stage 1),
#          batch 128 a pipe in 2 micro-batches (the same global batch)
#   pipez  the same with [dist] zero = 1 (ZeRO-1 within each stage's 2
#          ranks; from session 8)
# each 40 steps (--short: 12), RUNS interleaved rounds (default 3).
# Columns (medians over the rounds): samples/s (the ranks' epoch lines:
# the global batch of 256 a step in both rows, per second), the
# floats each rank allreduces per step, rank 0's and rank 1's allreduce
# ms per step on the comm stream and its exposed share ([dist] timing), and
# the optimizer state rank 0 and 1 hold (the log's per-stage line; ddp:
# the whole model's).  From the build directory: sh bench/pipeline_ranks.sh
set -u
steps=40
[ "${1:-}" = --short ] && { steps=12; shift; }
runs=${1:-3}
b=$(cd "$(dirname "$0")/.." && pwd)
KILN=${KILN:-$b/kiln}
. "$b/bench/common.sh" # real_kiln: time the binary, not libtool's wrapper
real_kiln
kiln=$KILN
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; bench_cache_rm' EXIT
export KILN_STORE_TOKEN=${KILN_STORE_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
. "$b/tests/config_lib.sh"
{
	ini run seed=1 threads=1
	ini_synthetic 16384 28 10 workers=0
	ini_layers flat:flatten fc1:linear:out=1024 r1:relu fc2:linear:out=1024 r2:relu \
		fc3:linear:out=10 loss:softmax_xent
	ini train epochs=1 max_steps="$steps" lr=0.01 momentum=0.9 log_every=1000 eval=0
	ini plugin.cpu async=1
	ini dist bucket_mb=1 timing=1 timeout=120
} > "$tmp/mlp.ini"
one() { # NAME ROUND KEY=VALUE...: one run of 4 ranks
	_n=$1 _r=$2
	shift 2
	KILN_MASTER_PORT=$(( 30000 + ($$ + _r) % 20000 )) timeout 600 "$kiln" launch -n 4 -- "$kiln" train \
		"$tmp/mlp.ini" run.out_dir="$tmp/$_n$_r" "$@" > "$tmp/$_n.$_r.log" 2>&1 ||
		{ echo "$_n round $_r failed:" >&2; tail -5 "$tmp/$_n.$_r.log" >&2; }
}
r=1
while [ $r -le "$runs" ]; do
	one ddp $r train.batch=64
	one pipe $r train.batch=128 dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2
	one pipez $r train.batch=128 dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2 \
		dist.zero=1
	r=$((r + 1))
done
med() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; else print "-"}'; }
rank_ms() { # NAME RANK FIELD(1: allreduce ms, 2: exposed %)
	for f in "$tmp/$1".*.log; do
		sed -n "s/.*rank $2: over [0-9]* steps, exposed communication [0-9.]* ms\/step, allreduce \([0-9.]*\) ms\/step.*(\([0-9.]*\)% exposed).*/\1 \2/p" "$f" |
			cut -d' ' -f"$3"
	done | med
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $runs round(s) of $steps steps"
printf '%-5s %10s %22s %10s %10s %8s %8s %22s\n' run samples/s "floats allreduced r0/r1" r0_ms r1_ms r0_exp% r1_exp% "optim MiB r0/r1"
for n in ddp pipe pipez; do
	sps=$(cat "$tmp/$n".*.log | sed -n 's/.*epoch 1\/1: .*, \([0-9]*\) samples\/s).*/\1/p' | med)
	fl=$(sed -n 's/.*\[dist\] \(rank [01]\).*over \([0-9]*\) floats.*/\1 \2/p; s/.*gradient bucket(s) of up to .* over \([0-9]*\) floats.*/x \1/p' "$tmp/$n.1.log" |
		awk '{print $NF}' | sort -un | tr '\n' '/' | sed 's/\/$//')
	om=$(sed -n 's/.*rank \([01]\) (pipeline stage .*optimizer state \([0-9.e-]*\) MiB.*/\1 \2/p
		s/.*ZeRO-1: rank \([01]\) updates .*optimizer state \([0-9.e-]*\) MiB.*/\1 \2/p' "$tmp/$n.1.log" |
		sort | awk '{print $2}' | tr '\n' '/' | sed 's/\/$//')
	printf '%-5s %10s %22s %10s %10s %8s %8s %22s\n' "$n" "$sps" "$fl" "$(rank_ms $n 0 1)" \
		"$(rank_ms $n 1 1)" "$(rank_ms $n 0 2)" "$(rank_ms $n 1 2)" "${om:-whole model}"
done
