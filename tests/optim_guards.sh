#!/bin/sh
# tests/optim_guards.sh - the optimizer's edges against PyTorch's (session 32):
#
# 1. onecycle whose pct_start x (steps after the warmup) is exactly 1 has a
#    rise of 0 steps and a first rate of 0/0 (PyTorch's OneCycleLR raises
#    ZeroDivisionError): a config error naming pct_start, the step count and
#    another pct_start, exit 2; known only once the steps are counted
#    (epochs x batches, max_steps).  Before session 32 the lr was NaN and the
#    run stopped with non-finite parameters (exit 3).
# 2. an fp16 loss scale backed off at every step (backoff_factor 1e-6) stops
#    at its floor, the smallest normal float, and an interval skipped whole
#    there stops the run as diverged (exit 1 from tests/train_nan, kiln's
#    exit 3).  Before session 32 the scale underflowed to 0, which no step
#    leaves (gradients x 0 unscaled by 1/0 are NaN): every later step was
#    skipped, the parameters frozen, and the run exited 0.
# 3. [plugin.amp] growth_interval above 2^24 (the f32 tracker's exact
#    range: such an interval never grew the scale) is out of the key's range.
# 4. clip_value leaves a non-finite step's gradients as they are (unlike
#    clip_grad_value_): with skip_nonfinite = 0 an infinite gradient reaches
#    its parameter and the parameters check stops the run; such a step is
#    not reported as skipped (before session 32 the warning said so).
# 5. AdamW and LAMB with eps = 0 and an input that is always 0: the NaN
#    update (0/0, PyTorch's too) is blamed on eps, not on the lr (session
#    40).
# 6. amsgrad with optimizer = lamb, which has no AMSGrad: warned ignored,
#    as any key another optimizer reads, and the run trains (session 43;
#    before, the warning was followed by a config error, exit 2).
name=optim_guards
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
d="data.path=$data"
need_source idx

# 1: 48 samples, batches of 8: 6 steps an epoch
oc="train.schedule=onecycle train.epochs=2"
kiln 2 train "$ini" "$d" run.out_dir= $oc train.max_steps=10 train.pct_start=0.1
stderr_has "command line 'train.pct_start=0.1': [train] pct_start = 0.1 with schedule = onecycle over 10 step(s): pct_start x steps = 1 leaves the rise to lr no step (OneCycleLR divides by zero there): use another pct_start, e.g. 0.15, or another number of steps"
# the steps from the epochs (2 x 6 = 12 after a warmup of 2: 10)
kiln 2 train "$ini" "$d" run.out_dir= $oc train.max_steps=0 train.warmup=2 train.pct_start=0.1
stderr_has "[train] pct_start = 0.1 with schedule = onecycle over 10 step(s) after the warmup: pct_start x steps = 1"
kiln 2 train "$ini" "$d" run.out_dir= $oc train.max_steps=6 train.warmup=2 train.pct_start=0.25
stderr_has "[train] pct_start = 0.25 with schedule = onecycle over 4 step(s) after the warmup"
# a rise of a fraction of a step trains (OneCycleLR's too: lr / div_factor, then down)
kiln 0 train "$ini" "$d" run.out_dir= $oc train.max_steps=10 train.pct_start=0.15

# 2: 65536 x 1e-6 per overflow reaches 6.6e-38 at step 6, the floor at step 7;
# step 8 overflows there (NaN written at steps 1..9)
nan="$abs_top_builddir/tests/train_nan"
KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" "$nan" 1-9 "$ini" "$d" run.out_dir= \
	run.precision=fp16 plugin.amp.backoff_factor=1e-6 train.epochs=5 train.max_steps=30 \
	train.log_every=1 > "$out" 2> "$err"
rc=$?
[ $rc = 1 ] || fail "train_nan: exit $rc, expected 1 (diverged at the scale's floor)"
stderr_has "train_nan: steps 8..8 (epoch 2): every step had non-finite gradients and was skipped, the loss finite"
stderr_has "training diverged (the gradients overflow at every step and the loss scale can back off no further: lower [plugin.amp] min_scale, or [train] lr)"
# ... while above its floor the scale backs off and the run goes on (steps 1..7)
KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" "$nan" 1-7 "$ini" "$d" run.out_dir= \
	run.precision=fp16 plugin.amp.backoff_factor=1e-6 train.max_steps=6 \
	train.log_every=1 > "$out" 2> "$err" || fail "train_nan 1-7: exit $?, expected 0"
stderr_has "step 6: 1 step(s) of the last 1 skipped"

# 4: clip_value with skip_nonfinite = 0 leaves an infinite gradient as it is
# (docs/training.md; torch's clip_grad_value_ clamps it): fc2.bias[4], the
# last of the MLP's 1125 parameters, reaches the optimizer infinite and the
# parameters check stops the run; the log point does not call it skipped
mlp="$tmp/mlp.ini"
{
	ini run threads=1
	ini data source=idx images=tr_cnn_images.idx labels=tr_cnn_labels.idx shuffle=0 workers=0
	ini_layers flat:flatten fc1:linear:out=16 r:relu fc2:linear:out=5 loss:softmax_xent
	ini train batch=8 max_steps=5 lr=0.1 momentum=0.9 log_every=1 eval=0
} > "$mlp"
KILN_NAN_VALUE=inf KILN_NAN_INDEX=1124 KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" \
	"$nan" 3 "$mlp" "$d" run.out_dir= train.skip_nonfinite=0 train.clip_value=1 > "$out" 2> "$err"
rc=$?
[ $rc = 1 ] || fail "train_nan with an inf gradient, skip_nonfinite = 0: exit $rc, expected 1"
stderr_has "train_nan: step 3 (epoch 1): parameter 'fc2.bias' holds 1 non-finite value(s) (NaN or inf): training diverged"
# ... and the padding after it: the norm is not finite, no parameter is
KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" "$nan" 3 "$mlp" "$d" run.out_dir="$tmp/o4" \
	train.skip_nonfinite=0 train.clip_value=1 > "$out" 2> "$err" || fail "train_nan into the padding: exit $?"
stderr_has "step 3: 1 step(s) of the last 1 had non-finite gradients, taken unclipped (skip_nonfinite = 0)"
! grep -q "skipped" "$err" || fail "skip_nonfinite = 0: a step reported skipped"
# ... nor does metrics.jsonl (before session 32 its "skipped" counted the
# taken step from step 3 on)
skips=$(grep '"event": *"train"' "$tmp/o4/metrics.jsonl" | sed -n 's/.*"skipped": *\([0-9]*\).*/\1/p' | tr '\n' ' ')
[ "$skips" = "0 0 0 0 0 " ] || fail "skip_nonfinite = 0: metrics.jsonl's skipped: '$skips', expected 0 at each step"

# 3
kiln 2 train "$ini" "$d" run.out_dir= run.precision=fp16 plugin.amp.growth_interval=16777217
stderr_has "command line 'plugin.amp.growth_interval=16777217': in [plugin.amp]: 'growth_interval' = 16777217 is out of range [1, 16777216]"
kiln 0 train "$ini" "$d" run.out_dir= run.precision=fp16 plugin.amp.growth_interval=16777216 train.max_steps=2

# 5: AdamW (and LAMB) with eps = 0 divide 0 by 0 where a gradient and its
# running square are 0, as torch.optim.AdamW(eps=0) does: a NaN update.
# 32 images of 2 x 2 whose first pixel is always 0, so fc.weight's first
# column never gets a gradient: after step 1 fc.weight holds 2 NaN (one a
# class), and the error names eps (before session 40: "lower [train] lr",
# which no lr changes: 0/0 is NaN at any rate); eps = 1e-8 trains
/usr/bin/python3 - "$tmp" <<'PY' || fail "cannot write the idx files"
import random, struct, sys
random.seed(3)
n = 32
px = bytes(b for _ in range(n) for b in [0] + [random.randrange(1, 256) for _ in range(3)])
open(sys.argv[1] + "/dead_images.idx", "wb").write(struct.pack(">IIII", 0x803, n, 2, 2) + px)
open(sys.argv[1] + "/dead_labels.idx", "wb").write(struct.pack(">II", 0x801, n) + bytes(i % 2 for i in range(n)))
PY
dead="$tmp/dead.ini"
{
	ini run threads=1
	ini data source=idx images=dead_images.idx labels=dead_labels.idx shuffle=0 workers=0
	linear_layers 2
	ini train optimizer=adamw batch=8 max_steps=3 lr=0.01 log_every=1 eval=0
} > "$dead"
for o in adamw lamb; do
	kiln 3 train "$dead" data.path="$tmp" run.out_dir= train.optimizer=$o train.eps=0
	stderr_has "error: step 1 (epoch 1): parameter 'fc.weight' holds 2 non-finite value(s) (NaN or inf): training diverged; [train] eps = 0: the update divides 0 by 0 where a gradient and its running square are 0 (a unit that never fires, an input that is always 0), which is NaN, as in PyTorch: set eps > 0 (PyTorch's default is 1e-8)"
	! grep -q "lower \[train\] lr" "$err" || fail "$o, eps = 0: told to lower the lr"
	kiln 0 train "$dead" data.path="$tmp" run.out_dir= train.optimizer=$o train.eps=1e-8
done
# SGD reads no eps: its divergence (4's infinite gradient) still names the lr
KILN_NAN_VALUE=inf KILN_NAN_INDEX=1124 KILN_PLUGIN_PATH="$abs_top_builddir/plugins/.libs" \
	"$nan" 3 "$mlp" "$d" run.out_dir= train.skip_nonfinite=0 train.eps=0 > "$out" 2> "$err"
rc=$?
[ $rc = 1 ] || fail "train_nan with an inf gradient, SGD, eps = 0: exit $rc, expected 1"
stderr_has "train_nan: step 3 (epoch 1): parameter 'fc2.bias' holds 1 non-finite value(s) (NaN or inf): training diverged; lower [train] lr"

# 6
kiln 0 train "$ini" "$d" run.out_dir= train.optimizer=lamb train.amsgrad=1 train.max_steps=2
stderr_has "command line 'train.amsgrad=1': [train] amsgrad is read by optimizer = adam or adamw, not by optimizer = lamb: ignored"

echo "PASS: $checks kiln runs"
