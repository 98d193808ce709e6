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
#
# Session 42: the same for a checkpoint as [model] init_from (its
# config's sections); kiln.layers as session 41 wrote it (with its unset
# keys, since left out) compared as before.
#
# Session 41: W's recorded [layer.*] sections against another config (a
# batchnorm eps, an activation: warned of, key by key, never refused;
# keys no inference reads and a dropout layer not; a shape's error first;
# an older kiln's config_hash warned of; PyTorch's file as before); a
# safetensors file's own error, not "not a kiln checkpoint"; the export of
# [model] init_from a note, not a warning.
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

# ---- the model a weights file was exported from (session 41) ----------------
# W records the [layer.*] sections it was exported from (metadata
# kiln.layers).  A key that keeps every shape but changes what the weights
# compute (batchnorm's eps here; attention heads, an activation) is warned
# of, a line naming the layer, key and both values, for --checkpoint W and
# [model] init_from alike; the weights load all the same (exit 0) and
# evaluate to another loss.  Never refused: many such keys change nothing
# an inference computes (a review of session 41's first form, which
# refused them with exit 2).
kiln 0 eval "$ini" --checkpoint "$w" layer.b1.eps=0.1
stderr_has "[core] warning: $w was exported from another model (metadata kiln.layers records its [layer.*] sections): its weights loaded, but may compute another function here"
stderr_has "[core] warning: $w: [layer.b1] eps is '1e-05' in the file but '0.1' here"
eloss=$(field test_loss "$out")
[ "$eloss" != "$loss" ] || fail "eps = 0.1 evaluated to the file's own loss $loss: the warning above proves nothing"
echo "ok: eps = 0.1 evaluates W to $eloss, its own config to $loss"
kiln 0 predict "$ini" --eval-set "run.out_dir=$tmp/none" "model.init_from=$w" layer.b1.eps=0.1
stderr_has "[core] warning: $w: [layer.b1] eps is '1e-05' in the file but '0.1' here"
# the checkpoint itself as [model] init_from: its config's [layer.*]
# sections compared as W's (session 42: before, never), no warning for
# its own config nor for the keys no inference reads
for k in "" layer.b1.momentum=0.2 layer.b1.input=c1 layer.c1.bias=0 layer.r.inplace=0; do
	kiln 0 predict "$ini" --eval-set "run.out_dir=$tmp/none" "model.init_from=$ck" $k
	cmp -s "$out" "$tmp/ck.pred" || fail "$k: predict with init_from CK differs from --checkpoint CK"
	! grep -q "warning" "$err" || fail "$k: init_from CK warned: $(grep warning "$err")"
done
kiln 0 predict "$ini" --eval-set "run.out_dir=$tmp/none" "model.init_from=$ck" layer.b1.eps=0.1
stderr_has "[core] warning: $ck was trained with another model (its config records its [layer.*] sections): its weights loaded"
stderr_has "[core] warning: $ck: [layer.b1] eps is '"
stderr_has "' in the file but '0.1' here"
# several keys: one line each (an activation too)
kiln 0 eval "$ini" --checkpoint "$w" layer.b1.eps=0.1 layer.r.type=tanh
stderr_has "[core] warning: $w: [layer.b1] eps is '1e-05' in the file but '0.1' here"
stderr_has "[core] warning: $w: [layer.r] type is 'relu' in the file but 'tanh' here"
# keys that change no inference result, or equal their computed default:
# W's own loss (but where the loss itself is another: label smoothing,
# an ignored class), no warning (the first form refused each, exit 2)
for k in layer.b1.momentum=0.2 layer.fc.trainable=0 layer.loss.label_smoothing=0.1 \
	layer.loss.ignore_index=3 layer.b1.input=c1 layer.c1.bias=0 layer.loss.classes=4 \
	layer.b1.eps=0.00001 layer.r.inplace=0; do
	kiln 0 eval "$ini" --checkpoint "$w" $k
	! grep -q "warning" "$err" || fail "$k: a warning: $(grep warning "$err")"
	case $k in *label_smoothing* | *ignore_index*) ;; *) stdout_has "\"test_loss\": $loss," ;; esac
done
# a dropout layer (identity at inference) left out of the config, or added
dini="$tmp/drop.ini"
sed 's/^\[layer.g\]$/[layer.d]\ntype = dropout\np = 0.1\n[layer.g]/' "$ini" > "$dini"
grep -q "^type = dropout" "$dini" || fail "no dropout layer in $dini"
kiln 0 export "$dini" --checkpoint "$w" --safetensors "$tmp/wd.safetensors"
! grep -q "warning" "$err" || fail "a dropout layer added: a warning: $(grep warning "$err")"
kiln 0 eval "$ini" --checkpoint "$tmp/wd.safetensors"
stdout_has "\"test_loss\": $loss,"
! grep -q "warning" "$err" || fail "a dropout layer left out: a warning: $(grep warning "$err")"
# a key that changes a shape: the tensors' error first, naming the shapes
# (a safetensors file whose header parsed: its error alone; before session
# 41 "not a kiln checkpoint, and as a weights file (safetensors, llm.c's
# model file): 2 tensor(s) do not fit ...", though its kind was known)
for s in 1 0; do
	kiln 2 eval "$ini" --checkpoint "$w" layer.fc.out=5 model.init_strict=$s
	stderr_has "kiln: error: $w: 2 tensor(s) do not fit the model: fc.weight is [4, 4] in the file but [5, 4] in the model, fc.bias is [4] in the file but [5] in the model"
	! grep -q "not a kiln checkpoint\|kiln.layers" "$err" || fail "init_strict = $s: $(grep "error\|warning" "$err")"
done
if command -v python3 >/dev/null; then
	# W as a kiln before session 41 wrote it (config_hash, no kiln.layers):
	# a hash that differs is warned of; and as PyTorch writes it (no
	# metadata): loaded as before, nothing to compare
	python3 - "$w" "$tmp/old.safetensors" "$tmp/pt.safetensors" <<'EOF' || fail "python3 could not rewrite W"
import st, sys
def older(h, meta, data):
    # a kiln before session 41 wrote neither kiln.layers nor kiln.crc32c
    del meta["kiln.layers"], meta["kiln.crc32c"]
def pytorch(h, meta, data):
    meta.clear()
st.rewrite(sys.argv[1], sys.argv[2], older)
st.rewrite(sys.argv[1], sys.argv[3], pytorch)
EOF
	kiln 0 eval "$ini" --checkpoint "$tmp/old.safetensors"
	stdout_has "\"test_loss\": $loss,"
	! grep -q "warning" "$err" || fail "a warning for the config W was exported from: $(grep warning "$err")"
	kiln 0 eval "$ini" --checkpoint "$tmp/old.safetensors" layer.b1.eps=0.1
	stderr_has "[core] warning: $tmp/old.safetensors: its config_hash "
	stderr_has "A kiln before session 41 wrote it, which did not record the sections: export it again to have them checked"
	kiln 0 eval "$ini" --checkpoint "$tmp/pt.safetensors" layer.b1.eps=0.1
	stdout_has "\"test_loss\": $eloss,"
	! grep -q "warning" "$err" || fail "a warning for a file without kiln's metadata: $(grep warning "$err")"
	# W as session 41 wrote it: kiln.layers with a "; key = (unset)" line
	# for each key left unset (since session 42 left out, a key the text
	# lacks read as unset), here the sections as `kiln config` prints
	# them: compared as before, no warning for its own config nor for a
	# key set to the value its unset default computes, eps = 0.1 named
	kiln 0 config "$ini"
	awk '/^\[/ { p = /^\[layer\./ } p' "$out" >"$tmp/s41.layers"
	grep -q "^; .* = (unset)$" "$tmp/s41.layers" || fail "kiln config printed no unset key: $(cat "$tmp/s41.layers")"
	python3 - "$w" "$tmp/s41.safetensors" "$tmp/s41.layers" <<'EOF' || fail "python3 could not rewrite W"
import st, sys
text = open(sys.argv[3]).read()
def s41(h, meta, data):
    assert "(unset)" not in meta["kiln.layers"], "kiln.layers holds unset keys"
    meta["kiln.layers"] = text
    del meta["kiln.crc32c"]
st.rewrite(sys.argv[1], sys.argv[2], s41)
EOF
	for k in "" layer.b1.input=c1 layer.c1.bias=0 layer.loss.classes=4; do
		kiln 0 eval "$ini" --checkpoint "$tmp/s41.safetensors" $k
		stdout_has "\"test_loss\": $loss,"
		! grep -q "warning" "$err" || fail "$k: a warning for session 41's kiln.layers: $(grep warning "$err")"
	done
	kiln 0 eval "$ini" --checkpoint "$tmp/s41.safetensors" layer.b1.eps=0.1
	stderr_has "[core] warning: $tmp/s41.safetensors: [layer.b1] eps is '"
	[ "$(grep -c "warning: $tmp/s41.safetensors: \[layer" "$err")" -eq 1 ] ||
		fail "not one key named: $(grep warning "$err")"
else
	echo "skip: no python3 to write W as an older kiln and PyTorch would"
fi

# [model] init_from exported without a checkpoint: a note saying what is
# exported and how to export trained weights (before session 41 a warning,
# "exporting the initial weights ([run] seed, then [model] init_from), not
# trained ones"); its weights are W's, byte for byte
kiln 0 export "$ini" "run.out_dir=$tmp/none" "model.init_from=$w" --safetensors "$tmp/w3.safetensors"
stderr_has "[core] no checkpoint in $tmp/none/checkpoints: exporting the weights of [model] init_from $w (a run's trained weights: --checkpoint CKPT, or train first)"
! grep -q "warning" "$err" || fail "export of [model] init_from warned: $(grep warning "$err")"
cmp -s "$w" "$tmp/w3.safetensors" || fail "export of [model] init_from W differs from W"
kiln 0 export "$ini" "run.out_dir=$tmp/none" --safetensors "$tmp/w4.safetensors"
stderr_has "[core] warning: no checkpoint in $tmp/none/checkpoints: exporting the initial weights ([run] seed), not trained ones (give --checkpoint CKPT, or train first)"

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
