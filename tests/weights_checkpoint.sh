#!/bin/sh
# tests/weights_checkpoint.sh - `--checkpoint F` of a weights file
# (safetensors) in kiln eval, export and predict, as the C API takes one; a
# [data.eval] sample shape that is not the checkpoint's model's is warned
# of by kiln eval, which evaluates [data.eval]'s ([data] is not opened:
# the checkpoint's shape is used, since session 38).
#
# Before session 29 `kiln eval` and `kiln export` refused a safetensors
# --checkpoint ("not a kiln checkpoint (no KILNCKPT magic)") while `kiln
# predict` took one, and eval, export and predict took another image size
# than the checkpoint's without a word (`kiln generate` alone warned, of
# [data] context).  A small conv net with global pooling (which runs at any
# image size) trains 2 steps on 16x16 synthetic images; its weights exported
# to safetensors evaluate, fold, export and predict exactly as the
# checkpoint's.  (kiln generate: tests/generate.sh.)
name=wckpt
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
ini="$tmp/run.ini"
{
	ini run seed=3 threads=1 out_dir="$tmp/run"
	ini_synthetic 64 16 4 workers=0
	ini data.eval samples=64
	ini_layers c1:conv:out=4:kernel=3:padding=1 b1:batchnorm r:relu g:global_avgpool f:flatten \
		fc:linear:out=4 loss:softmax_xent
	ini train epochs=1 max_steps=2 batch=16
} > "$ini"
kiln 0 train "$ini"
ck="$tmp/run/checkpoints/ckpt-2.kiln"
w="$tmp/w.safetensors"
kiln 0 export "$ini" --safetensors "$w"

# eval: the same numbers as the checkpoint's, step -1
kiln 0 eval "$ini"
loss=$(field test_loss "$out")
kiln 0 eval "$ini" --checkpoint "$w"
stdout_has "{\"checkpoint\": \"$w\", \"step\": -1, \"test_loss\": $loss,"
stderr_has "(64 samples; the weights of $w)"
kiln 0 eval "$ini" --fold
floss=$(field test_loss "$out")
kiln 0 eval "$ini" --fold --checkpoint "$w"
stdout_has "\"test_loss\": $floss,"

# export: the same files
kiln 0 export "$ini" --checkpoint "$w" --safetensors "$tmp/w2.safetensors"
cmp -s "$w" "$tmp/w2.safetensors" || fail "export --checkpoint W --safetensors differs from W"
kiln 0 export "$ini" --checkpoint "$ck" --onnx "$tmp/ck.onnx"
kiln 0 export "$ini" --checkpoint "$w" --onnx "$tmp/w.onnx"
cmp -s "$tmp/ck.onnx" "$tmp/w.onnx" || fail "export --onnx of W differs from the checkpoint's"

# predict (took one already): the same lines
kiln 0 predict "$ini" --checkpoint "$ck" --eval-set
cp "$out" "$tmp/ck.pred"
kiln 0 predict "$ini" --checkpoint "$w" --eval-set
cmp -s "$out" "$tmp/ck.pred" || fail "predict with W differs from the checkpoint's"

# a file that is neither: named as such
printf 'not a checkpoint\n' > "$tmp/junk.kiln"
kiln 3 eval "$ini" --checkpoint "$tmp/junk.kiln"
stderr_has "$tmp/junk.kiln: not a kiln checkpoint, and as a weights file (safetensors, llm.c's model file): "
kiln 3 export "$ini" --checkpoint "$tmp/junk.kiln" --onnx "$tmp/j.onnx"
stderr_has "$tmp/junk.kiln: not a kiln checkpoint, and as a weights file"

# another image size than the checkpoint's: the checkpoint's is used;
# [data] is not opened to compare (since session 38: before, export,
# predict and generate warned "[data] gives samples of f32[1, 20, 20], the
# checkpoint's model was trained on f32[1, 16, 16]: the checkpoint's are
# used, [data]'s are not", reading the whole training set for it;
# tests/trained_no_data.sh); kiln eval warns of [data.eval]'s, which it reads
kiln 0 export "$ini" --onnx "$tmp/20.onnx" data.image_size=20
! grep -q "the checkpoint's model was trained on" "$err" || fail "a warning from [data], which is not read"
cmp -s "$tmp/ck.onnx" "$tmp/20.onnx" || fail "export with data.image_size=20 did not export the checkpoint's shape"
kiln 0 predict "$ini" --eval-set data.image_size=20 data.eval.image_size=16
! grep -q "the checkpoint's model was trained on" "$err" || fail "a warning from [data], which is not read"
kiln 0 eval "$ini" data.image_size=20
stderr_has "[core] warning: [data.eval] gives samples of f32[1, 20, 20], the checkpoint's model was trained on f32[1, 16, 16]: [data.eval]'s are used"
# the same shape: no warning
kiln 0 eval "$ini"
! grep -q "the checkpoint's model was trained on" "$err" || fail "a warning with the checkpoint's shape"
kiln 0 export "$ini" --onnx "$tmp/16.onnx"
! grep -q "the checkpoint's model was trained on" "$err" || fail "a warning with the checkpoint's shape"
echo "$checks checks passed"
echo "PASS"
