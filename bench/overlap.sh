#!/bin/sh
# bench/overlap.sh [COMM] [BATCH] [KEY=VALUE...] - DDP overlap on this machine: the same
# MLP (784-1024-1024-10, 1.86 M floats of gradients in 1 MiB buckets) with
# 1 thread per rank, trained by one process and by 2 ranks at the same
# per-rank batch (default 64), COMM gloo (default, `kiln launch`) or mpi
# (mpirun).  Prints each run's step time (per-rank batch / the rank's
# samples/s, timed from epoch 2) and, from [dist] timing = 1 (host
# stamps on the streams, nothing serialised), the exposed communication
# per step (the optimizer's wait after backward) against the allreduce
# time, with overlap = 1 and = 0; the overrides go to every run.  From
# the build directory:
#   sh bench/overlap.sh gloo 64
#   sh bench/overlap.sh gloo 64 plugin.gloo.busy_poll=1
set -u
comm=${1:-gloo}
batch=${2:-64}
[ $# -ge 2 ] && shift 2 || shift $#
b=$(cd "$(dirname "$0")/.." && pwd)
kiln="$b/kiln"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/mlp.ini" <<INI
[run]
seed = 1
threads = 1
comm = $comm
[data]
source = idx
limit = 8192
mean = 0.286
std = 0.353
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
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 3
batch = $batch
lr = 0.01
momentum = 0.9
log_every = 16
eval = 0
[plugin.cpu]
async = 1
[dist]
bucket_mb = 1
timing = 1
INI
step_ms() { # LOG: per-rank batch / samples per second of rank 0
	sps=$(grep -o '"train_samples_per_s": *[0-9.e+]*' "$1/metrics.jsonl" | tail -1 | sed 's/.*: *//')
	awk -v s="$sps" -v b="$batch" 'BEGIN { printf "%.2f", 1000 * b / s }'
}
exposed() { # LOG: "exposed X ms / allreduce Y ms (Z%)" from the last summary
	grep "exposed communication" "$1" | head -1 | sed 's/.*exposed communication \([0-9.]*\) ms\/step, allreduce \([0-9.]*\) ms\/step.*(\([0-9.]*\)% exposed).*/exposed \1 ms, allreduce \2 ms (\3%)/'
}
run2() { # NAME overrides...
	name=$1
	shift
	if [ "$comm" = mpi ]; then
		mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_MASTER_PORT=$(( 30000 + $$ % 20000 )) \
			-x OMP_NUM_THREADS=1 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/$name" "$@" $extra \
			> "$tmp/$name.log" 2>&1
	else
		"$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/$name" "$@" $extra \
			> "$tmp/$name.log" 2>&1
	fi || { echo "$name failed:"; tail -5 "$tmp/$name.log"; exit 1; }
}
"$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/one" run.comm=none > "$tmp/one.log" 2>&1 ||
	{ tail -5 "$tmp/one.log"; exit 1; }
extra="$*"
run2 two
run2 two_noov dist.overlap=0
one=$(step_ms "$tmp/one") two=$(step_ms "$tmp/two") noov=$(step_ms "$tmp/two_noov")
echo "DDP overlap, $comm, batch $batch per rank, 1 thread per rank, $(nproc) cores"
echo "  1 process:          step $one ms"
echo "  2 ranks, overlap:   step $two ms ($(awk -v a="$two" -v b="$one" 'BEGIN{printf "%.2f", a/b}')x); $(exposed "$tmp/two.log")"
echo "  2 ranks, no overlap: step $noov ms ($(awk -v a="$noov" -v b="$one" 'BEGIN{printf "%.2f", a/b}')x); $(exposed "$tmp/two_noov.log")"
