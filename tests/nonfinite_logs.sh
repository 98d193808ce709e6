#!/bin/sh
# tests/nonfinite_logs.sh - a NaN or infinite loss in the run's logs, and
# in keep_best and early stopping (session 39).
#  1. a training set whose sample 20 overflows the forward (its pixels 1,
#     the others 0; fc1's weights 1e37): its step is skipped, the epoch's
#     train loss and the evaluation's loss are NaN.  metrics.jsonl has its
#     one "final" line with "train_loss":null and "test_loss":null, the
#     stdout line agrees, `kiln report` has its Result table, and the CSV
#     tables say nan (before: no final line, as json_pack refuses a NaN,
#     with a warning blaming memory; the report called the run unfinished;
#     the CSV cells said -nan);
#  2. keep_best and early stopping when the first evaluations diverge:
#     fc1's weights 1e30, halved ten times a step by weight decay
#     (lr 0.9 x weight_decay 1), the evaluation's inputs 1e10 times the
#     training set's: its loss is NaN at step 1, inf at step 2, then
#     finite and falling ten times a step.  keep_best = 2 keeps the last
#     two steps' checkpoints, each "best" line finite, and patience 3 does
#     not stop the run (before: the NaN of step 1 was the best for good,
#     best/ held its checkpoint alone, no "best" line was logged, and
#     early stopping stopped at step 4); patience 2 stops it at step 2,
#     the NaN and the inf counted as evaluations without improvement;
#  3. a resume from a checkpoint whose keep_best list and early stopping
#     best are NaN (what a kiln before session 39 wrote after such a
#     first evaluation; ckpt_tool nan makes one): accepted, and the first
#     finite evaluations displace the NaN (before: the resume was refused,
#     "section 'best': entry 0 out of range").
#  4. fc1's weights +-2e37 (no sample overflows the forward, the logits
#     finite): each log interval's loss sum passes f32's range (inf) while
#     every gradient is finite and no step is skipped: the run fails at
#     its first log point, exit 3, "loss is inf at step 2 ... training
#     diverged (no step of the interval was skipped ...)" (before session
#     41 it exited 0 with "loss inf" at every log point and a null
#     train_loss, where skip_nonfinite = 0 failed it);
#  5. a checkpoint's "epoch" section with a NaN loss sum (ckpt_tool nan64)
#     and no step skipped by its step: a resume is refused naming the file
#     and the section, exit 3 (before session 41 accepted: the resumed
#     epoch's train loss NaN); the first run's own NaN epoch (step 3
#     skipped) still resumes.
#  6. an evaluation set whose every target is ignore_index (a token set of
#     pads): its loss and accuracy are 0 / 0, NaN.  kiln train warns once
#     per evaluation ("every target of [data.eval] is ignore_index") and
#     prints "final test accuracy: nan%" (before session 42: no line, as
#     the check was test_acc >= 0); kiln eval prints "acc nan%" (before:
#     "acc -nan%").
name=nonfinite_logs
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
data="$srcdir/tests/data"
need_source idx

# ---- 1. a NaN training and evaluation loss in the logs --------------------
python3 - "$data/tr_cnn_images.idx" "$tmp/bright.idx" "$tmp/e37.st" "$tmp/e30.st" "$tmp/big.st" <<'EOF' || fail "python3 could not write the files"
import st, sys
b = bytearray(open(sys.argv[1], "rb").read())
for i in range(48):
    b[16 + 64 * i:16 + 64 * (i + 1)] = bytes([255 if i == 20 else 0]) * 64
open(sys.argv[2], "wb").write(b)
def weights(path, w):
    st.write(path, {"fc1.weight": ([5, 64], w)})
weights(sys.argv[3], [1e37] * 320)
weights(sys.argv[4], [1e30 * ((k * 37 % 101) - 50) / 400 for k in range(320)])
weights(sys.argv[5], [2e37 * ((k * 37 % 101) - 50) / 50 for k in range(320)])
EOF
{
	ini run threads=1
	ini_tr_cnn_mlp "$data"
	ini train batch=8 epochs=1 log_every=2
} >"$tmp/mlp.ini"
kiln 0 train "$tmp/mlp.ini" "data.images=$tmp/bright.idx" "data.eval.images=$tmp/bright.idx" \
	"model.init_from=$tmp/e37.st" model.init_strict=0 log.csv=1 "run.out_dir=$tmp/nan"
! grep -q "could not be made" "$err" || fail "a metrics.jsonl record was left out: $(grep 'could not be made' "$err")"
# the lines a person reads say nan, as the CSV tables (below): the
# interval's, the epoch's, its evaluation's (before session 40 "-nan",
# the NaN of inf - inf having its sign bit set)
! grep -- '-nan' "$err" || fail "stderr says -nan (above)"
stderr_has "epoch 1 step 4/6 loss nan acc "
stderr_has "epoch 1/1: train loss nan acc "
stderr_has ", test loss nan acc "
echo "ok: stderr says nan"
stdout_has '"train_loss": null, '
stdout_has '"test_loss": null, '
stdout_has '"steps_skipped": 1, '
python3 - "$tmp/nan/metrics.jsonl" <<'EOF' || fail "metrics.jsonl's final line"
import json, sys
def bad(c): raise ValueError("not JSON: " + c)
lines = [json.loads(l, parse_constant=bad) for l in open(sys.argv[1])]
final = [j for j in lines if j["event"] == "final"]
assert len(final) == 1, "%d final lines" % len(final)
f = final[0]
assert lines[-1] is f, "the final line is not the last"
assert f["train_loss"] is None and f["test_loss"] is None, f
ev = [j for j in lines if j["event"] == "eval"]
assert len(ev) == 1 and ev[0]["loss"] is None, ev
assert f["steps"] == 6 and f["epochs"] == 1 and f["test_acc"] == ev[0]["acc"] > 0, f
EOF
echo "ok: one final line, train_loss and test_loss null"
# column FILE NAME: the cells of CSV table FILE's column NAME, one line
column() { awk -F, -v n="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == n) c = i; next }
	c { printf "%s ", $c } END { print "" }' "$1"; }
# the CSV tables: nan (the NaN of inf - inf has its sign bit set: %g said -nan)
[ "$(column "$tmp/nan/eval.csv" loss)" = "nan " ] ||
	fail "eval.csv's loss: $(column "$tmp/nan/eval.csv" loss), expected nan"
column "$tmp/nan/train.csv" loss | grep -qE '^[0-9.e+-]+ nan [0-9.e+-]+ $' ||
	fail "train.csv's losses: $(column "$tmp/nan/train.csv" loss), expected the second (steps 3-4: sample 20) nan"
echo "ok: the CSV tables say nan"
kiln 0 report "$tmp/nan" -o "$tmp/nan.html"
grep -q '<h2>Result</h2>' "$tmp/nan.html" || fail "the report has no Result table"
! grep -q 'No "final" line' "$tmp/nan.html" || fail "the report calls the run unfinished"
# its null losses are "not finite", the accuracy a number (before
# session 40 the test loss was "missing", and there was no train loss row)
row() { grep -o "<tr><td>$1</td><td>[^/]*" "$tmp/nan.html"; }
[ "$(row 'test loss')" = '<tr><td>test loss</td><td><span class="note">not finite<' ] ||
	fail "the report's test loss row: $(row 'test loss')"
[ "$(row "train loss (the last epoch's)")" = "<tr><td>train loss (the last epoch's)</td><td><span class=\"note\">not finite<" ] ||
	fail "the report's train loss row: $(row "train loss (the last epoch's)")"
row 'test accuracy' | grep -q '<td>0\.1042<' || fail "the report's test accuracy row: $(row 'test accuracy')"
echo "ok: kiln report has the run's result, its losses not finite"

# ---- 2. keep_best and early stopping past a NaN and an inf evaluation -----
train="train.optimizer=sgd train.momentum=0 train.lr=0.9 train.weight_decay=1 train.eval_every=1
	train.keep_best=2 train.best_metric=loss train.early_stop_patience=3 train.early_stop_metric=loss"
kiln 0 train "$tmp/mlp.ini" train.epochs=2 train.max_steps=7 train.checkpoint_every=3 $train \
	"model.init_from=$tmp/e30.st" model.init_strict=0 data.eval.std=1e-10 log.csv=1 "run.out_dir=$tmp/kb"
! grep -q "early stop" "$err" || fail "early stopping stopped the run: $(grep "early stop" "$err")"
# each evaluation's line: nan, then inf (before session 40 "-nan")
! grep -- '-nan' "$err" || fail "stderr says -nan (above)"
stderr_has "[train] step 1: test loss nan acc "
stderr_has "[train] step 2: test loss inf acc "
python3 - "$tmp/kb/metrics.jsonl" "$tmp/kb" <<'EOF' || fail "keep_best and early stopping"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
loss = [j["loss"] for j in lines if j["event"] == "eval"]
assert len(loss) == 7 and loss[0] is None and loss[1] is None, loss
assert all(b < a / 5 for a, b in zip(loss[2:], loss[3:])), loss
best = [(j["step"], j["loss"]) for j in lines if j["event"] == "best"]
assert best == [(s, loss[s - 1]) for s in range(3, 8)], best
assert [j for j in lines if j["event"] == "final"][0]["steps"] == 7
EOF
[ "$(ls "$tmp/kb/checkpoints/best" | tr '\n' ' ')" = "ckpt-6.kiln ckpt-7.kiln " ] ||
	fail "best/ holds $(ls "$tmp/kb/checkpoints/best" | tr '\n' ' '), expected the checkpoints of steps 6 and 7"
column "$tmp/kb/eval.csv" loss | grep -q '^nan inf [0-9]' ||
	fail "eval.csv's losses: $(column "$tmp/kb/eval.csv" loss), expected nan, inf, then numbers"
echo "ok: keep_best keeps steps 6 and 7, no early stop"
# patience 2: the NaN and the inf are two evaluations without improvement
# (before: the NaN was the best, and the run stopped at step 3)
kiln 0 train "$tmp/mlp.ini" train.epochs=2 train.max_steps=7 $train train.early_stop_patience=2 \
	"model.init_from=$tmp/e30.st" model.init_strict=0 data.eval.std=1e-10 "run.out_dir=$tmp/es"
stderr_has "early stop at step 2: test loss did not improve by more than 0 in 2 evaluations (best none finite)"
[ -z "$(ls "$tmp/es/checkpoints/best")" ] || fail "best/ holds $(ls "$tmp/es/checkpoints/best"), expected nothing"
echo "ok: patience 2 stops at step 2, no best"

# ---- 3. a resume from a NaN keep_best list and early stopping best --------
# ckpt-3's list [step 3] and stopper best made NaN (f64 element 1 of "best"
# is entry 0's value, after the count; element 0 of "stopper" its best),
# the run resumed from it: best/ holds that step's file (a copy), the
# uninterrupted run's best/ files are kept aside to compare
rm "$(ck kb 6)" "$(ck kb 7)"
"$top_builddir/tests/ckpt_tool" nan64 "$(ck kb 3)" best 1 || fail "ckpt_tool nan64 best failed"
"$top_builddir/tests/ckpt_tool" nan64 "$(ck kb 3)" stopper 0 || fail "ckpt_tool nan64 stopper failed"
mv "$tmp/kb/checkpoints/best" "$tmp/kb/best.old" && mkdir "$tmp/kb/checkpoints/best" &&
	cp "$(ck kb 3)" "$tmp/kb/checkpoints/best/" || fail "cannot lay out best/"
kiln 0 train "$tmp/mlp.ini" train.epochs=2 train.max_steps=7 train.checkpoint_every=3 $train \
	"model.init_from=$tmp/e30.st" model.init_strict=0 data.eval.std=1e-10 log.csv=1 "run.out_dir=$tmp/kb" --resume
! grep -q "early stop" "$err" || fail "early stopping stopped the run: $(grep "early stop" "$err")"
[ "$(ls "$tmp/kb/checkpoints/best" | tr '\n' ' ')" = "ckpt-6.kiln ckpt-7.kiln " ] ||
	fail "the resumed run's best/ holds $(ls "$tmp/kb/checkpoints/best" | tr '\n' ' '), expected the checkpoints of steps 6 and 7"
"$top_builddir/tests/ckpt_tool" same "$tmp/kb/checkpoints/best/ckpt-7.kiln" \
	"$tmp/kb/best.old/ckpt-7.kiln" params best stopper ||
	fail "the resumed run's best/ckpt-7.kiln differs from the uninterrupted run's"
echo "ok: a NaN keep_best entry and early stopping best resumed, displaced"

# ---- 4. a loss sum past f32 with finite gradients ---------------------------
kiln 3 train "$tmp/mlp.ini" "model.init_from=$tmp/big.st" model.init_strict=0 "run.out_dir=$tmp/big"
stderr_has "loss is inf at step 2 (epoch 1): training diverged (no step of the interval was skipped: its gradients were finite, the loss sum past f32's range)"
! grep -q "step 2/6 loss" "$err" || fail "the interval's line was shown: $(grep "step 2/6" "$err")"
echo "ok: an infinite loss sum with no step skipped fails the run"

# ---- 5. a NaN loss in a checkpoint's epoch sums -----------------------------
kiln 0 train "$tmp/mlp.ini" train.max_steps=2 "run.out_dir=$tmp/ep"
"$top_builddir/tests/ckpt_tool" nan64 "$(ck ep 2)" epoch 0 || fail "ckpt_tool nan64 epoch failed"
kiln 3 train "$tmp/mlp.ini" train.max_steps=4 "run.out_dir=$tmp/ep" --resume
stderr_has "checkpoint $(ck ep 2): section 'epoch': the epoch's sums: a loss sum that is not finite (nan) with no step skipped for non-finite gradients there (0 skipped by the checkpoint's step)"
# (section 1's run: its epoch's loss NaN, step 3 skipped; no step left)
kiln 0 train "$tmp/mlp.ini" "data.images=$tmp/bright.idx" "data.eval.images=$tmp/bright.idx" \
	"model.init_from=$tmp/e37.st" model.init_strict=0 log.csv=1 "run.out_dir=$tmp/nan" --resume
stdout_has '"resumed_step": 6'
echo "ok: a NaN epoch loss resumes only where a step was skipped"

# ---- 6. an evaluation set whose every target is ignored ---------------------
if "$kiln" plugins 2>/dev/null | grep -q "^source  *tokens .*available"; then
	# (tests/tok_pads.py: 25 windows with pads to train on, [data.eval] its
	# pad.bin, 81 pads)
	python3 "$srcdir/tests/tok_pads.py" "$tmp/tp" 25 3 softmax_xent pad.bin >/dev/null ||
		fail "python3 could not write the token files"
	kiln 0 train "$tmp/tp/softmax_xent.ini" "run.out_dir=$tmp/pad" train.batch=5 train.max_steps=2 \
		train.eval_every=1
	stderr_has "final test accuracy: nan% (10 samples)"
	n=$(grep -c "every target of \[data.eval\] is ignore_index: its 10 samples count no target" "$err")
	[ "$n" = 2 ] || fail "$n warnings of an all-ignored [data.eval], not 2 (one per evaluation; the final test is step 2's)"
	! grep -q -- "-nan" "$err" || fail "kiln train prints -nan"
	kiln 0 eval "$tmp/tp/softmax_xent.ini" --checkpoint "$(ck pad 2)"
	stderr_has "test loss nan acc nan% (10 samples"
	! grep -q -- "-nan" "$err" || fail "kiln eval prints -nan"
	echo "ok: an all-ignored evaluation set says nan, once per evaluation"
else
	echo "(no tokens source: section 6 skipped)"
fi
echo "PASS: $checks runs"
