#!/bin/sh
# tests/dist_mpi.sh - the MPI communicator under mpirun (docs/distributed.md):
# 2 ranks started by `mpirun --allow-run-as-root --oversubscribe -np 2`,
# batch 32 each, end with the parameters and momentum of one process with
# batch 64 (1e-5 relative), and the logged losses agree; so do 2 ranks
# with [dist] zero = 1 (with and without skip_nonfinite).  Every process
# runs under `timeout`.
set -u
: "${top_builddir:=.}"
: "${abs_top_builddir:=$(cd "$top_builddir" && pwd)}"
kiln="$abs_top_builddir/kiln"
tool="$abs_top_builddir/tests/ckpt_tool"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "SKIP: no Fashion-MNIST"; exit 77; }
[ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] || { echo "SKIP: the mpi plugin is not built"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
cat > "$tmp/mlp.ini" <<'INI'
[run]
seed = 7
threads = 1
[data]
source = idx
limit = 2048
mean = 0.286
std = 0.353
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 64
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 2
batch = 64
lr = 0.05
momentum = 0.9
log_every = 16
eval = 0
checkpoint_every = 1000
[plugin.cpu]
async = 1
[dist]
bucket_mb = 0.05
timeout = 30
INI
timeout 120 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/one" > "$tmp/one.log" 2>&1 ||
	{ bad "1 process"; tail "$tmp/one.log"; }
# a TCP port free a moment ago (the rendezvous store binds it next)
free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
		echo $(( 20000 + ($$ + $1) % 20000 ))
}
port=$(free_port 7)
# comm = auto must pick mpi under mpirun
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_MASTER_PORT=$port \
	-x OMP_NUM_THREADS=1 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/mpi" train.batch=32 \
	> "$tmp/mpi.log" 2>&1 || { bad "mpirun -np 2 exited $?"; tail -20 "$tmp/mpi.log"; }
grep -q "rank 1 of 2 (local 1; from Open MPI), comm mpi: Open MPI" "$tmp/mpi.log" ||
	bad "comm = auto did not pick mpi under mpirun"
"$tool" close "$tmp/one/checkpoints/ckpt-64.kiln" "$tmp/mpi/checkpoints/ckpt-64.kiln" 1e-5 \
	params optim.momentum || bad "mpi 2 ranks vs 1 process: parameters differ"
l1=$(grep 'step 32/32' "$tmp/one.log" | tail -1 | sed 's/.*loss \([0-9.]*\).*/\1/')
l2=$(grep 'step 32/32' "$tmp/mpi.log" | tail -1 | sed 's/.*loss \([0-9.]*\).*/\1/')
echo "last logged loss: 1 process $l1, mpi 2 ranks $l2"
[ -n "$l1" ] && [ "$l1" = "$l2" ] || bad "logged losses differ: $l1 $l2"
# ZeRO-1 on MPI (MPI_Reduce_scatter_block, the in-place MPI_Allgather of
# the parameters), once with the gradients gathered back for the finite
# check (the default) and once without (skip_nonfinite = 0)
for z in "" "train.skip_nonfinite=0"; do
	port=$(free_port 8)
	timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_MASTER_PORT=$port \
		-x OMP_NUM_THREADS=1 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/zero" train.batch=32 \
		dist.zero=1 $z > "$tmp/zero.log" 2>&1 || { bad "mpirun ZeRO-1 $z exited $?"; tail -20 "$tmp/zero.log"; }
	grep -q "ZeRO-1: rank 1 updates" "$tmp/zero.log" || bad "ZeRO-1 $z: no shard line"
	"$tool" close "$tmp/one/checkpoints/ckpt-64.kiln" "$tmp/zero/checkpoints/ckpt-64.kiln" 1e-5 \
		params optim.momentum || bad "mpi ZeRO-1 $z vs 1 process: parameters differ"
	rm -rf "$tmp/zero"
done
exit $fail
