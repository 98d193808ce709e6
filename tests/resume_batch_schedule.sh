#!/bin/sh
# tests/resume_batch_schedule.sh - the learning-rate schedule's length
# after a resume that changes the global batch (session 38).
# tests/data/tr_cnn.ini over 3 epochs of 48 samples in batches of 8 (18
# steps), resumed from its epoch-1 checkpoint (step 6) with batch 16: the
# run ends at step 12 (6 + 2 epochs of 3 steps), and the schedule runs to
# step 12 (core/train_buffers.c schedule_length: the run's last step).
# Before session 38 its length was epochs x the new steps per epoch, 9:
# cosine's steps 10-12 sat at lr_min, onecycle rose again past its end, and
# a pct_start with pct_start x 9 = 1 was refused (exit 2) though the run
# is 12 steps long.
#
# 1. cosine: each resumed step's lr is CosineAnnealingLR's closed form
#    lr_min + (lr - lr_min)(1 + cos(pi t / 12)) / 2 at t = step - 1, above
#    lr_min (kiln's last step is t = T - 1, never at lr_min itself).
# 2. a second resume in the same batch (from the resumed run's step 8)
#    continues the first's schedule: its ckpt-12 is the first's, byte for
#    byte (the length is counted from the checkpoint's position, not from
#    epochs x steps per epoch).
# 3. onecycle never rises after its peak, over the first run's steps 1-6
#    and the resumed 7-12, and ends at its final rate lr / 25 / 1e4.
# 4. onecycle's pct_start check counts the same 12 steps: pct_start = 1/9
#    resumes; pct_start = 1/12 (a rise of no step in 12) resumes past its
#    rise (session 40: refused before) and refuses a fresh 12-step run.
# 5. the check counts the optimizer steps the schedule op reads, not the
#    trainer's (session 41): fp16 with [plugin.amp] init_scale = 1e9 skips
#    steps 1-11 while its scale backs off, so the step-6 checkpoint has
#    taken no optimizer step; resumed in batch 16 with pct_start = 1/12
#    its first optimizer step would compute the rise's 0/0: refused, exit
#    2, saying so (before: accepted as past the rise by its 6 trainer
#    steps, the lr NaN at steps 7-10, and at step 11 "parameter
#    'conv1.weight' holds 36 non-finite value(s) ...: training diverged;
#    lower [train] lr", exit 3).
# An unchanged global batch keeps epochs x steps per epoch (or max_steps):
# tests/resume_*.sh resume bit for bit as before.
name=resume_batch_schedule
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
need_source idx

base="data.path=$data train.max_steps=0 train.epochs=3 train.eval=0 train.log_every=1 train.checkpoint_every=2 train.keep_last=0"

# lrs DIR: "step:lr" of each train event in DIR/metrics.jsonl, a line each
lrs() {
	sed -n 's/.*"event":"train".*"step":\([0-9]*\),.*"lr":\([0-9.e+-]*\).*/\1 \2/p' "$1/metrics.jsonl"
}
# resume_from EXIT RUN STEP DIR ARGS...: DIR holds RUN's ckpt-STEP alone,
# and the run resumes from it with ARGS (no metrics of RUN's steps in
# DIR), exiting EXIT
resume_from() {
	_want=$1 _src=$(ck "$2" "$3") _d=$4
	shift 4
	rm -rf "$_d"
	mkdir -p "$_d/checkpoints"
	cp "$_src" "$_d/checkpoints/"
	# shellcheck disable=SC2086
	kiln "$_want" train "$ini" $base "run.out_dir=$_d" --resume "$@"
}

# 1: cosine, lr 0.1 to lr_min 0.001
cos="train.schedule=cosine train.lr_min=0.001"
kiln 0 train "$ini" $base $cos "run.out_dir=$tmp/cos"
resume_from 0 cos 6 "$tmp/cos2" $cos train.batch=16
stdout_has '"resumed_step": 6'
[ "$(field steps "$out")" = 12 ] || fail "the resumed run ended at step $(field steps "$out"), want 12"
lrs "$tmp/cos2" >"$tmp/cos2.lr"
[ "$(wc -l <"$tmp/cos2.lr")" -eq 6 ] || fail "want 6 resumed steps' lr, got: $(cat "$tmp/cos2.lr")"
awk 'BEGIN { pi = atan2(0, -1) }
	{ t = $1 - 1; want = 0.001 + (0.1 - 0.001) * (1 + cos(pi * t / 12)) / 2
	  d = $2 - want; if (d < 0) d = -d
	  if (d > 1e-6 * want || $2 <= 0.001) {
		printf "step %d: lr %s, CosineAnnealingLR(T_max = 12, eta_min = 0.001) %.8g\n", $1, $2, want
		bad = 1 } }
	END { exit bad }' "$tmp/cos2.lr" ||
	fail "the resumed cosine schedule is not the one over the run's 12 steps: $(tr '\n' ' ' <"$tmp/cos2.lr")"
echo "ok: cosine resumed with batch 16 runs to step 12: $(tr '\n' ' ' <"$tmp/cos2.lr")"

# 2: resumed again in batch 16 from the resumed run's step 8
resume_from 0 cos2 8 "$tmp/cos3" $cos train.batch=16
stdout_has '"resumed_step": 8'
tags=$("$top_builddir/tests/ckpt_tool" sections "$(ck cos2 12)" | awk '$1 != "config" { print $1 }')
[ -n "$tags" ] || fail "no sections in $(ck cos2 12)"
# shellcheck disable=SC2086
"$top_builddir/tests/ckpt_tool" same "$(ck cos2 12)" "$(ck cos3 12)" $tags ||
	fail "resumed again in batch 16: ckpt-12.kiln differs from the first resumed run's"
echo "ok: resumed again at step 8 in batch 16: ckpt-12 the same bytes"

# 3: onecycle (lr 0.1, pct_start 0.3 of 18 steps)
oc="train.schedule=onecycle"
kiln 0 train "$ini" $base $oc "run.out_dir=$tmp/oc"
resume_from 0 oc 6 "$tmp/oc2" $oc train.batch=16
[ "$(field steps "$out")" = 12 ] || fail "the resumed run ended at step $(field steps "$out"), want 12"
{ lrs "$tmp/oc" | awk '$1 <= 6'; lrs "$tmp/oc2"; } >"$tmp/oc.lr"
[ "$(wc -l <"$tmp/oc.lr")" -eq 12 ] || fail "want 12 steps' lr, got: $(cat "$tmp/oc.lr")"
awk '{ if (peak && $2 > prev) { printf "step %d: lr %s rises after the peak (step %d: %s)\n", $1, $2, $1 - 1, prev; bad = 1 }
       if (NR > 1 && $2 < prev) peak = 1; prev = $2; last = $2 }
     END { d = last - 4e-7; if (d < 0) d = -d
	   if (d > 1e-12) { printf "the last step'"'"'s lr %s, onecycle'"'"'s final rate 4e-07\n", last; bad = 1 }
	   exit bad }' "$tmp/oc.lr" ||
	fail "onecycle resumed with batch 16: $(tr '\n' ' ' <"$tmp/oc.lr")"
# and the resumed steps are PyTorch's OneCycleLR(max_lr = 0.1,
# total_steps = 12, cycle_momentum = False) at steps 6..11 (2.x)
lrs "$tmp/oc2" | awk 'BEGIN { split("0.0647379 0.04626371 0.0283061 0.013347753 0.0034566987 4e-07", w) }
	{ d = $2 - w[NR]; if (d < 0) d = -d
	  if (d > 1e-6 * w[NR]) { printf "step %d: lr %s, OneCycleLR %s\n", $1, $2, w[NR]; bad = 1 } }
	END { exit bad || NR != 6 }' || fail "onecycle resumed with batch 16 is not OneCycleLR over 12 steps"
echo "ok: onecycle resumed with batch 16 is OneCycleLR over 12 steps, falling from its peak to 4e-07"

# 4: pct_start against the run's 12 steps (9 before session 38)
p9="train.schedule=onecycle train.pct_start=0.1111111111111111"
kiln 0 train "$ini" $base $p9 "run.out_dir=$tmp/p9"
resume_from 0 p9 6 "$tmp/p9r" $p9 train.batch=16
[ "$(field steps "$out")" = 12 ] || fail "pct_start = 1/9: the resumed run ended at step $(field steps "$out"), want 12"
# pct_start = 1/12 over the resumed run's 12 steps gives a rise of no step,
# whose one rate (step 0, 0/0) the first run computed in its own length
# (18): the resumed steps 6..11 are past it, OneCycleLR's falling phase
# over 12 steps, finite (refused before session 40); a fresh 12-step run
# computes step 0's and is refused
p12="train.schedule=onecycle train.pct_start=0.08333333333333333"
kiln 0 train "$ini" $base $p12 "run.out_dir=$tmp/p12"
resume_from 0 p12 6 "$tmp/p12r" $p12 train.batch=16
[ "$(field steps "$out")" = 12 ] || fail "pct_start = 1/12: the resumed run ended at step $(field steps "$out"), want 12"
lrs "$tmp/p12r" | awk 'BEGIN { pi = atan2(0, -1) }
	{ want = 0.1 / 25 / 1e4 + (0.1 - 0.1 / 25 / 1e4) / 2 * (1 + cos(pi * ($1 - 1) / 11))
	  d = $2 - want; if (d < 0) d = -d
	  if (d > 1e-6 * want) { printf "step %d: lr %s, OneCycleLR %.8g\n", $1, $2, want; bad = 1 } }
	END { exit bad || NR != 6 }' || fail "pct_start = 1/12 resumed: not OneCycleLR's fall over 12 steps: $(lrs "$tmp/p12r" | tr '\n' ' ')"
kiln 2 train "$ini" $base $p12 train.max_steps=12 "run.out_dir=$tmp/p12f"
stderr_has "with schedule = onecycle over 12 step(s): pct_start x steps = 1 leaves the rise to lr no step"
echo "ok: pct_start checked against the run's 12 steps where it computes the rise"

# 5: steps skipped for non-finite gradients before the checkpoint
fp="run.precision=fp16 plugin.amp.init_scale=1e9"
kiln 0 train "$ini" $base $p12 $fp "run.out_dir=$tmp/fp"
grep -q '"event":"train","epoch":1,"step":6,.*"skipped":6,' "$tmp/fp/metrics.jsonl" ||
	fail "fp16 from init_scale 1e9: steps 1-6 were not all skipped: $(grep '"step":6,' "$tmp/fp/metrics.jsonl")"
resume_from 2 fp 6 "$tmp/fpr" $p12 $fp train.batch=16
stderr_has "with schedule = onecycle over 12 step(s): pct_start x steps = 1 leaves the rise to lr no step (OneCycleLR divides by zero there) (the resumed checkpoint's 6 step(s) took 0 optimizer step(s), the others skipped for non-finite gradients: the rise is still ahead)"
echo "ok: pct_start checked against the optimizer steps taken, not the steps skipped"
echo "$checks checks passed"
