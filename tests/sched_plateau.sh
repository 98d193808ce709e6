#!/bin/sh
# tests/sched_plateau.sh - [train] schedule = plateau (ReduceLROnPlateau on
# each evaluation point's loss, session 43) through the trainer, and its
# state across a resume and a SIGKILL.
# tests/data/tr_cnn.ini, 3 epochs of 6 steps, an evaluation after every
# step (eval_every = 1), lr 0.02, warmup 2, plateau_factor 0.5, patience 1,
# threshold 0.02 (rel), cooldown 1:
# 1. each step's lr (metrics.jsonl, log_every = 1) is the warm-up factor
#    times ReduceLROnPlateau's rate after the evaluations before it, fed
#    the losses kiln logged (the reference loop below: PyTorch's step(),
#    which tests/check_sched checks core/plateau.c against bit for bit),
#    and the rate is cut at least twice;
# 2. resumed from the checkpoints of steps 3, 6, 9 and 13 (a checkpoint
#    every step; the cut state, the bad count and the cooldown are in
#    them), the run ends with the uninterrupted run's ckpt-18.kiln, byte
#    for byte (every section but the config);
# 3. SIGKILLed at the rename of ckpt-10.kiln (strace; when strace can
#    trace) and resumed: the same ckpt-18.kiln;
# 4. plateau_factor = 1 and eval = 0 are config errors at their line
#    (exit 2); the plateau_* keys under another schedule are warned of.
# Before session 43 `schedule = plateau` was refused (exit 2: not one of
# constant|cosine|...); without the checkpoint's "plateau" section a
# resumed run would restart the schedule at lr and end elsewhere.
name=sched_plateau
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
tool="$top_builddir/tests/ckpt_tool"
need_source idx

pl="train.schedule=plateau train.plateau_factor=0.5 train.plateau_patience=1 train.plateau_threshold=0.02 train.plateau_cooldown=1 train.warmup=2 train.lr=0.02"
base="data.path=$data train.max_steps=0 train.epochs=3 train.eval=1 train.eval_every=1 train.log_every=1 train.checkpoint_every=1 train.keep_last=0"

# steps DIR: "step lr loss" a line each: the train event's lr and the
# evaluation's loss after it
steps() {
	awk '/"event":"train"/ && match($0, /"step":[0-9]+,/) {
		s = substr($0, RSTART + 7, RLENGTH - 8); match($0, /"lr":[^,}]*/); lr[s] = substr($0, RSTART + 5, RLENGTH - 5) }
	     /"event":"eval"/ && match($0, /"step":[0-9]+,/) {
		s = substr($0, RSTART + 7, RLENGTH - 8); match($0, /"loss":[^,}]*/); loss[s] = substr($0, RSTART + 7, RLENGTH - 7) }
	     END { for (k = 1; k <= 18; k++) print k, lr[k], loss[k] }' "$1/metrics.jsonl"
}

# 1
# shellcheck disable=SC2086
kiln 0 train "$ini" $base $pl "run.out_dir=$tmp/a"
steps "$tmp/a" >"$tmp/a.steps"
awk 'BEGIN { rate = 0.02; best = 1e308 * 10; bad = 0; cool = 0; W = 2 }
	{ t = $1 - 1; warm = t < W ? (t + 1) / W : 1; want = warm * rate
	  d = $2 - want; if (d < 0) d = -d
	  if ($2 == "" || $3 == "" || d > 1e-6 * want) { printf "step %d: lr %s, want %.9g (loss %s)\n", $1, $2, want, $3; bad_lr = 1 }
	  # ReduceLROnPlateau.step($3): mode min, threshold_mode rel
	  if ($3 + 0 < best * (1 - 0.02)) { best = $3 + 0; bad = 0 } else bad++
	  if (cool > 0) { cool--; bad = 0 }
	  if (bad > 1) { nr = rate * 0.5; if (rate - nr > 1e-8) { rate = nr; cuts++ } cool = 1; bad = 0 } }
	END { if (cuts < 2) { printf "%d cut(s) of the rate, want at least 2\n", cuts; bad_lr = 1 }
	      printf "%d cuts, final rate %g\n", cuts, rate; exit bad_lr }' "$tmp/a.steps" ||
	fail "the rates are not ReduceLROnPlateau's on kiln's losses: $(tr '\n' ' ' <"$tmp/a.steps")"
grep -q "schedule = plateau: test loss .* lr 0.02 -> 0.01" "$err" || fail "no cut from 0.02 to 0.01 logged"
echo "ok: 18 steps at ReduceLROnPlateau's rates: $(awk '{ printf "%s ", $2 }' "$tmp/a.steps")"

tags=$("$tool" sections "$(ck a 18)" | awk '$1 != "config" { print $1 }')
echo "$tags" | grep -qx plateau || fail "ckpt-18.kiln has no plateau section: $tags"
# same RUN: RUN's ckpt-18.kiln is a's, every section but the config
same() {
	# shellcheck disable=SC2086
	"$tool" same "$(ck a 18)" "$(ck "$1" 18)" $tags || fail "$1: ckpt-18.kiln differs from the uninterrupted run's"
}

# 2
for k in 3 6 9 13; do
	rm -rf "$tmp/r$k"
	mkdir -p "$tmp/r$k/checkpoints"
	cp "$(ck a $k)" "$tmp/r$k/checkpoints/"
	# shellcheck disable=SC2086
	kiln 0 train "$ini" $base $pl "run.out_dir=$tmp/r$k" --resume
	stdout_has "\"resumed_step\": $k"
	same "r$k"
	echo "ok: resumed at step $k: ckpt-18 the uninterrupted run's"
done
grep -q "resume: schedule = plateau at lr" "$err" || fail "the resume logged no plateau state"

# 2b: lr_scale = linear (base_batch 8: the same rates as a), resumed from
# ckpt-12 (epoch 2 complete) in batches of 16: the checkpoint's rate x
# 16 / 8, as every other schedule's base follows the new global batch
# (before, the checkpoint's absolute rate: step 13 at s's)
sc="train.lr_scale=linear train.base_batch=8"
# shellcheck disable=SC2086
kiln 0 train "$ini" $base $pl $sc "run.out_dir=$tmp/s"
rm -rf "$tmp/s16"
mkdir -p "$tmp/s16/checkpoints"
cp "$(ck s 12)" "$tmp/s16/checkpoints/"
# shellcheck disable=SC2086
kiln 0 train "$ini" $base $pl $sc train.batch=16 "run.out_dir=$tmp/s16" --resume
stdout_has '"resumed_step": 12'
stderr_has "resume: schedule = plateau: the global batch changes from 8 to 16 with lr_scale = linear"
steps "$tmp/s" >"$tmp/s.steps"
steps "$tmp/s16" >"$tmp/s16.steps"
r=$(awk '$1 == 13 { print $2 }' "$tmp/s.steps")
r16=$(awk '$1 == 13 { print $2 }' "$tmp/s16.steps")
awk -v r="$r" -v g="$r16" 'BEGIN { d = g - 2 * r; if (d < 0) d = -d; exit !(r > 0 && d <= 1e-6 * 2 * r) }' ||
	fail "resumed at batch 16 with lr_scale = linear: step 13 at lr $r16, want 2 x $r (batch 8's)"
echo "ok: resumed in batch 16 with lr_scale = linear: step 13 at $r16 = 2 x $r"

# 3: SIGKILL at ckpt-10's rename (the 10th checkpoint rename; the run's
# first rename is its config.ini's)
if command -v strace >/dev/null 2>&1 && strace -qq -o /dev/null true 2>/dev/null &&
	[ "$(uname -m)" = x86_64 ]; then
	# shellcheck disable=SC2086
	strace -f -qq -o /dev/null -e trace=rename -e inject=rename:signal=SIGKILL:when=11 \
		"$kiln" train "$ini" $base $pl "run.out_dir=$tmp/k" >"$tmp/k.out" 2>&1
	rc=$?
	[ $rc -eq 137 ] || fail "kiln train under strace, killed at its 11th rename: exit $rc, not 137"
	[ -e "$(ck k 9)" ] && [ ! -e "$(ck k 10)" ] ||
		fail "killed at ckpt-10's rename: $(ls "$tmp/k/checkpoints" | tr '\n' ' ')"
	# shellcheck disable=SC2086
	kiln 0 train "$ini" $base $pl "run.out_dir=$tmp/k" --resume
	stdout_has '"resumed_step": 9'
	same k
	echo "ok: SIGKILLed at ckpt-10's rename, resumed from ckpt-9: ckpt-18 the uninterrupted run's"
else
	echo "note: no strace here: the SIGKILL is left to item 2's resumes"
fi

# 4
bad() { # KEY VALUE MESSAGE
	{ cat "$ini"; printf 'schedule = plateau\n%s = %s\n' "$1" "$2"; } >"$tmp/bad.ini"
	_line=$(grep -n "^$3 = " "$tmp/bad.ini" | cut -d: -f1)
	kiln 2 train "$tmp/bad.ini" data.path="$data" run.out_dir=
	grep -qF "$tmp/bad.ini:$_line: $4" "$err" || fail "$1 = $2: no '$tmp/bad.ini:$_line: $4': $(cat "$err")"
}
bad plateau_factor 1 plateau_factor "[train] plateau_factor = 1: the rate is multiplied by it when the loss stops improving, so it must be below 1"
bad eval 0 schedule "[train] schedule = plateau reads the evaluations' loss, and [train] eval = 0 runs none"
kiln 2 train "$ini" data.path="$data" run.out_dir= train.schedule=plateau train.plateau_threshold_mode=relative
stderr_has "'plateau_threshold_mode' = 'relative' is not one of rel|abs"
kiln 0 train "$ini" data.path="$data" run.out_dir= train.max_steps=1 train.plateau_patience=3
stderr_has "command line 'train.plateau_patience=3': [train] plateau_patience is read by schedule = plateau, not by schedule = constant: ignored"
echo "$checks checks passed"
