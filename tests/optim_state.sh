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
# The one-process resumes of amsgrad and dampening, and an adam checkpoint of
# before amsgrad, on tests/data (no gloo, no Fashion-MNIST):
# tests/optim_resume.sh.
name=optim_state needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 7 20 gloo
same() { # A B WHAT SECTIONS...
	a=$1 b=$2 what=$3
	shift 3
	"$tool" same "$a" "$b" "$@" || bad "$what: $* differ"
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
states_close "$(ck ams_ddp 32)" "$(ck ams_zero 32)" "amsgrad: ZeRO-1 vs DDP" params $slots
resume_from ams1 16 ams_zres 2 32 $ams dist.zero=1
states_close "$(ck ams1 32)" "$(ck ams_zres 32)" "amsgrad: step 16 resumed under ZeRO-1 vs 1 process" params $slots

exit $fail
