#!/bin/sh
# tests/ckpt_misnamed.sh - a checkpoint whose name says another step than
# its header holds (a copy or a rename) is no checkpoint of that step
# (session 39).
#
# Before session 39 the newest checkpoint was the highest ckpt-<step>.kiln
# NAME: after `cp ckpt-8.kiln ckpt-100.kiln` every --resume restarted at
# step 8 (and trained 8 -> 12 again, for ever: keep_last never deleted
# ckpt-100, "above the step just written"), and `kiln eval` and `kiln
# export` of the run read step 8's weights beside a ckpt-12.kiln, all
# without a word; keep_best's resume deleted a copy in best/ by its name.
# Now such a file is warned of, naming it and both steps, and left alone:
# --resume continues from the newest true checkpoint, eval reads it,
# keep_last and keep_best neither count nor delete it; a run directory
# holding only misnamed checkpoints is refused by --resume (exit 3), not
# started afresh.  A name kiln does not write (a leading zero: ckpt-08.kiln)
# is not read as a checkpoint in checkpoints/ nor best/.  On tests/data/tr_cnn.ini (8x8 images, 48 samples, 6
# steps an epoch).
name=ckpt_misnamed
. "$(dirname "$0")/lib.sh"
need_source idx
ini="$srcdir/tests/data/tr_cnn.ini"
d="data.path=$srcdir/tests/data"
run="$tmp/run"
ck="$run/checkpoints"
keep="train.epochs=4 train.checkpoint_every=2 train.keep_last=3 run.out_dir=$run"

kiln 0 train "$ini" "$d" $keep train.max_steps=12
[ "$(ls "$ck" | tr '\n' ' ')" = "ckpt-10.kiln ckpt-12.kiln ckpt-8.kiln " ] ||
	fail "checkpoints: $(ls "$ck" | tr '\n' ' ')"
cp "$ck/ckpt-8.kiln" "$ck/ckpt-100.kiln"
cp "$ck/ckpt-8.kiln" "$tmp/ck8"
warned="$ck/ckpt-100.kiln: ignored by --resume, kiln eval, kiln export and keep_last: it holds step 8, not step 100 as its name says (a copied or renamed checkpoint?), so it is not taken for step 100, nor deleted; rename it ckpt-8.kiln to use it"

# eval and export read step 12's weights, the newest, not step 8's
kiln 0 eval "$ini" "$d" "run.out_dir=$run"
stderr_has "[ckpt] warning: $warned"
stdout_has "{\"checkpoint\": \"$ck/ckpt-12.kiln\", \"step\": 12,"
kiln 0 eval "$ini" "$d" "run.out_dir=$run" --checkpoint "$ck/ckpt-12.kiln"
cp "$out" "$tmp/eval12"
kiln 0 eval "$ini" "$d" "run.out_dir=$run" --checkpoint "$ck/ckpt-8.kiln"
! cmp -s "$out" "$tmp/eval12" || fail "steps 8 and 12 evaluate alike: the test cannot tell them apart"
kiln 0 export "$ini" "$d" "run.out_dir=$run" --safetensors "$tmp/newest.st"
stderr_has "$warned"
kiln 0 export "$ini" "$d" "run.out_dir=$run" --checkpoint "$ck/ckpt-12.kiln" --safetensors "$tmp/12.st"
cmp -s "$tmp/newest.st" "$tmp/12.st" || fail "export of the run did not write step 12's weights"

# --resume continues from step 12, twice; keep_last rotates the true ones
# and leaves the copy
kiln 0 train "$ini" "$d" $keep train.max_steps=14 --resume
stderr_has "$warned"
stdout_has '"resumed_step": 12'
kiln 0 train "$ini" "$d" $keep train.max_steps=18 --resume
stdout_has '"resumed_step": 14'
[ "$(ls "$ck" | tr '\n' ' ')" = "ckpt-100.kiln ckpt-14.kiln ckpt-16.kiln ckpt-18.kiln " ] ||
	fail "checkpoints after the resumes: $(ls "$ck" | tr '\n' ' ') (want ckpt-100, 14, 16, 18)"
cmp -s "$ck/ckpt-100.kiln" "$tmp/ck8" || fail "ckpt-100.kiln changed"

# a renamed checkpoint alone: --resume refuses, naming it; renamed back, it
# resumes at its step
mkdir -p "$tmp/alone/checkpoints"
cp "$tmp/ck8" "$tmp/alone/checkpoints/ckpt-30.kiln"
kiln 3 train "$ini" "$d" train.epochs=4 train.max_steps=10 "run.out_dir=$tmp/alone" --resume
stderr_has "$tmp/alone/checkpoints/ckpt-30.kiln: ignored by --resume"
stderr_has "$tmp/alone/checkpoints: its 1 checkpoint(s) hold other steps than their names say"
[ ! -e "$tmp/alone/metrics.jsonl" ] || fail "the refused resume started a run"
mv "$tmp/alone/checkpoints/ckpt-30.kiln" "$tmp/alone/checkpoints/ckpt-8.kiln"
kiln 0 train "$ini" "$d" train.epochs=4 train.max_steps=10 "run.out_dir=$tmp/alone" --resume
stdout_has '"resumed_step": 8'

# keep_best: a copy in best/ under another step's name is neither counted
# nor deleted by the resume (it was deleted as "not among keep_best's")
best="train.epochs=4 train.keep_best=2 train.checkpoint_every=0 run.out_dir=$tmp/b"
kiln 0 train "$ini" "$d" $best train.max_steps=12
n=$(ls "$tmp/b/checkpoints/best" | wc -l)
[ "$n" -eq 2 ] || fail "keep_best=2 left $n files in best/"
first=$(ls "$tmp/b/checkpoints/best" | head -1)
cp "$tmp/b/checkpoints/best/$first" "$tmp/b/checkpoints/best/ckpt-5.kiln"
cp "$tmp/b/checkpoints/best/$first" "$tmp/best5"
# and a name with a leading zero is no name of kiln's (step 8's file from
# the first run, as best/ckpt-08.kiln): left alone, unread (it was taken
# for step 8's and deleted as "not among keep_best's")
cp "$tmp/ck8" "$tmp/b/checkpoints/best/ckpt-08.kiln"
kiln 0 train "$ini" "$d" $best train.max_steps=18 --resume
stdout_has '"resumed_step": 12'
stderr_has "$tmp/b/checkpoints/best/ckpt-5.kiln: ignored by keep_best: it holds step "
[ -f "$tmp/b/checkpoints/best/ckpt-5.kiln" ] || fail "keep_best's resume deleted the misnamed best/ckpt-5.kiln"
cmp -s "$tmp/b/checkpoints/best/ckpt-5.kiln" "$tmp/best5" || fail "best/ckpt-5.kiln changed"
[ "$(grep -c 'best/ckpt-5.kiln' "$err")" -eq 1 ] || fail "best/ckpt-5.kiln not named once"
cmp -s "$tmp/b/checkpoints/best/ckpt-08.kiln" "$tmp/ck8" || fail "keep_best's resume deleted or changed best/ckpt-08.kiln"
! grep -q 'ckpt-08' "$err" || fail "best/ckpt-08.kiln was read: $(grep ckpt-08 "$err")"
echo "$checks checks passed"
echo "PASS"
