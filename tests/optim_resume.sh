#!/bin/sh
# tests/optim_resume.sh - the optimizer state of amsgrad and of SGD's
# dampening across a resume (session 43, docs/training.md), in one process
# on tests/data's tr_cnn (48 samples, batches of 8, two epochs: 12 steps,
# a checkpoint every 3), so it runs where tests/optim_state.sh (ZeRO-1,
# gloo, Fashion-MNIST) skips:
#  1. adam with amsgrad = 1: its checkpoints hold optim.max_exp_avg_sq;
#     the run resumed from its step-6 checkpoint ends bit for bit as the
#     uninterrupted one (params and the three slots), so the largest
#     second moments are saved and restored, not restarted from zero;
#  2. sgd with dampening = 0.5: resumed from step 6 it ends bit for bit
#     as the uninterrupted run (the first, undamped step is told by the
#     step count, which the checkpoint holds, not by the run's first call);
#  3. a checkpoint of an adam run written before amsgrad existed
#     (tests/data/tr_cnn_adam_s42.kiln: tr_cnn.ini, optimizer = adam,
#     weight_decay 0.01, lr 0.01, data.path = tests/data, step 3 of 12;
#     no amsgrad key, no third slot): this kiln's run from scratch holds
#     the same bytes at step 3 (Adam's arithmetic unchanged); it resumes
#     with amsgrad off and ends as the uninterrupted run; with amsgrad = 1
#     the resume is refused, naming the key (exit 2).
name=optim_resume
. "$(dirname "$0")/lib.sh"
kiln="$abs_top_builddir/kiln"
tool="$abs_top_builddir/tests/ckpt_tool"
# (from the source tree: the old checkpoint's data.path is tests/data)
cd "$srcdir" || fail "cannot enter $srcdir"
cnn="tests/data/tr_cnn.ini data.path=tests/data train.max_steps=0 train.epochs=2 train.checkpoint_every=3 train.keep_last=0"
same() { # A B WHAT SECTIONS...
	a=$1 b=$2 what=$3
	shift 3
	"$tool" same "$a" "$b" "$@" || fail "$what: $* differ"
}
train() { # NAME OVERRIDES...: tr_cnn into $tmp/NAME, its output in $tmp/NAME.log
	_tn=$1
	shift
	"$kiln" train $cnn run.out_dir="$tmp/$_tn" "$@" >"$tmp/$_tn.log" 2>&1
	_rc=$?
	[ $_rc = 0 ] || { tail -5 "$tmp/$_tn.log"; fail "$_tn exited $_rc"; }
}
resume() { # FROM STEP NAME OVERRIDES...: NAME resumes FROM's step-STEP checkpoint
	_rf=$1 _rs=$2 _rn=$3
	shift 3
	mkdir -p "$tmp/$_rn/checkpoints"
	cp "$(ck "$_rf" "$_rs")" "$tmp/$_rn/checkpoints/" || fail "$_rf: no checkpoint at step $_rs"
	train "$_rn" "$@" --resume
	[ ! -e "$(ck "$_rn" 3)" ] || fail "$_rn trained from step 0, not from step $_rs"
}

# ---- 1. amsgrad: saved, restored ------------------------------------------
ams="train.optimizer=adam train.amsgrad=1 train.lr=0.01 train.weight_decay=0.01 train.beta2=0.99"
slots="optim.exp_avg optim.exp_avg_sq optim.max_exp_avg_sq"
train ams $ams
"$tool" sections "$(ck ams 6)" | grep -q "^optim.max_exp_avg_sq " ||
	fail "amsgrad: no optim.max_exp_avg_sq in the checkpoint"
! "$tool" close "$(ck ams 6)" "$(ck ams 12)" 0 optim.max_exp_avg_sq >/dev/null 2>&1 ||
	fail "amsgrad: the largest second moments did not move from step 6 to 12 (the comparison cannot fail)"
resume ams 6 ams_res $ams
same "$(ck ams 12)" "$(ck ams_res 12)" "amsgrad resumed at step 6 vs uninterrupted" params $slots optim.step

# ---- 2. SGD's dampening: the first step by the step count -------------------
train damp train.dampening=0.5
resume damp 6 damp_res train.dampening=0.5
same "$(ck damp 12)" "$(ck damp_res 12)" "dampening resumed at step 6 vs uninterrupted" params optim.momentum

# ---- 3. an adam checkpoint from before amsgrad ------------------------------
old=tests/data/tr_cnn_adam_s42.kiln
adam="train.optimizer=adam train.lr=0.01 train.weight_decay=0.01"
"$tool" check "$old" || fail "$old does not verify"
! "$tool" sections "$old" | grep -q max_exp_avg_sq || fail "$old has an amsgrad slot"
train cnn $adam
same "$old" "$(ck cnn 3)" "adam at step 3: this kiln vs the checkpoint of before amsgrad" \
	params buffers optim.exp_avg optim.exp_avg_sq optim.step
mkdir -p "$tmp/cnn_old/checkpoints"
cp "$old" "$tmp/cnn_old/checkpoints/ckpt-3.kiln"
train cnn_old $adam --resume
same "$(ck cnn 12)" "$(ck cnn_old 12)" "the old checkpoint resumed vs uninterrupted" \
	params optim.exp_avg optim.exp_avg_sq
mkdir -p "$tmp/cnn_ams/checkpoints"
cp "$old" "$tmp/cnn_ams/checkpoints/ckpt-3.kiln"
"$kiln" train $cnn $adam train.amsgrad=1 run.out_dir="$tmp/cnn_ams" --resume >"$tmp/cnn_ams.log" 2>&1
rc=$?
[ $rc = 2 ] || fail "the checkpoint of before amsgrad resumed with amsgrad = 1: exit $rc, expected 2"
grep -q "changed config: \[train\] amsgrad is " "$tmp/cnn_ams.log" ||
	{ tail -3 "$tmp/cnn_ams.log"; fail "amsgrad = 1 on an old checkpoint: no refusal naming the key"; }
[ ! -e "$(ck cnn_ams 6)" ] || fail "the refused resume trained"
echo "PASS"
