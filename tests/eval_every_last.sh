#!/bin/sh
# tests/eval_every_last.sh - [train] eval_every with a last step that is no
# evaluation point (32 steps, eval_every = 6): the evaluation after it
# ("and after the last", docs/config.md) is logged as any evaluation, at
# step 32: metrics.jsonl's eval line and eval.csv's row (tests/log_check.py
# csv: the same numbers) with the numbers kiln train's JSON line reports;
# with [data.val], the val line, whose numbers are the JSON line's val_loss
# and val_acc, then the final test's.  A resume of the finished run logs it
# no second time (the last checkpoint is written again with its numbers).
# It is not an evaluation point: keep_best and early stopping leave it out
# (docs/training.md), so best/ holds step 30's file though step 32's loss
# is lower, and a run cut at step 20 (its own such evaluation logged there)
# and resumed to 32 keeps the uninterrupted run's best/ files, best and
# stopper sections and weights.  Before session 39 the eval lines (and
# eval.csv, TensorBoard) ended at step 30.
name=eval_every_last
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
tool="$abs_top_builddir/tests/ckpt_tool"
mlp="$srcdir/examples/fashion_mnist_mlp.ini"
set -- data.limit=512 data.eval.limit=400 train.batch=32 train.epochs=2 train.log_every=4 \
	train.eval_every=6 log.csv=1 train.keep_best=2 train.best_metric=loss \
	train.early_stop_patience=3 train.early_stop_metric=loss
val="data.val.images=$FM/t10k-images-idx3-ubyte.gz data.val.labels=$FM/t10k-labels-idx1-ubyte.gz data.val.limit=300"

# SET DIR: the steps of DIR's eval lines of SET
evals() { grep '"event":"eval"' "$2/metrics.jsonl" | grep "\"set\":\"$1\"" | sed 's/.*"step":\([0-9]*\),.*/\1/' | tr '\n' ' '; }
# SET DIR STEP KEY: the number KEY of that line, as logged
eval_field() {
	grep '"event":"eval"' "$2/metrics.jsonl" | grep "\"set\":\"$1\"" | grep "\"step\":$3," |
		sed "s/.*\"$4\":\([0-9.e+-]*\).*/\1/"
}
# A B: the numbers A (as logged) and B (the JSON line's %.6f) agree
same6() { [ -n "$1" ] && [ "$(awk -v a="$1" 'BEGIN { printf "%.6f", a }')" = "$2" ]; }

run="$tmp/run"
kiln 0 train "$mlp" "run.out_dir=$run" "$@"
[ "$(evals test "$run")" = "6 12 18 24 30 32 " ] ||
	fail "test evaluations at steps $(evals test "$run"), expected 6 12 18 24 30 32"
same6 "$(eval_field test "$run" 32 loss)" "$(field test_loss "$out")" ||
	fail "step 32's test loss $(eval_field test "$run" 32 loss), the JSON line's $(field test_loss "$out")"
same6 "$(eval_field test "$run" 32 acc)" "$(field test_acc "$out")" ||
	fail "step 32's test acc $(eval_field test "$run" 32 acc), the JSON line's $(field test_acc "$out")"
tail -1 "$run/eval.csv" | grep -q '^test,2,32,' || fail "eval.csv ends with $(tail -1 "$run/eval.csv")"
python3 "$srcdir/tests/log_check.py" csv "$run" || fail "$run: the CSV tables differ from metrics.jsonl"
# not kept: step 32's loss is the lowest, best/ holds 24 and 30
l30=$(eval_field test "$run" 30 loss)
l32=$(eval_field test "$run" 32 loss)
awk -v a="$l32" -v b="$l30" 'BEGIN { exit !(a < b) }' || fail "step 32's loss $l32 is not below step 30's $l30"
[ "$(ls "$run/checkpoints/best" | tr '\n' ' ')" = "ckpt-24.kiln ckpt-30.kiln " ] ||
	fail "best/ holds $(ls "$run/checkpoints/best" | tr '\n' ' '), expected step 24's and 30's"
! grep -q '"event":"best","step":32' "$run/metrics.jsonl" || fail "step 32's evaluation was kept (keep_best)"
stderr_has "checkpoint $run/checkpoints/ckpt-32.kiln again, with the numbers of the evaluations after step 32"
lines=$(wc -l < "$run/metrics.jsonl")
loss=$(field test_loss "$out")

# resumed twice: a resume line and a final line each, nothing logged again
for i in 1 2; do
	kiln 0 train "$mlp" "run.out_dir=$run" "$@" train.resume=1
	[ "$(field test_loss "$out")" = "$loss" ] || fail "resume $i: test_loss $(field test_loss "$out"), the run's $loss"
	[ "$(wc -l < "$run/metrics.jsonl")" = $((lines + 2 * i)) ] ||
		fail "resume $i: metrics.jsonl has $(wc -l < "$run/metrics.jsonl") lines, expected $((lines + 2 * i)): $(tail -3 "$run/metrics.jsonl")"
done
[ "$(evals test "$run")" = "6 12 18 24 30 32 " ] || fail "after the resumes: test evaluations at $(evals test "$run")"

# cut at step 20 (logged there too, kept by nothing) and resumed to 32:
# the uninterrupted run's best/ files, lists, stopper and weights
cut="$tmp/cut"
kiln 0 train "$mlp" "run.out_dir=$cut" "$@" train.max_steps=20
[ "$(evals test "$cut")" = "6 12 18 20 " ] || fail "cut run: test evaluations at $(evals test "$cut")"
kiln 0 train "$mlp" "run.out_dir=$cut" "$@" train.resume=1 train.max_steps=0
stdout_has '"resumed_step": 20,'
[ "$(ls "$cut/checkpoints/best" | tr '\n' ' ')" = "ckpt-24.kiln ckpt-30.kiln " ] ||
	fail "resumed: best/ holds $(ls "$cut/checkpoints/best" | tr '\n' ' ')"
"$tool" same "$run/checkpoints/ckpt-32.kiln" "$cut/checkpoints/ckpt-32.kiln" best stopper params ||
	fail "resumed at 20: the last checkpoint's best list, stopper or weights differ from the uninterrupted run's"
[ "$(field test_loss "$out")" = "$loss" ] || fail "resumed at 20: test_loss $(field test_loss "$out"), the uninterrupted run's $loss"

# [data.val]: the val evaluation after step 32 logged, then the final test
vr="$tmp/val"
# shellcheck disable=SC2086
kiln 0 train "$mlp" "run.out_dir=$vr" "$@" $val
[ "$(evals val "$vr")" = "6 12 18 24 30 32 " ] || fail "val evaluations at steps $(evals val "$vr")"
[ "$(evals test "$vr")" = "32 " ] || fail "test evaluations at steps $(evals test "$vr"), expected the final test's"
same6 "$(eval_field val "$vr" 32 loss)" "$(field val_loss "$out")" ||
	fail "step 32's val loss $(eval_field val "$vr" 32 loss), the JSON line's $(field val_loss "$out")"
same6 "$(eval_field val "$vr" 32 acc)" "$(field val_acc "$out")" ||
	fail "step 32's val acc $(eval_field val "$vr" 32 acc), the JSON line's $(field val_acc "$out")"
grep '^val,' "$vr/eval.csv" | tail -1 | grep -q '^val,2,32,' || fail "eval.csv's last val row: $(grep '^val,' "$vr/eval.csv" | tail -1)"
python3 "$srcdir/tests/log_check.py" csv "$vr" || fail "$vr: the CSV tables differ from metrics.jsonl"
lines=$(wc -l < "$vr/metrics.jsonl")
# shellcheck disable=SC2086
kiln 0 train "$mlp" "run.out_dir=$vr" "$@" $val train.resume=1
[ "$(wc -l < "$vr/metrics.jsonl")" = $((lines + 2)) ] || fail "the resumed [data.val] run logged again: $(tail -4 "$vr/metrics.jsonl")"
echo "PASS: $checks runs"
