#!/bin/sh
# tests/onnx_export.sh - `kiln export --onnx` without ONNX Runtime: each
# exported model is parsed back with protobuf-c (tests/onnx_tool dump) and
#  1. the MLP, CNN and ResNet (channels-last) examples: IR version 8, opset
#     17, input [N, 1, 28, 28] f32, output logits [N, 10], exactly the
#     expected node ops in order, and every weight and batchnorm statistic
#     an initializer under its kiln/PyTorch name holding the same bytes as
#     `kiln export --safetensors` writes for the same model;
#  2. tests/data/gpt_tiny.ini (embedding, positions, layernorm, causal
#     attention, GELU, tied head): token input i32 [N, T], logits
#     [N, T, V], its ops, the tied weight once;
#     2b. tests/data/onnx_concat_last.ini and onnx_concat_seq.ini: concat
#     dim = -1 exported as Concat on the last axis (3 of NCHW, 2 of [B, T, H]);
#  3. a layer with no ONNX mapping (the example swish layer plugin, the
#     seq2seq example's lstm) fails
#     with exit 2 naming the layer, its type and its config line, and
#     writes no file; bad command lines exit 2;
#  4. `kiln export --onnx --quantized Q` of the CNN's INT8 model (QDQ):
#     QuantizeLinear/DequantizeLinear on each INT8 layer's input (u8 after
#     a ReLU, i8 on the raw image), DequantizeLinear on each int8 weight,
#     the node ops in order, and the int8 weights, their per-channel scales,
#     the input scales and the biases byte-identical to Q's tensors.
name=onnx_export
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
tool="$top_builddir/tests/onnx_tool"
ex="$srcdir/examples"

# export NAME INI [overrides]: $tmp/NAME.onnx and $tmp/NAME.safetensors,
# then the dump into $tmp/NAME.dump, its weights compared
export_both() {
	n=$1 ini=$2
	shift 2
	kiln 0 export "$ini" --onnx "$tmp/$n.onnx" run.out_dir="$tmp/run_$n" "$@"
	stderr_has "wrote $tmp/$n.onnx (ONNX, opset 17)"
	kiln 0 export "$ini" --safetensors "$tmp/$n.safetensors" run.out_dir="$tmp/run_$n" "$@"
	"$tool" dump "$tmp/$n.onnx" "$tmp/$n.safetensors" >"$tmp/$n.dump" ||
		{ cat "$tmp/$n.dump"; fail "$n: the ONNX initializers differ from kiln's weights"; }
}
# has NAME LINE: the dump of NAME has exactly this line
has() { grep -qxF -- "$2" "$tmp/$1.dump" || { cat "$tmp/$1.dump"; fail "$1: dump lacks: $2"; }; }

# ---- 1. MLP, CNN, ResNet ----------------------------------------------------
export_both mlp "$ex/fashion_mnist_mlp.ini"
has mlp "ir 8 opset 17 producer kiln"
has mlp "input input f32 N,1,28,28"
has mlp "output logits f32 N,10"
has mlp "ops Flatten Gemm Relu Gemm Relu Gemm Identity"
has mlp "init fc1.weight f32 512,784"
has mlp "weights 6 equal"
echo "ok: MLP graph, shapes and weights"

export_both cnn "$ex/fashion_mnist_cnn.ini"
has cnn "ops Conv Relu MaxPool Conv Relu MaxPool Flatten Gemm Relu Gemm Identity"
has cnn "init conv1.weight f32 32,1,5,5"
has cnn "init fc1.weight f32 1024,3136"
has cnn "weights 8 equal"
echo "ok: CNN graph (dropout removed), shapes and weights"

block="Conv BatchNormalization Relu Conv BatchNormalization"
export_both resnet "$ex/fashion_mnist_resnet.ini"
has resnet "input input f32 N,1,28,28"
has resnet "output logits f32 N,10"
has resnet "ops Conv BatchNormalization Relu $block Add Relu $block Conv BatchNormalization Add Relu $block Conv BatchNormalization Add Relu GlobalAveragePool Flatten Gemm Identity"
has resnet "init s2_down.weight f32 32,16,1,1"
has resnet "init s3_bn2.running_var f32 64"
# 9 convolutions, 9 batchnorms of 4 tensors each, fc weight and bias
has resnet "weights 47 equal"
echo "ok: ResNet (trained channels-last) exported NCHW, batchnorm statistics included"

# ---- 2. a GPT-2 style transformer (tests/data/gpt_tiny.ini) ---------------------
export_both gpt "$srcdir/tests/data/gpt_tiny.ini" data.path="$srcdir/tests/data/gpt_tokens.bin" \
	model.init_from="$srcdir/tests/data/gpt_init.safetensors"
has gpt "input input i32 N,13"
has gpt "output logits f32 N,13,64"
attn="Reshape Transpose Gather Gather Gather Transpose MatMul Mul Where Softmax MatMul Transpose Reshape"
gelu="Mul Mul Mul Add Mul Tanh Add Mul Mul"
lin="Transpose MatMul Add"
blk="LayerNormalization $lin $attn $lin Add LayerNormalization $lin $gelu $lin Add"
has gpt "ops Gather Slice Add $blk $blk LayerNormalization Transpose MatMul Identity"
has gpt "init transformer.wte.weight f32 64,32"
has gpt "init transformer.h.0.attn.sdpa/causal_mask bool 13,13"
! grep -q "^init lm_head.weight" "$tmp/gpt.dump" || fail "the tied head is written twice"
echo "ok: transformer graph: Gather, Slice, LayerNormalization, causal attention, GELU, tied head"

# ---- 2b. concat along the last dimension (dim = -1) ---------------------------
# Concat's axis is the last of the exported NCHW tensor's (3) in both
# layouts, and of [B, T, H] (2); not 1, what the export wrote for every
# concat before session 31 (ONNX Runtime then concatenated the channels of
# the 4-d model and refused the 3-d one)
for lay in nchw nhwc; do
	export_both cat_$lay "$srcdir/tests/data/onnx_concat_last.ini" model.layout=$lay
	has cat_$lay "ops Conv Conv Tanh Concat MaxPool Flatten Gemm Identity"
	has cat_$lay "attr cat Concat axis 3"
done
export_both cat_seq "$srcdir/tests/data/onnx_concat_seq.ini" data.path="$srcdir/tests/data/gpt_tokens.bin"
has cat_seq "output logits f32 N,13,64"
has cat_seq "attr cat Concat axis 2"
echo "ok: concat dim = -1: Concat on the last axis of [N, C, H, W] (both layouts) and [B, T, H]"

# ---- 3. no mapping, bad command lines ----------------------------------------
mkdir -p "$tmp/plugins"
${CC:-cc} -shared -fPIC -I"$srcdir/include" -I"$top_builddir/include" \
	-o "$tmp/plugins/kiln-swish.so" "$srcdir/examples/plugins/swish.c" ||
	fail "building examples/plugins/swish.c failed"
cat >"$tmp/swish.ini" <<INI
[run]
device = cpu
[data]
source = synthetic
image_size = 4
[layer.fc1]
type = linear
out = 6
[layer.act]
type = swish
[layer.fc2]
type = linear
out = 4
[layer.loss]
type = softmax_xent
INI
KILN_PLUGIN_PATH="$tmp/plugins"
export KILN_PLUGIN_PATH
kiln 2 export "$tmp/swish.ini" --onnx "$tmp/swish.onnx" run.out_dir="$tmp/none"
stderr_has "swish.ini:10: layer 'act' (type swish) has no ONNX mapping"
[ ! -e "$tmp/swish.onnx" ] || fail "a failed export left $tmp/swish.onnx"
unset KILN_PLUGIN_PATH
# the built-in recurrent layers have no mapping either (docs/inference.md)
kiln 2 export "$ex/seq2seq.ini" --onnx "$tmp/s2s.onnx" run.out_dir="$tmp/none"
stderr_has "seq2seq.ini:45: layer 'enc.fwd' (type lstm) has no ONNX mapping"
[ ! -e "$tmp/s2s.onnx" ] || fail "a failed export left $tmp/s2s.onnx"
kiln 2 export "$ex/fashion_mnist_mlp.ini" --onnx "$tmp/a.onnx" --safetensors "$tmp/a.st"
stderr_has "give one of --safetensors FILE and --onnx FILE"
kiln 2 export "$ex/fashion_mnist_mlp.ini" --onnx
echo "ok: an unmapped layer fails naming it and its line; bad command lines exit 2"

# ---- 4. a quantized model in the QDQ format ------------------------------------
cnn="$ex/fashion_mnist_cnn.ini"
qrun="run.out_dir=$tmp/run_q"
kiln 0 train "$cnn" $qrun train.max_steps=3 train.batch=16 train.eval=0 run.threads=2
kiln 0 quantize "$cnn" $qrun --calibrate 1 --method minmax --out "$tmp/q.safetensors" data.eval.split=train
kiln 0 export "$cnn" $qrun --onnx "$tmp/q.onnx" --quantized "$tmp/q.safetensors"
stderr_has "wrote $tmp/q.onnx (ONNX QDQ INT8, opset 17)"
"$tool" dump "$tmp/q.onnx" "$tmp/q.safetensors" >"$tmp/q.dump" ||
	{ cat "$tmp/q.dump"; fail "q: the QDQ initializers differ from the quantized file's"; }
qdq="QuantizeLinear DequantizeLinear DequantizeLinear"
has q "ir 8 opset 17 producer kiln"
# conv1 (1 input channel) stays f32: `kiln quantize` keeps convs with
# fewer than 4 input channels per group in f32 (docs/inference.md)
has q "ops Conv Relu MaxPool $qdq Conv Relu MaxPool Flatten $qdq Gemm Relu $qdq Gemm Identity"
has q "init conv1.weight f32 32,1,5,5"
! grep -q "^init conv1.weight_scale" "$tmp/q.dump" || fail "q: the f32 conv1 has a weight scale"
has q "init conv2.weight i8 64,32,5,5"
has q "init conv2.weight_scale f32 64"
has q "init conv2.weight_zero_point i8 64"
has q "init conv2.input_scale f32"
has q "init conv2/input_zero_point u8"
has q "init fc2.weight i8 10,1024"
# 3 INT8 layers: i8 weight, weight scale, input scale, bias; conv1: weight, bias
has q "weights 14 equal"
kiln 2 export "$cnn" --onnx "$tmp/q2.onnx" --quantized "$tmp/q.safetensors" --checkpoint "$tmp/q.safetensors"
stderr_has "--quantized Q goes with --onnx FILE and no --checkpoint"
echo "ok: QDQ export: Q/DQ around each INT8 layer, per-channel int8 weights equal to the file's"
echo "PASS"
