#!/bin/sh
# tests/dist_accum.sh - data parallelism with [train] accumulate: the
# last micro-step's backward overlaps the bucket allreduces (PyTorch's
# no_sync() for the micro-steps before it), docs/distributed.md
# "Accumulation".  tests/dist.sh's MLP (Fashion-MNIST, 2048 samples,
# SGD with momentum), 2 epochs of a global batch of 256: 16 optimizer
# steps; 2 ranks of batch 32 with accumulate = 4, buckets of 0.001 MiB
# (2 buckets: fc2's, which fc1's backward can overlap, and fc1's), on
# loopback Gloo.  Asserts:
#  1. every bucket allreduce of rank 0 (2 x 16) starts during the
#     backward (the dist engine's count of buckets the backward hook
#     started, logged at close), and [dist] timing counts some that
#     began before the backward ended (before session 37: none, every
#     bucket started after the last micro-step's backward); with
#     dist.overlap=0 none does; both end equal to one process of batch
#     256 (1e-5), and to each other bit for bit;
#  2. ZeRO-1 (reduce-scatters), with clip_norm (the averaged gradient
#     gathered back) and one bucket of 25 MiB: all started during the
#     backward, equal to one process with the clip (1e-5);
#  3. fp16 with a loss scale that overflows at first (init_scale 2^24,
#     growth_interval 2: steps skipped, the scale backing off and
#     growing) and bf16 with clip_norm: overlap on and off end with the
#     same bytes (parameters, momentum, step counters, the loss scaler);
#  4. a model whose gradients accumulate from a second buffer (a tied
#     linear layer with a bias, tests/tie.sh's model, accumulate = 2):
#     its add runs after the backward, so no bucket starts during it
#     (0 of all, and the log says so), and it ends equal to one process;
#  5. with Open MPI's mpirun and the mpi plugin (when built): as 1.
name=dist-accum needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo
acc="train.accumulate=4 dist.bucket_mb=0.001 dist.timing=1"
# same/close NAME1 NAME2 WHAT [SECTIONS...]: the final checkpoints (step 16)
same() {
	_a=$1 _b=$2 _w=$3
	shift 3
	"$tool" same "$(ck "$_a" 16)" "$(ck "$_b" 16)" "${@:-params}" || bad "$_w: ${*:-params} differ"
}
close() {
	"$tool" close "$(ck "$1" 16)" "$(ck "$2" 16)" 1e-5 params optim.momentum ||
		bad "$3: parameters or momentum differ"
}
# started NAME: "N M", N of rank 0's M bucket collectives started during the backward
started() {
	sed -n 's/.*rank 0: \([0-9]*\) of \([0-9]*\) bucket [a-z-]* started during the backward$/\1 \2/p' "$tmp/$1.log"
}
# early NAME: "N M", N of rank 0's M bucket collectives began before the backward ended ([dist] timing)
early() {
	sed -n 's/.*rank 0: \([0-9]*\) of \([0-9]*\) bucket [a-z-]* began before the backward ended$/\1 \2/p' "$tmp/$1.log"
}

# ---- 1. overlap on the last micro-step -----------------------------------
run one 0 256
run a4 2 32 $acc
run a4o0 2 32 $acc dist.overlap=0
set -- $(started a4) $(early a4)
echo "accumulate 4, overlap: ${1:-?} of ${2:-?} allreduces started during the backward, ${3:-?} of ${4:-?} began before it ended"
[ "${1:-x}" = 32 ] && [ "${2:-x}" = 32 ] ||
	{ bad "accumulate 4: '${1:-?}' of '${2:-?}' bucket allreduces started during the last micro-step's backward, expected 32 of 32"; grep "bucket" "$tmp/a4.log"; }
[ "${3:-0}" -gt 0 ] 2>/dev/null || bad "accumulate 4: no bucket allreduce began before the backward ended ('${3:-?}' of '${4:-?}')"
grep -q "accumulate = 4: .*gradients added by the layers' ops.*; the buckets start during the last micro-batch's backward$" "$tmp/a4.log" ||
	bad "accumulate 4: the log does not say the buckets start during the last micro-batch's backward"
set -- $(started a4o0) $(early a4o0)
[ "${1:-x}" = 0 ] && [ "${2:-x}" = 32 ] && [ "${3:-x}" = 0 ] ||
	bad "accumulate 4, overlap = 0: '${1:-?}' of '${2:-?}' started during the backward, '${3:-?}' began before it ended, expected 0 and 0"
close one a4 "2 ranks x accumulate 4 (overlapped) vs 1 process of batch 256"
close one a4o0 "2 ranks x accumulate 4 (overlap = 0) vs 1 process of batch 256"
same a4 a4o0 "accumulate 4: overlap on vs off" params optim.momentum optim.step

# ---- 2. ZeRO-1 with clip_norm, one bucket ---------------------------------
run oneclip 0 256 train.clip_norm=0.5
run z4 2 32 $acc dist.zero=1 dist.bucket_mb=25 train.clip_norm=0.5
set -- $(started z4)
[ "${1:-x}" = 16 ] && [ "${2:-x}" = 16 ] ||
	{ bad "ZeRO-1, accumulate 4: '${1:-?}' of '${2:-?}' reduce-scatters started during the backward, expected 16 of 16"; grep "bucket" "$tmp/z4.log"; }
close oneclip z4 "ZeRO-1 with clip_norm, accumulate 4 vs 1 process"

# ---- 3. fp16 with skipped steps, bf16 with clip_norm: on = off -----------
fp16="run.precision=fp16 plugin.amp.init_scale=16777216 plugin.amp.growth_interval=2"
run h4 2 32 $acc $fp16
run h4o0 2 32 $acc $fp16 dist.overlap=0
n=$(sed -n 's/^optimizer steps: \([0-9]*\) skipped for non-finite gradients.*/\1/p' "$tmp/h4.log" | head -1)
echo "fp16, accumulate 4: ${n:-no} step(s) of 16 skipped"
[ "${n:-0}" -gt 0 ] 2>/dev/null || bad "fp16 with init_scale 2^24: no step skipped"
set -- $(started h4)
[ "${1:-x}" = 32 ] || bad "fp16, accumulate 4: '${1:-?}' of '${2:-?}' started during the backward, expected 32"
same h4 h4o0 "fp16 with skipped steps: overlap on vs off" params optim.momentum optim.step amp.scaler
run b4 2 32 $acc run.precision=bf16 train.clip_norm=0.5
run b4o0 2 32 $acc run.precision=bf16 train.clip_norm=0.5 dist.overlap=0
same b4 b4o0 "bf16 with clip_norm: overlap on vs off" params optim.momentum optim.step

# ---- 4. a second gradient buffer: after the backward and the add --------
cat > "$tmp/tie.ini" <<EOF
[run]
seed = 3
threads = 1
comm = gloo
[data]
source = synthetic
samples = 512
image_size = 8
classes = 32
[layer.flat]
type = flatten
[layer.a]
type = linear
out = 32
[layer.r1]
type = relu
[layer.c]
type = linear
out = 64
[layer.r2]
type = relu
[layer.b]
type = linear
out = 32
tie = a
[layer.loss]
type = softmax_xent
[train]
epochs = 1
batch = 32
lr = 0.05
momentum = 0.9
log_every = 4
eval = 0
checkpoint_every = 1000
[dist]
bucket_mb = 0.001
timing = 1
timeout = 20
EOF
ini="$tmp/tie.ini"
run tone 0 32
run t2 2 8 train.accumulate=2
grep -q "gradients added from a second buffer.*; the buckets start after the last micro-batch's backward and add$" "$tmp/t2.log" ||
	bad "tied model: the log does not say the buckets start after the second buffer's add"
set -- $(started t2)
[ "${1:-x}" = 0 ] && [ "${2:-0}" -gt 0 ] ||
	bad "tied model, second buffer: '${1:-?}' of '${2:-?}' started during the backward, expected 0 (its add follows the backward)"
"$tool" close "$(ck tone 16)" "$(ck t2 16)" 1e-5 params optim.momentum ||
	bad "tied model, 2 ranks x accumulate 2 vs 1 process: parameters or momentum differ"
ini="$tmp/mlp.ini"

# ---- 5. Open MPI --------------------------------------------------------------
if command -v mpirun > /dev/null && [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ]; then
	timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
		-x KILN_MASTER_PORT="$(free_port 2)" -x OMP_NUM_THREADS=1 \
		-x KILN_STORE_TOKEN=kiln-tests-0123456789abcdef "$kiln" train "$ini" \
		run.comm=mpi run.out_dir="$tmp/m4" train.batch=32 $acc > "$tmp/m4.log" 2>&1 ||
		{ bad "mpirun -np 2 exited $?"; tail -20 "$tmp/m4.log"; }
	grep -q "comm mpi" "$tmp/m4.log" || bad "m4 did not run on mpi"
	set -- $(started m4)
	[ "${1:-x}" = 32 ] && [ "${2:-x}" = 32 ] ||
		bad "mpi, accumulate 4: '${1:-?}' of '${2:-?}' started during the backward, expected 32 of 32"
	close one m4 "mpi: 2 ranks x accumulate 4 vs 1 process"
else
	echo "no mpirun or mpi plugin: the MPI part is not run"
fi

[ $fail = 0 ] && echo "ok: accumulate 4 on 2 ranks overlaps the last micro-step's backward, equal to one process"
exit $fail
