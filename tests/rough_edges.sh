#!/bin/sh
# tests/rough_edges.sh - what a new user trips over on day one (issue 24),
# on the tiny model and data of tests/data/tr_cnn.ini:
#  1. idx `mean` with three values on 1-channel images names the count;
#  2. a layer's error carries its context once ("layer 'conv1' (conv): "),
#     not twice;
#  3. `section.key=` on the command line unsets a key (its default applies);
#  4. without evaluation the final JSON (stdout, metrics.jsonl) says null
#     for test_loss and test_acc; the final line's wall_s = setup_s + fit_s;
#  5. [data] limit is logged with the count it keeps, and [data.eval] does
#     not inherit it: evaluation takes the whole test set;
#  6. after a resume within an epoch, the epoch's train_loss averages the
#     whole epoch (the checkpoint's partial sums), as an uninterrupted run's;
#  7. KILN_LOG_LEVEL shows debug lines or hides info lines.
name=rough
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"

need_source idx
d="data.path=$data"

# 1
kiln 2 train "$ini" "$d" "data.mean=0.1 0.2 0.3" run.out_dir=
stderr_has "[data] mean = '0.1 0.2 0.3' gives 3 values, but the idx source's images have 1 channel"
! grep -q "is not a number" "$err" || fail "the count is reported as 'is not a number'"

# 2
kiln 2 train "$ini" "$d" layer.conv1.groups=3 run.out_dir=
stderr_has "layer 'conv1' (conv): groups = 3"
[ "$(grep -o "layer 'conv1' (conv)" "$err" | wc -l)" -eq 1 ] || fail "the layer's context is repeated"

# 3: the last override empties bias: conv decides (no bias before batchnorm)
kiln 0 train "$ini" "$d" layer.conv1.bias=1 layer.conv1.bias= train.max_steps=1 run.out_dir=
stderr_has "layer 'conv1': convolution followed by batchnorm gets no bias"
kiln 2 train "$ini" "$d" layer.conv1.bias=maybe run.out_dir=
stderr_has "'bias' = 'maybe' is not a boolean"

# 4
kiln 0 train "$ini" "$d" train.eval=0 "run.out_dir=$tmp/noeval"
stdout_has '"test_loss": null, "test_acc": null,'
grep -q '"event":"final".*"test_loss":null,"test_acc":null' "$tmp/noeval/metrics.jsonl" ||
	fail "metrics.jsonl's final line lacks null test metrics"
# ... and splits wall_s into setup_s + fit_s, both positive
sed -n 's/.*"event":"final".*"wall_s":\([0-9.e+-]*\),"setup_s":\([0-9.e+-]*\),"fit_s":\([0-9.e+-]*\)}$/\1 \2 \3/p' \
	"$tmp/noeval/metrics.jsonl" | awk '{ d = $1 - $2 - $3; if (NF == 3 && $2 > 0 && $3 > 0 && d < 1e-4 && d > -1e-4) ok = 1 }
		END { exit !ok }' || fail "metrics.jsonl's final line: wall_s is not setup_s + fit_s"

# 5
kiln 0 train "$ini" "$d" data.limit=16 train.max_steps=1 run.out_dir=
stderr_has "[data] limit = 16: the first 16 of the source's 48 samples"
stdout_has '"test_samples": 48,'

# 6: steps 1..6 in one run, and 1..2 + a resume from step 2's checkpoint
#    (taken between two log points: log_every 3) for 3..6
one="train.max_steps=0 train.log_every=3"
kiln 0 train "$ini" "$d" $one "run.out_dir=$tmp/whole"
whole=$(field train_loss "$out")
kiln 0 train "$ini" "$d" $one train.max_steps=4 train.checkpoint_every=2 train.keep_last=0 \
	"run.out_dir=$tmp/cut"
rm "$tmp/cut/checkpoints/ckpt-4.kiln"
kiln 0 train "$ini" "$d" $one train.checkpoint_every=2 train.keep_last=0 --resume \
	"run.out_dir=$tmp/cut"
stdout_has '"resumed_step": 2'
resumed=$(field train_loss "$out")
awk -v a="$whole" -v b="$resumed" 'BEGIN { d = a - b; exit !(a > 0 && d < 1e-4 && d > -1e-4) }' ||
	fail "train_loss after the resume is $resumed, the uninterrupted run's $whole"
# 7: KILN_LOG_LEVEL sets what reaches stderr: debug lines only when asked,
#    info lines not at "error", another value refused
export KILN_LOG_LEVEL=debug
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
stderr_has "[train] debug: schedule"
export KILN_LOG_LEVEL=error
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
! grep -q "gets no bias" "$err" || fail "KILN_LOG_LEVEL=error still prints info lines"
export KILN_LOG_LEVEL=loud
kiln 2 --version
stderr_has "KILN_LOG_LEVEL = 'loud' is not one of error, warn, info, debug"
unset KILN_LOG_LEVEL
kiln 0 train "$ini" "$d" train.max_steps=1 run.out_dir=
! grep -q "debug:" "$err" || fail "debug lines without KILN_LOG_LEVEL=debug"
stderr_has "gets no bias"
echo "PASS: $checks kiln runs (train_loss $whole whole, $resumed resumed)"
