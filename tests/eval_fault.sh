#!/bin/sh
# tests/eval_fault.sh - an evaluation that fails on one rank fails every
# rank together, at once (session 42; core/train_eval.c eval_agree): the
# failed rank naming its cause, the others the failed rank, as the
# checkpoint's and log point's failures do (tests/ckpt_fault.sh,
# tests/agreed_fault.sh).  KILN_TEST_CKPT_FAIL's "eval@R" fails rank R's
# load of an evaluation's batch 0 during training, "test@R" that of
# [data.val]'s final test (core/dist.h kiln_dist_ckpt_fault), standing for
# a bad sample in one rank's copy of the set or its device failing:
#  1. data-parallel, kiln-gloo's shared-memory collectives (its default on
#     one machine): the evaluation after step 2 failing on rank 1, then
#     rank 0 (the ranks' agreement after the pass, since session 43 the
#     sum of the ranks' shares); with eval_batch 4 (64 batches, 32 in a
#     rank's share: the peer is in eval_stop's sum of its batch 16 when
#     the failed rank reaches the agreement, which it meets there); with
#     keep_best and early stopping (their rank-0 decisions ride on a sum
#     after the pass's, which replaced early stopping's broadcast and
#     keep_best's sum);
#  2. the same on Gloo's TCP collectives (plugin.gloo.shm = 0);
#  3. [data.val]'s final test failing on rank 1;
#  4. [dist] pipeline = 2, a stage on each rank: the evaluation per stage
#     (each rank holds its stage's parameters alone), failing on stage 1's
#     rank (it still receives stage 0's tensors, batch by batch, before the
#     agreement) and on stage 0's (it still sends), also with eval_batch 4
#     (the failure agreed at an agreement of eval_stop, every 16 batches,
#     session 46); and on a gathered whole
#     model (fc1 frozen: every rank evaluates its share of the set alone,
#     the set sharded over both ranks since session 44); and the gather's
#     whole parameter buffer failing on rank 1, then rank 0 ("whole@R").
#  5. the local steps before rank 0's batchnorm statistics' broadcast for
#     an evaluation failing on rank 1, then rank 0 ("evalbuf@R").
# Each: every rank exits non-zero within 30 s of the stamped line before
# the evaluation ([dist] timeout and heartbeat 60, `kiln launch --grace
# 60`), the failed rank saying "rank R of 2: WHAT: loading batch 0: failed
# (the tests' fault: ...)", the other "rank O of 2: WHAT: rank R failed
# (its message says why)", and neither logging the evaluation's numbers.
# Before, the failed rank returned from its evaluation and left: its peer
# learnt of it from the process's exit ("rank R is gone (its process
# ended)", "the store on rank 0 ... is gone") in whichever collective came
# next, and a program calling kiln_train that did not exit held its peers
# there until [dist] timeout.  Every process runs under `timeout`.
name=evalfault needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
mlp="$tmp/mlp.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=1 eval_every=2 checkpoint_every=0 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$mlp"
two="$tmp/two.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=64:stage=1 r2:relu \
		fc3:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=1 eval_every=2 checkpoint_every=0 checkpoint_last=0
	ini pipeline micro_batches=2
	ini dist timeout=60 heartbeat=60 pipeline=2
} > "$two"
# failed NAME INI FAULT@R WHEN WHAT LINE OVERRIDES...: a run of INI on 2
# ranks in $tmp/NAME with KILN_TEST_CKPT_FAIL=FAULT@R, stamped from the
# first line containing WHEN, agreed (tests/dist_common.sh agreed_run:
# WHAT names the evaluation in the messages, the cause "loading batch 0"),
# and no line beginning LINE, the evaluation's numbers, logged
failed() {
	_fn=$1 _fi=$2 _ff=$3 _fw=$4 _fwhat=$5 _fl=$6
	shift 6
	agreed_run "$_fn" "$_fi" "$_ff" "$_fw" "$_fwhat" "loading batch 0" "$@"
	! grep -F "$_fl" "$tmp/$_fn.log" || bad "$_fn: the evaluation's numbers logged"
}

# ---- 1. data-parallel, shared memory ------------------------------------------------
for _r in 1 0; do
	failed ev$_r "$mlp" eval@$_r "step 2/" "step 2's evaluation" "step 2: test loss"
done
failed es1 "$mlp" eval@1 "step 2/" "step 2's evaluation" "step 2: test loss" train.eval_batch=4
failed kb0 "$mlp" eval@0 "step 2/" "step 2's evaluation" "step 2: test loss" train.keep_best=2 \
	train.early_stop_patience=2
[ ! -e "$tmp/kb0/checkpoints/best" ] || [ -z "$(ls "$tmp/kb0/checkpoints/best")" ] ||
	bad "kb0: a best/ checkpoint written: $(ls "$tmp/kb0/checkpoints/best")"

# ---- 2. Gloo's TCP collectives ------------------------------------------------------
failed et1 "$mlp" eval@1 "step 2/" "step 2's evaluation" "step 2: test loss" plugin.gloo.shm=0

# ---- 3. [data.val]'s final test -----------------------------------------------------
failed ft1 "$mlp" test@1 "step 4/" "the final test" "final test loss" data.val.samples=256
grep -q "step 4: val loss" "$tmp/ft1.log" || bad "ft1: no val evaluation after step 4 (the last)"

# ---- 4. stages on ranks -------------------------------------------------------------
for _r in 1 0; do
	failed ps$_r "$two" eval@$_r "step 2/" "step 2's evaluation" "step 2: test loss"
	grep -q "holds the stage's parameters and gradients alone" "$tmp/ps$_r.log" ||
		bad "ps$_r: the evaluation did not run per stage"
	# eval_batch 4: 64 batches, every rank going through all of them per
	# stage: the failure is agreed in eval_stop's sum of batch 16, not at
	# the set's end (session 46)
	failed pb$_r "$two" eval@$_r "step 2/" "step 2's evaluation" "step 2: test loss" \
		train.eval_batch=4
	grep -q "holds the stage's parameters and gradients alone" "$tmp/pb$_r.log" ||
		bad "pb$_r: the evaluation did not run per stage"
done
failed pw1 "$two" eval@1 "step 2/" "step 2's evaluation" "step 2: test loss" \
	layer.fc1.trainable=0
grep -q "holds the stage's parameters and gradients alone" "$tmp/pw1.log" &&
	bad "pw1: the evaluation ran per stage, not on the gathered model"
# the gathered model's whole parameter buffer failing on one rank
# (KILN_TEST_CKPT_FAIL=whole@R: its allocation): agreed before the
# gather's collectives, every rank fails (session 43; before, the failed
# rank returned and left its peers in the gather's receives)
for _r in 1 0; do
	agreed_run pg$_r "$two" whole@$_r "step 2/" "gathering the stages' parameters" \
		"the whole parameter buffer of the gather" layer.fc1.trainable=0
	! grep -F "step 2: test loss" "$tmp/pg$_r.log" || bad "pg$_r: the evaluation's numbers logged"
done

# ---- 5. rank 0's buffers for the evaluation ------------------------------------------
# a model with batchnorm: before the evaluation every rank takes rank 0's
# running statistics (kiln_dist_eval_buffers' broadcast); the local steps
# before it (the comm stream's wait, ZeRO-1's settle) failing on one rank
# ("evalbuf@R") are agreed before the broadcast, every rank failing (the
# session 43 review: before, the failed rank returned and its peers waited
# in the broadcast)
bn="$tmp/bn.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers conv1:conv:out=4:kernel=3:padding=1 bn1:batchnorm r1:relu flat:flatten \
		fc:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=1 eval_every=2 checkpoint_every=0 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$bn"
for _r in 1 0; do
	agreed_run eb$_r "$bn" evalbuf@$_r "step 2/" \
		"rank 0's batchnorm running statistics for the evaluation" "waiting for the comm stream"
	! grep -F "step 2: test loss" "$tmp/eb$_r.log" || bad "eb$_r: the evaluation's numbers logged"
done

[ "$fail" = 0 ] && echo "ok: an evaluation that fails on one rank ends every rank at once, naming it"
exit $fail
