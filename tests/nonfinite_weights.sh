#!/bin/sh
# tests/nonfinite_weights.sh - NaN or inf weights are never trained on,
# checkpointed or evaluated silently (session 30).  A linear + ReLU runs
# fused ([run] fuse = auto: oneDNN's eltwise_relu post-op), whose
# max(NaN, 0) is 0, so a NaN weight need not make the loss NaN; before
# session 30 such runs exited 0 and evaluations reported an accuracy.
#  1. AdamW with eps = 0 computes 0/0 for the weights of an input pixel
#     that is 0 in every sample of the first batch: the log point after
#     step 1 names the tensor and how many of its values are not finite,
#     exit 3 (before: exit 0, the NaN in every checkpoint), and eps = 0 as
#     the cause (before session 40: "lower [train] lr");
#  2. a run whose parameters overflow at step 2 (lr 1e6 on inputs scaled
#     by 1e10, skip_nonfinite = 0) between log points: the checkpoint of
#     step 2 is refused and step 1's stays the newest (before: checkpoints
#     of steps 3-5 holding NaN, the run failing at step 6 on the loss);
#  3. a checkpoint holding a NaN (ckpt_tool nan): eval, eval --fold,
#     export and --resume refuse it naming the file and the tensor, exit 3
#     (before: eval gave the clean checkpoint's accuracy);
#  4. a safetensors file holding a NaN: eval and [model] init_from
#     refuse it the same way (before: init_from trained, exit 0);
#  5. a forward that overflows on one batch: batchnorm's running
#     statistics are checked too (session 31);
#  6. the same with the batchnorm on stage 1 of a pipeline on 2 ranks
#     (kiln-gloo; session 32);
#  7. a negative running variance (finite, but batchnorm takes its
#     square root) in a weights file or a checkpoint: eval, init_from and
#     --resume refuse it naming the tensor and element (before: exit 0,
#     the eval's loss NaN; session 35);
#  8. an evaluation whose loss is not finite (the eval set normalised by
#     std 1e-12 and mean -1e26: inputs of 1e38): eval's and train's stdout
#     line is JSON, the loss null (before session 36 a bare inf or -nan).
name=nonfinite
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
data="$srcdir/tests/data"
need_source idx

# tr_cnn's images with pixel 0 of every sample set to 0 (for 1)
python3 - "$data/tr_cnn_images.idx" "$tmp/zero0.idx" <<'EOF' || fail "python3 could not write the file"
import sys
b = bytearray(open(sys.argv[1], "rb").read())
for i in range(48):
    b[16 + 64 * i] = 0
open(sys.argv[2], "wb").write(b)
EOF
ini="$tmp/mlp.ini"
{
	ini run threads=1
	ini_tr_cnn_mlp "$data" 8
	ini train batch=8 epochs=1 max_steps=5 log_every=5 checkpoint_every=1
} >"$ini"

# 1
kiln 3 train "$ini" "data.images=$tmp/zero0.idx" train.optimizer=adamw train.lr=0.01 \
	train.eps=0 run.fuse=auto "run.out_dir=$tmp/adam"
stderr_has "error: step 1 (epoch 1): parameter 'fc1.weight' holds 71 non-finite value(s) (NaN or inf): training diverged; [train] eps = 0: the update divides 0 by 0 where a gradient and its running square are 0"
[ -z "$(ls "$tmp/adam/checkpoints" 2>/dev/null)" ] || fail "a checkpoint was written: $(ls "$tmp/adam/checkpoints")"

# 2
kiln 3 train "$ini" train.optimizer=sgd train.momentum=0 train.lr=1e6 data.std=1e-10 \
	train.skip_nonfinite=0 "run.out_dir=$tmp/big"
grep -qE "error: step 2 \(epoch 1\): parameter 'fc1.weight' holds [0-9]+ non-finite value\(s\) \(NaN or inf\): training diverged" "$err" ||
	fail "the run did not fail at step 2 naming fc1.weight"
[ "$(ls "$tmp/big/checkpoints")" = ckpt-1.kiln ] ||
	fail "checkpoints $(ls "$tmp/big/checkpoints" | tr '\n' ' '), expected ckpt-1.kiln alone"
kiln 0 eval "$ini" --checkpoint "$(ck big 1)"

# 3
cp "$(ck big 1)" "$tmp/nan.kiln"
"$top_builddir/tests/ckpt_tool" nan "$tmp/nan.kiln" params 3 || fail "ckpt_tool nan failed"
refused="$tmp/nan.kiln: tensor 'fc1.weight' f32[8, 64] holds a non-finite value (nan at element 3): refused"
kiln 3 eval "$ini" --checkpoint "$tmp/nan.kiln"
stderr_has "checkpoint $refused"
kiln 3 eval "$ini" --checkpoint "$tmp/nan.kiln" --fold
stderr_has "checkpoint $refused"
kiln 3 export "$ini" --checkpoint "$tmp/nan.kiln" --safetensors "$tmp/nan-export.st"
stderr_has "checkpoint $refused"
mkdir -p "$tmp/res/checkpoints"
cp "$tmp/nan.kiln" "$tmp/res/checkpoints/ckpt-1.kiln"
kiln 3 train "$ini" train.optimizer=sgd train.momentum=0 train.lr=1e6 data.std=1e-10 \
	train.skip_nonfinite=0 "run.out_dir=$tmp/res" --resume
stderr_has "checkpoint $tmp/res/checkpoints/ckpt-1.kiln: tensor 'fc1.weight' f32[8, 64] holds a non-finite value (nan at element 3): refused"

# 4: the clean checkpoint's weights as safetensors, fc1.weight[0, 0] NaN
# (rewritten without kiln.crc32c, as a tool that changes kiln's file must:
# the CRCs would refuse it first; tests/st_mut.py)
kiln 0 export "$ini" --checkpoint "$(ck big 1)" --safetensors "$tmp/w.st"
st_mut "$tmp/w.st" "$tmp/w.st" old
python3 - "$tmp/w.st" <<'EOF' || fail "python3 could not rewrite the file"
import st, struct, sys
f = st.load(sys.argv[1])
b, at = bytearray(f.raw), f.span("fc1.weight")[0]
b[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(b)
EOF
refused="tensor 'fc1.weight' f32[8, 64] holds a non-finite value (nan at element 0): refused"
kiln 3 eval "$ini" --checkpoint "$tmp/w.st"
# (a safetensors file, its header parsed: that format's error alone; before
# session 41 "not a kiln checkpoint, and as a weights file (...): $refused")
stderr_has "kiln: error: $tmp/w.st: $refused"
! grep -q "not a kiln checkpoint" "$err" || fail "a safetensors file was said to be no kiln checkpoint: $(grep error "$err")"
kiln 3 train "$ini" "model.init_from=$tmp/w.st" run.fuse=auto "run.out_dir=$tmp/init"
stderr_has "$refused"
# 5: a batch whose forward overflows (sample 20 bright, fc1's weights 1e37:
# its rows are inf) leaves the parameters finite (skip_nonfinite skips the
# step) but bn1's running statistics not: the check before step 3's
# checkpoint names them, exit 3 (before: the run went on, its checkpoints
# and every evaluation after step 3 holding inf and NaN statistics)
python3 - "$data/tr_cnn_images.idx" "$tmp/bright.idx" "$tmp/big.st" <<'EOF' || fail "python3 could not write the files"
import st, sys
b = bytearray(open(sys.argv[1], "rb").read())
for i in range(48):
    b[16 + 64 * i:16 + 64 * (i + 1)] = bytes([255 if i == 20 else 0]) * 64
open(sys.argv[2], "wb").write(b)
st.write(sys.argv[3], {"fc1.weight": ([8, 64], [1e37] * 512)})
EOF
sed 's/^\[layer.relu1\]$/[layer.bn1]\ntype = batchnorm\n&/' "$ini" > "$tmp/bn.ini"
grep -q '^type = batchnorm$' "$tmp/bn.ini" || fail "no batchnorm in $tmp/bn.ini"
kiln 3 train "$tmp/bn.ini" "data.images=$tmp/bright.idx" data.mean=0 data.std=1 \
	"model.init_from=$tmp/big.st" model.init_strict=0 "run.out_dir=$tmp/bn"
stderr_has "error: step 3 (epoch 1): running statistic 'bn1.running_mean' holds 8 non-finite value(s) (NaN or inf): a forward pass overflowed"
[ "$(ls "$tmp/bn/checkpoints" | tr '\n' ' ')" = "ckpt-1.kiln ckpt-2.kiln " ] ||
	fail "checkpoints $(ls "$tmp/bn/checkpoints" | tr '\n' ' '), expected those of steps 1 and 2"
# 6: the same on a pipeline of 2 stages on 2 ranks, bn1 on stage 1: its
# rank holds its stage alone and checks the statistics too (before
# session 32 it did not: the run exited 0 with a test loss of NaN, its
# checkpoints of steps 3-5 rotating those of steps 1 and 2 out)
if [ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ]; then
	printf '[model]\nstages = flat, fc1 | bn1, loss\n[dist]\npipeline = 2\ntimeout = 60\n' >> "$tmp/bn.ini"
	timeout 120 "$abs_top_builddir/kiln" launch -n 2 -- "$abs_top_builddir/kiln" train "$tmp/bn.ini" \
		"data.images=$tmp/bright.idx" data.mean=0 data.std=1 "model.init_from=$tmp/big.st" \
		model.init_strict=0 "run.out_dir=$tmp/bnpipe" > "$tmp/bnpipe.log" 2>&1
	rc=$?
	[ "$rc" = 3 ] || fail "the 2-stage run on ranks exited $rc, expected 3: $(grep error "$tmp/bnpipe.log")"
	grep -q "^kiln: error: step 3 (epoch 1): running statistic 'bn1.running_mean' holds 8 non-finite value(s)" "$tmp/bnpipe.log" ||
		fail "the 2-stage run on ranks: stage 1's rank does not name bn1's statistics"
	grep -q "^kiln: error: step 3 (epoch 1): the parameters or batchnorm running statistics of 1 other rank(s) hold non-finite values" "$tmp/bnpipe.log" ||
		fail "the 2-stage run on ranks: stage 0's rank does not name the other rank"
	[ "$(ls "$tmp/bnpipe/checkpoints" | tr '\n' ' ')" = "ckpt-1.kiln ckpt-2.kiln " ] ||
		fail "2 stages on ranks: checkpoints $(ls "$tmp/bnpipe/checkpoints" | tr '\n' ' '), expected those of steps 1 and 2"
else
	echo "no kiln-gloo.so: case 6 (2 stages on ranks) not run"
fi

# 7: bn1.running_var[2] = -1 (buffers element 16 + 2: each tensor starts
# on 64 bytes), in a checkpoint and in its weights as safetensors; bn.ini
# without case 6's pipeline
sed '/^\[model\]$/,$d' "$tmp/bn.ini" > "$tmp/bn1.ini"
kiln 0 train "$tmp/bn1.ini" train.max_steps=1 "run.out_dir=$tmp/neg"
cp "$(ck neg 1)" "$tmp/negvar.kiln"
"$top_builddir/tests/ckpt_tool" set "$tmp/negvar.kiln" buffers 18 -1 || fail "ckpt_tool set failed"
refused="tensor 'bn1.running_var' f32[8] holds a negative variance (-1 at element 2): refused (its square root is NaN: every output of the layer would be NaN)"
kiln 3 eval "$tmp/bn1.ini" --checkpoint "$tmp/negvar.kiln"
stderr_has "checkpoint $tmp/negvar.kiln: $refused"
mkdir -p "$tmp/negres/checkpoints"
cp "$tmp/negvar.kiln" "$tmp/negres/checkpoints/ckpt-1.kiln"
kiln 3 train "$tmp/bn1.ini" train.max_steps=2 "run.out_dir=$tmp/negres" --resume
stderr_has "checkpoint $tmp/negres/checkpoints/ckpt-1.kiln: $refused"
kiln 0 export "$tmp/bn1.ini" --checkpoint "$(ck neg 1)" --safetensors "$tmp/neg.st"
st_mut "$tmp/neg.st" "$tmp/neg.st" old
python3 - "$tmp/neg.st" <<'EOF' || fail "python3 could not rewrite the file"
import st, struct, sys
f = st.load(sys.argv[1])
b, at = bytearray(f.raw), f.span("bn1.running_var")[0]
b[at + 8:at + 12] = struct.pack("<f", -1.0)
open(sys.argv[1], "wb").write(b)
EOF
kiln 3 eval "$tmp/bn1.ini" --checkpoint "$tmp/neg.st"
stderr_has "kiln: error: $tmp/neg.st: $refused"
kiln 3 train "$tmp/bn1.ini" "model.init_from=$tmp/neg.st" "run.out_dir=$tmp/neginit"
stderr_has "$tmp/neg.st: $refused"

# ---- 8. a non-finite evaluation loss in the stdout JSON -----------------------
# json_line: stdout's last line is strict JSON (no NaN, Infinity) whose
# test_loss is null
json_line() {
	tail -1 "$out" | python3 -c '
import json, sys
def bad(c): raise ValueError("not JSON: " + c)
o = json.loads(sys.stdin.read(), parse_constant=bad)
assert o["test_loss"] is None, o["test_loss"]
' || { cat "$out"; fail "$1: stdout is not JSON with test_loss null"; }
}
# (tr_cnn: its convolution and batchnorm carry the 1e38 inputs to an
# infinite loss, where this file's MLP's ReLU zeroes them)
hostile="data.eval.std=1e-12 data.eval.mean=-1e26"
cnn="$data/tr_cnn.ini data.path=$data model.init_from=$data/tr_cnn_init.safetensors"
kiln 0 train $cnn "run.out_dir=$tmp/inf" $hostile
json_line train
stdout_has '"test_loss": null, '
kiln 0 eval $cnn --checkpoint "$(ck inf 5)" $hostile
json_line eval
stdout_has '"test_loss": null, '
echo "ok: a non-finite evaluation loss is null in train's and eval's JSON"
echo "PASS: $checks runs"
