#!/bin/sh
# tests/pipeline_pairs.sh - [pipeline] sendrecv with a skip connection
# across the cut (docs/pipeline.md, "Stages on ranks"; core/pipe_pairs.c):
# two or more crossing tensors each way, on transports whose send waits
# for its recv.  Before session 41, 1f1b paired stage 0's send of
# activation e1 of micro-batch j + 1 with its recv of gradient e0 of j,
# and stage 1's send of gradient e1 of j with its recv of activation e0 of
# j + 1; each pair first waited for the earlier send to its peer on the
# send stream, which the peer receives in its own pair, after its own
# wait, and the step hung until [dist] timeout (here 10 s): Gloo's TCP
# with sendrecv = 1, MPI's default pairing with its tensors as messages
# (zero_copy = 0) at a batch of 2048.  Now the plan of the pairs plays the
# step through first and leaves alone the pairs that would deadlock.
#  1. an MLP whose last stage concatenates fc2 and r1 (the skip), on
#     Gloo's TCP (shm_p2p = 0, sendrecv = 1): 2 stages (1f1b; stage 0's
#     3 would-be pairs a step go alone, logged; stage 1 keeps its 3), 3
#     stages with early_forwards = 1 and 4 stages (1f1b) end with one
#     process's parameters and momentum (1e-5); a cut with one crossing
#     tensor each way keeps every pair it had, those that are not
#     mirrored by the peer's included (early_forwards = 1: 2 and 3 a
#     step);
#  2. the seq2seq model with the encoder's embedding and forward LSTM
#     read on stage 1 (4 crossing tensors), Gloo's TCP, sendrecv = 1:
#     AdamW's 6 steps equal one process;
#  3. under mpirun, kiln-mpi's default pairing (sendrecv = auto) with
#     zero_copy = 0 at a batch of 2048 (messages of 8-32 KiB), 2 stages of
#     the MLP: equal to one process.
# Every process runs under `timeout`; [dist] timeout is 10 s.
name=pipepairs needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/skip.ini"
{
	ini run seed=3 threads=1
	ini_synthetic 8192 6 5 workers=0
	ini_layers flat:flatten fc1:linear:out=20 r1:relu fc2:linear:out=12 "cat:concat:inputs=fc2, r1" \
		fc3:linear:out=5 loss:softmax_xent
	ini_sgd_steps 4 eval=0
	ini pipeline micro_batches=4
	ini dist timeout=10
} > "$ini"
near() { # near A B WHAT [TAG...]
	_a=$1 _b=$2 _w=$3
	shift 3
	[ $# -gt 0 ] || set -- optim.momentum
	"$tool" close "$(ck "$_a" 4)" "$(ck "$_b" 4)" 1e-5 params "$@" ||
		bad "$_w: parameters differ from one process"
}
tcp="pipeline.sendrecv=1 plugin.gloo.shm_p2p=0"

# ---- 1. the MLP with a skip across the cut, Gloo's TCP -------------------------
run one 0 16
run g2 2 16 dist.pipeline=2 "model.stages=flat, fc2 | cat, loss" $tcp
near one g2 "2 stages, a skip across the cut (gloo TCP, sendrecv = 1)"
paired g2 "0 0 32" "1 12 32"
[ "$(grep -c "\[pipeline\] stage 0: 3 sends a step go alone, not paired with the recv from stage 1 after them" "$tmp/g2.log")" = 1 ] ||
	{ bad "g2: stage 0 does not say its 3 sends a step go alone"; grep "go alone" "$tmp/g2.log"; }
grep -q "\[pipeline\] stage 1: .* go alone" "$tmp/g2.log" && bad "g2: stage 1 leaves a pair alone"
run g3e 3 16 dist.pipeline=3 "model.stages=flat, r1 | fc2 | cat, loss" pipeline.early_forwards=1 $tcp
near one g3e "3 stages, early_forwards = 1, a skip from stage 0 to 2 (gloo TCP, sendrecv = 1)"
run g4 4 16 dist.pipeline=4 "model.stages=flat, fc1 | r1 | fc2 | cat, loss" $tcp
near one g4 "4 stages, a skip from stage 1 to 3 (gloo TCP, sendrecv = 1)"
# one crossing tensor each way: every pair kept, stage 0's (activation
# j + 2 with gradient j) not mirrored by stage 1's (gradient j with
# activation j + 1)
run g2e 2 16 dist.pipeline=2 "model.stages=flat, fc1 | r1, loss" pipeline.early_forwards=1 $tcp
near one g2e "2 stages, early_forwards = 1 (gloo TCP, sendrecv = 1)"
paired g2e "0 8 16" "1 12 16"
grep -q "go alone" "$tmp/g2e.log" && bad "g2e: a pair left alone"
echo "ok: a skip across the cut on 2, 3 and 4 stages (gloo TCP, sendrecv = 1) ends where one process does"

# ---- 2. seq2seq with the encoder read on stage 1, Gloo's TCP ----------------------
ini="$tmp/s2s.ini"
{
	ini run threads=1 seed=1
	ini data source=seq2seq samples=512 length=6 min_length=3 task=reverse
	ini train optimizer=adamw lr=0.01 batch=16 max_steps=4 eval=0
	ini_layers enc.embed:embedding:vocab=11:dim=8 \
		"enc.fwd:lstm:hidden=12:inputs=enc.embed, data:pad_id=0" \
		"enc.bwd:gru:hidden=12:reverse=1:inputs=enc.embed, data:pad_id=0" \
		"enc.out:concat:inputs=enc.fwd, enc.bwd:dim=-1" \
		"mid:lstm:hidden=10:inputs=enc.out, data:pad_id=0" \
		"dec.cat:concat:inputs=mid, enc.embed, enc.fwd:dim=-1" \
		"dec.gru:gru:hidden=16:reverse=1:inputs=dec.cat, data:pad_id=0" \
		dec.head:linear:out=11 loss:softmax_xent:ignore_index=0
	ini pipeline micro_batches=4
	ini dist timeout=10
} > "$ini"
run s2one 0 16
run s2 2 16 dist.pipeline=2 "model.stages=enc.embed, enc.out | mid, loss" $tcp
near s2one s2 "seq2seq, 2 stages, the encoder read on stage 1 (gloo TCP, sendrecv = 1)" \
	optim.exp_avg optim.exp_avg_sq
grep -q "2 stages, 4 micro-batches of 4, schedule 1f1b: 2 activation sets ([0-9.]* MiB), 4 crossing tensors" "$tmp/s2.log" ||
	bad "s2: not 4 crossing tensors"
echo "ok: seq2seq with 4 crossing tensors (gloo TCP, sendrecv = 1) ends where one process does"

# ---- 3. mpi: default pairing, tensors as messages, a batch of 2048 -----------------
ini="$tmp/skip.ini"
if [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null; then
	run one2k 0 2048
	timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
		-x KILN_MASTER_PORT="$(free_port 3)" -x OMP_NUM_THREADS=1 -x KILN_STORE_TOKEN "$kiln" train "$ini" \
		run.out_dir="$tmp/m2k" train.batch=2048 dist.pipeline=2 plugin.mpi.thread_level=multiple \
		"model.stages=flat, fc2 | cat, loss" pipeline.zero_copy=0 > "$tmp/m2k.log" 2>&1 ||
		{ bad "m2k: mpirun -np 2 exited $?"; tail -20 "$tmp/m2k.log"; }
	grep -q "comm mpi" "$tmp/m2k.log" || bad "m2k did not run on mpi"
	grep -q "sendrecv = auto: hand-offs paired on mpi" "$tmp/m2k.log" || bad "m2k: not paired by default"
	near one2k m2k "2 stages, a skip across the cut (mpi, zero_copy = 0, batch 2048)"
	paired m2k "0 0 32" "1 12 32"
	echo "ok: a skip across the cut (mpi, default pairing, tensors as messages, batch 2048) ends where one process does"
else
	echo "(no kiln-mpi or mpirun: section 3 not run)"
fi
exit $fail
