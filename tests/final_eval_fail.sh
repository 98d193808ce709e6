#!/bin/sh
# tests/final_eval_fail.sh - a failure during the evaluations after a run's
# last step (the epoch's evaluation, [data.val]'s final test) leaves the
# run's last checkpoint (docs/checkpoints.md, resume item 3).
#
# That checkpoint is written at the step, then again after those
# evaluations with their numbers (its "evaluated" section).  In session 32
# it was first written after them only: a [data.val] image that does not
# decode (truncated to 40 bytes here) failed the epoch's evaluation (on
# [data.val]) with exit 3 and the run, checkpoint_every = 0, left
# checkpoints/ empty.  Now the
# failed run leaves ckpt-5.kiln without the section; with the image
# mended, --resume runs the epoch's evaluation and the final test (one
# "eval" event each) and writes ckpt-5.kiln again with it, logging no
# second "checkpoint" event: the failed run logged it, and the resume
# finds it in metrics.jsonl (the resumed process logs the step's event
# only when the run before was killed between its write and its event;
# session 33 logged it twice); a second --resume records none again.
# With log_every 2 the run's last step (5, max_steps) is a log point
# max_steps alone put there: ckpt-5.kiln holds the interval it closed (its
# "interval" section, session 39), and the resume that takes no step
# writes it again with the same section, so that a later resume with
# max_steps raised reopens it (before the fix the rewrite dropped it).
name=finalevalfail
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
need_source idx
need_source folder

kiln 0 pack "$ini" "data.path=$data" --format folder --store png --section data.eval --out "$tmp/png"
bad=$(find "$tmp/png/test" -name '*.png' | sort | head -1)
[ -n "$bad" ] || fail "kiln pack wrote no PNG to $tmp/png/test"
cp "$bad" "$tmp/good.png"
head -c 40 "$tmp/good.png" > "$bad"
run="data.path=$data model.init_from=$data/tr_cnn_init.safetensors run.out_dir=$tmp/r
data.val.source=folder data.val.path=$tmp/png/test data.val.channels=1 data.val.size=8
train.log_every=2"

# shellcheck disable=SC2086
kiln 3 train "$ini" $run
stderr_has "undecodable PNG"
[ -f "$(ck r 5)" ] || fail "the run whose evaluation failed left no ckpt-5.kiln"
"$top_builddir/tests/ckpt_tool" sections "$(ck r 5)" > "$tmp/sections" ||
	fail "ckpt_tool sections $(ck r 5) failed"
! grep -q '^evaluated' "$tmp/sections" || fail "ckpt-5.kiln has an 'evaluated' section before its evaluations"
grep -q '^interval ' "$tmp/sections" || fail "ckpt-5.kiln has no 'interval' section (max_steps closed steps 5..5)"
cp "$(ck r 5)" "$tmp/first.kiln"

evals() { grep -c '"event":"eval"' "$tmp/r/metrics.jsonl"; }
ckpts() { grep -c '"event":"checkpoint"' "$tmp/r/metrics.jsonl"; }
[ "$(evals)" = 0 ] || fail "$(evals) eval events of the run whose evaluation failed, want 0"
[ "$(ckpts)" = 1 ] || fail "$(ckpts) checkpoint events of the run whose evaluation failed, want 1"

cp "$tmp/good.png" "$bad"
# shellcheck disable=SC2086
kiln 0 train "$ini" $run --resume
stdout_has '"resumed_step": 5'
test_loss=$(field test_loss "$out")
[ -n "$test_loss" ] || fail "no test_loss in the resumed run's result"
[ "$(evals)" = 2 ] || fail "$(evals) eval events after the resume, want 2 (the epoch's, the final test)"
[ "$(ckpts)" = 1 ] || fail "$(ckpts) checkpoint events, want 1 (the failed run's)"
"$top_builddir/tests/ckpt_tool" sections "$(ck r 5)" > "$tmp/sections" ||
	fail "ckpt_tool sections $(ck r 5) failed"
grep -q '^evaluated' "$tmp/sections" || fail "ckpt-5.kiln lacks 'evaluated' after its evaluations"
"$top_builddir/tests/ckpt_tool" same "$tmp/first.kiln" "$(ck r 5)" interval epoch params ||
	fail "ckpt-5.kiln written again after its evaluations lost its interval or epoch sums"

# shellcheck disable=SC2086
kiln 0 train "$ini" $run --resume
[ "$(evals)" = 2 ] || fail "$(evals) eval events after a resume of the finished run, want 2"
[ "$(ckpts)" = 1 ] || fail "$(ckpts) checkpoint events after a resume of the finished run, want 1"
[ "$(field test_loss "$out")" = "$test_loss" ] ||
	fail "test_loss $(field test_loss "$out") resuming the finished run, the run's $test_loss"
[ "$(find "$tmp/r/checkpoints" -name '*.kiln*' | wc -l)" = 1 ] ||
	fail "checkpoints/ holds $(find "$tmp/r/checkpoints" -name '*.kiln*' | wc -l) files, want 1"
echo "PASS: final_eval_fail"
