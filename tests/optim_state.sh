#!/bin/sh
# tests/optim_state.sh - the optimizer state of amsgrad and of SGD's
# dampening (session 43, docs/training.md) across checkpoints and ZeRO-1.
# The MLP of the dist tests (50896 floats, Fashion-MNIST, 2048 samples, one
# epoch: 32 steps of a global batch of 64), one process unless said:
#  1. adam with amsgrad = 1: its checkpoints hold optim.max_exp_avg_sq;
#     the run resumed from its step-16 checkpoint ends bit for bit as the
#     uninterrupted one (params and the three slots), so the largest
#     second moments are saved and restored, not restarted from zero;
#  2. the same on 2 ranks with [dist] zero = 1 (each rank steps its slice
#     of the three slots) equals DDP, and the step-16 checkpoint of (1)
#     resumed under ZeRO-1 ends as (1), to float tolerance;
#  3. sgd with dampening = 0.5: resumed from step 16 it ends bit for bit
#     as the uninterrupted run (the first, undamped step is told by the
#     step count, which the checkpoint holds, not by the run's first call);
#  4. a checkpoint of an adam run written before amsgrad existed
#     (tests/data/tr_cnn_adam_s42.kiln: tr_cnn.ini, optimizer = adam,
#     weight_decay 0.01, lr 0.01, data.path = tests/data, step 3 of 12;
#     no amsgrad key, no third slot): this kiln's run from scratch holds
#     the same bytes at step 3 (Adam's arithmetic unchanged); it resumes
#     with amsgrad off and ends as the uninterrupted run; with amsgrad = 1
#     the resume is refused, naming the key (exit 2).
name=optim_state needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 7 20 gloo
same() { # A B WHAT SECTIONS...
	a=$1 b=$2 what=$3
	shift 3
	"$tool" same "$a" "$b" "$@" || bad "$what: $* differ"
}
close() { # A B WHAT SECTIONS...
	a=$1 b=$2 what=$3
	shift 3
	"$tool" close "$a" "$b" 1e-5 "$@" || bad "$what: $* differ"
}
resume_from() { # FROM STEP NAME NPROC BATCH OVERRIDES...: NAME resumes FROM's checkpoint
	_rf=$1 _rs=$2 _rn=$3
	shift 3
	mkdir -p "$tmp/$_rn/checkpoints"
	cp "$(ck "$_rf" "$_rs")" "$tmp/$_rn/checkpoints/" || bad "$_rf: no checkpoint at step $_rs"
	run "$_rn" "$@" train.resume=1
	grep -q '"resumed_step": '"$_rs" "$tmp/$_rn.log" || bad "$_rn did not resume from step $_rs"
}
slots="optim.exp_avg optim.exp_avg_sq optim.max_exp_avg_sq"

# ---- 1. amsgrad: saved, restored ------------------------------------------
ams="train.optimizer=adam train.amsgrad=1 train.lr=0.002 train.weight_decay=0.01 train.beta2=0.99 train.epochs=1 train.checkpoint_every=16"
run ams1 0 64 $ams
"$tool" sections "$(ck ams1 16)" | grep -q "^optim.max_exp_avg_sq " ||
	bad "amsgrad: no optim.max_exp_avg_sq in the checkpoint"
"$tool" close "$(ck ams1 16)" "$(ck ams1 32)" 0 optim.max_exp_avg_sq >/dev/null 2>&1 &&
	bad "amsgrad: the largest second moments did not move from step 16 to 32 (the comparison cannot fail)"
resume_from ams1 16 ams_res 0 64 $ams
same "$(ck ams1 32)" "$(ck ams_res 32)" "amsgrad resumed at step 16 vs uninterrupted" params $slots optim.step

# ---- 2. amsgrad under ZeRO-1 --------------------------------------------------
run ams_ddp 2 32 $ams
run ams_zero 2 32 $ams dist.zero=1
close "$(ck ams_ddp 32)" "$(ck ams_zero 32)" "amsgrad: ZeRO-1 vs DDP" params $slots
resume_from ams1 16 ams_zres 2 32 $ams dist.zero=1
close "$(ck ams1 32)" "$(ck ams_zres 32)" "amsgrad: step 16 resumed under ZeRO-1 vs 1 process" params $slots

# ---- 3. SGD's dampening: the first step by the step count -------------------
damp="train.dampening=0.5 train.epochs=1 train.checkpoint_every=16"
run damp1 0 64 $damp
resume_from damp1 16 damp_res 0 64 $damp
same "$(ck damp1 32)" "$(ck damp_res 32)" "dampening resumed at step 16 vs uninterrupted" params optim.momentum

# ---- 4. an adam checkpoint from before amsgrad ------------------------------
# (from the source tree: the checkpoint's data.path is tests/data)
cd "$srcdir" || bad "cannot enter $srcdir"
old=tests/data/tr_cnn_adam_s42.kiln
cnn="tests/data/tr_cnn.ini data.path=tests/data train.optimizer=adam train.lr=0.01 train.weight_decay=0.01 train.max_steps=0 train.epochs=2 train.checkpoint_every=3 train.keep_last=0"
"$tool" check "$old" || bad "$old does not verify"
! "$tool" sections "$old" | grep -q max_exp_avg_sq || bad "$old has an amsgrad slot"
"$kiln" train $cnn run.out_dir="$tmp/cnn" >"$tmp/cnn.log" 2>&1 || bad "tr_cnn with adam exited $?"
same "$old" "$(ck cnn 3)" "adam at step 3: this kiln vs the checkpoint of before amsgrad" \
	params buffers optim.exp_avg optim.exp_avg_sq optim.step
mkdir -p "$tmp/cnn_old/checkpoints"
cp "$old" "$tmp/cnn_old/checkpoints/ckpt-3.kiln"
"$kiln" train $cnn run.out_dir="$tmp/cnn_old" --resume >"$tmp/cnn_old.log" 2>&1 ||
	{ bad "the checkpoint of before amsgrad did not resume with amsgrad off"; tail -5 "$tmp/cnn_old.log"; }
same "$(ck cnn 12)" "$(ck cnn_old 12)" "the old checkpoint resumed vs uninterrupted" \
	params optim.exp_avg optim.exp_avg_sq
mkdir -p "$tmp/cnn_ams/checkpoints"
cp "$old" "$tmp/cnn_ams/checkpoints/ckpt-3.kiln"
"$kiln" train $cnn train.amsgrad=1 run.out_dir="$tmp/cnn_ams" --resume >"$tmp/cnn_ams.log" 2>&1
rc=$?
[ $rc = 2 ] || bad "the checkpoint of before amsgrad resumed with amsgrad = 1: exit $rc, expected 2"
grep -q "changed config: \[train\] amsgrad is " "$tmp/cnn_ams.log" ||
	{ bad "amsgrad = 1 on an old checkpoint: no refusal naming the key"; tail -3 "$tmp/cnn_ams.log"; }
[ ! -e "$tmp/cnn_ams/checkpoints/ckpt-6.kiln" ] || bad "the refused resume trained"
exit $fail
