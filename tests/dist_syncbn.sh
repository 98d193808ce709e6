#!/bin/sh
# tests/dist_syncbn.sh - [dist] sync_bn (docs/distributed.md): a small CNN
# with a 4-d batchnorm (after a convolution) and a 2-d one (after a
# linear layer), SGD with momentum, 24 optimizer steps of a global batch
# of 32 on Fashion-MNIST, Gloo on loopback.  Asserts:
#  1. 2 ranks (batch 16 each) with sync_bn = 1 end with the parameters,
#     the batchnorm running statistics (buffers) and the momentum of one
#     process with batch 32, within 2e-5 relative (float rounding of the
#     merged statistics, grown over 24 steps); the logged losses agree
#     to 3 digits;
#  2. the same 2 ranks without sync_bn end farther than that (buffers) from the
#     one process (each rank normalises its own 16 samples), so 1 can
#     fail;
#  3. 2 ranks with sync_bn, gradient checkpointing ([train] recompute,
#     the replayed forward redoes the allgather but leaves the running
#     statistics) and accumulate = 2 (batch 8, 2 micro-steps) end equal
#     (2e-5) to one process with batch 16 and accumulate = 2: batchnorm
#     normalises each micro-batch, here the 16 samples of both ranks;
#  4. when the mpi plugin and mpirun are there: 2 ranks under mpirun with
#     the mpi communicator and sync_bn equal the one process too (2e-5).
# Every process runs under `timeout`, so a hang fails the test.
name=syncbn needs=gloo
. "$(dirname "$0")/dist_common.sh"
. "$(dirname "$0")/config_lib.sh"

{
	ini run seed=11 threads=1 comm=gloo
	ini_fmnist limit=768
	ini data.eval limit=768
	ini_layers conv1:conv:out=8:kernel=3:stride=2:padding=1 bn1:batchnorm r1:relu pool:maxpool:kernel=2 \
		flat:flatten fc1:linear:out=32 bn2:batchnorm r2:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=1 batch=32 lr=0.05 momentum=0.9 log_every=8 eval=0 checkpoint_every=1000
	ini plugin.cpu async=1
	ini dist bucket_mb=0.01 timeout=30
} > "$tmp/cnn.ini"
ini="$tmp/cnn.ini"

last_loss() { grep 'step 24/24' "$tmp/$1.log" | tail -1 | sed 's/.*loss \([0-9.]*\).*/\1/' | cut -c1-5; }

run one 0 32
run sync 2 16 dist.sync_bn=1
run local 2 16
run syncacc 2 8 dist.sync_bn=1 train.accumulate=2 train.recompute=3
run oneacc 0 16 train.accumulate=2

grep -q "sync_bn: batch statistics over the 2 ranks" "$tmp/sync.log" || bad "sync_bn not logged"
"$tool" close "$(ck one 24)" "$(ck sync 24)" 2e-5 params buffers optim.momentum ||
	bad "2 ranks with sync_bn differ from 1 process"
"$tool" close "$(ck oneacc 24)" "$(ck syncacc 24)" 2e-5 params buffers optim.momentum ||
	bad "2 ranks with sync_bn, recompute and accumulate differ from 1 process"
if "$tool" close "$(ck one 24)" "$(ck local 24)" 2e-5 buffers > "$tmp/local.cmp"; then
	bad "2 ranks without sync_bn match 1 process: the test cannot tell"
fi
cat "$tmp/local.cmp"
"$tool" close "$(ck one 24)" "$(ck local 24)" 2e-5 params || echo "(as expected, without sync_bn the parameters differ too)"
if [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null; then
	port=$(free_port 9)
	timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x KILN_MASTER_PORT=$port \
		-x OMP_NUM_THREADS=1 "$kiln" train "$tmp/cnn.ini" run.comm=mpi run.out_dir="$tmp/mpi" \
		train.batch=16 dist.sync_bn=1 > "$tmp/mpi.log" 2>&1 ||
		{ bad "mpirun with sync_bn exited $?"; tail -20 "$tmp/mpi.log"; }
	"$tool" close "$(ck one 24)" "$(ck mpi 24)" 2e-5 params buffers optim.momentum ||
		bad "2 ranks with sync_bn on mpi differ from 1 process"
else
	echo "(no mpi plugin or mpirun: the mpi case is skipped)"
fi
l1=$(last_loss one) l2=$(last_loss sync)
echo "last logged loss: 1 process $l1, 2 ranks with sync_bn $l2"
[ -n "$l1" ] && [ "$l1" = "$l2" ] || bad "logged losses differ: '$l1' '$l2'"
exit $fail
