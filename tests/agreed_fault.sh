#!/bin/sh
# tests/agreed_fault.sh - a rank whose own allocation fails just before a
# collective still takes part in it, so every rank fails together and at
# once, the failed one naming its cause, the others the failed rank
# (session 41; tests/ckpt_fault.sh sections 4-6 have the checks and
# reads of a checkpoint's first sum).  KILN_TEST_CKPT_FAIL's faults
# (core/dist.h kiln_dist_ckpt_fault) stand for the allocation failing:
#  1. "best@R": keep_best's list for step 2's checkpoint (trainer_best_meta;
#     before, allocated after the ranks' first sum: the failed rank
#     returned and left the others in the write's collectives);
#  2. "resume@R": the buffer of rank 0's resume message ([train] resume,
#     trainer_resume; before, the failed rank returned and left the others
#     in the message's broadcast);
#  3. "resume_iv@1": rank 1's buffer of the log interval rank 0 resumed
#     with (resume_interval: the checkpoint of step 2 holds one open,
#     log_every 3; before, rank 1 returned and left rank 0 in its
#     broadcast);
#  4. "staged@R": the device and pinned host buffers of a host-staged
#     collective (core/dist.c host_staged, every rank's; at a resume first
#     rank 0's message; before, allocated after the agreement: the failed
#     rank returned and its peer learnt only as the connection closed,
#     "gloo: ... Connection closed by peer").
# Each: every rank exits non-zero within 30 s of the stamped line ([dist]
# timeout and heartbeat 60, `kiln launch --grace 60`), the failed rank
# saying "rank R of 2: WHAT: CAUSE: failed (the tests' fault: ...)", the
# other "rank O of 2: WHAT: rank R failed (its message says why)" (before:
# the failed process's exit, "rank R is gone (its process ended)" or "the
# store on rank 0 ... is gone", and a rank that did not exit, a program
# calling kiln_train, held the others until [dist] timeout).
# Every process runs under `timeout`.
name=agreedfault needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
mlp="$tmp/mlp.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=3 eval=0 checkpoint_every=2 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$mlp"
# agreed NAME FAULT@R WHEN WHAT CAUSE OVERRIDES...: a run of $mlp on 2
# ranks in $tmp/NAME with KILN_TEST_CKPT_FAIL=FAULT@R, stamped from the
# first line containing WHEN (tests/dist_common.sh agreed_run)
agreed() {
	_an=$1
	shift
	agreed_run "$_an" "$mlp" "$@"
}

# ---- 1. keep_best's list -----------------------------------------------------------
for _r in 1 0; do
	agreed kb$_r best@$_r "training state broadcast" "step 2's checkpoint" "keep_best's list" \
		train.eval=1 train.keep_best=2
	[ ! -e "$tmp/kb$_r/checkpoints/ckpt-2.kiln" ] || bad "kb$_r: ckpt-2.kiln written"
done

# ---- 2. rank 0's resume message ----------------------------------------------------
for _r in 1 0; do
	agreed rs$_r resume@$_r "activation arena" "rank 0's resume" "the message's buffer" train.resume=1
done

# ---- 3. the log interval rank 0 resumed with -------------------------------------
timeout 120 "$kiln" launch -n 2 -- "$kiln" train "$mlp" run.out_dir="$tmp/iv" train.batch=32 \
	train.max_steps=2 > "$tmp/iv.log" 2>&1 || { bad "iv: exit $?"; tail -5 "$tmp/iv.log"; }
"$tool" sections "$(ck iv 2)" | grep -q "^interval " || bad "iv: ckpt-2.kiln holds no log interval"
rm -rf "$tmp/iv1"
cp -r "$tmp/iv" "$tmp/iv1"
agreed iv1 resume_iv@1 "activation arena" "rank 0's log interval" "its entries' buffer" train.resume=1
grep -q "rank 1: resuming from rank 0's checkpoint" "$tmp/iv1.log" || bad "iv1: rank 1 did not resume"

# ---- 4. a host-staged collective's buffers ---------------------------------------
for _r in 1 0; do
	agreed st$_r staged@$_r "activation arena" "rank 0's resume" "the staged collective's buffers" \
		train.resume=1
done

[ "$fail" = 0 ] && echo "ok: a rank's failed allocation before a collective ends every rank at once, naming it"
exit $fail
