#!/bin/sh
# tests/infer_wreorder.sh - the CPU device's kept convolution weights
# ([plugin.cpu] keep_weights, plugins/cpu/conv.c and dnn.c; issue 23,
# docs/PERFORMANCE.md "Session 13: inference weights reordered once").
#
# tests/data/tr_cnn.ini's conv (4x1x3x3 weights, which oneDNN's kernel
# wants blocked) under `kiln predict --eval-set` in blocks of 4 rows
# ([run] infer_block = 4: 48 samples, 12 plan runs), counted from
# ONEDNN_VERBOSE's exec lines:
#  1. keep_weights = 0 reorders the weights on every run (a reorder per
#     convolution); the default reorders them once in the whole call, and
#     its logits are the same bytes;
#  2. training with evaluations every 2 steps (the evaluation's CONV keeps
#     its weights, which change between evaluations: the kept copy must be
#     made again) logs the same losses with and without kept weights.
name=infer_wreorder
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors plugin.cpu.tune_cache=$tmp/tune.bin"

# predict KEEP: the logits into $tmp/lKEEP.npy, oneDNN's exec lines counted
# into $reorders and $convs
predict() {
	ONEDNN_VERBOSE=1 kiln 0 predict "$ini" --eval-set --logits "$tmp/l$1.npy" $common \
		run.infer_block=4 model.layout=nhwc "plugin.cpu.keep_weights=$1"
	reorders=$(grep -c '^onednn_verbose,exec,cpu,reorder' "$out")
	convs=$(grep -c '^onednn_verbose,exec,cpu,convolution' "$out")
	echo "keep_weights = $1: $convs convolutions, $reorders reorders"
}

# ---- 1. reordered once, the same logits ---------------------------------------
predict 0
[ "$convs" -ge 12 ] || fail "keep_weights = 0: $convs convolutions (ONEDNN_VERBOSE honoured? 12 blocks expected)"
[ "$reorders" -eq "$convs" ] || fail "keep_weights = 0: $reorders weight reorders for $convs convolutions"
predict 1
[ "$convs" -ge 12 ] || fail "keep_weights = 1: $convs convolutions, 12 blocks expected"
[ "$reorders" -eq 1 ] || fail "keep_weights = 1: $reorders weight reorders in $convs convolutions, 1 expected"
cmp "$tmp/l0.npy" "$tmp/l1.npy" || fail "the logits differ with kept weights"

# ---- 2. training: weights that change between evaluations ---------------------
for k in 0 1; do
	kiln 0 train "$ini" $common "run.out_dir=$tmp/run$k" train.max_steps=6 train.eval_every=2 \
		"plugin.cpu.keep_weights=$k"
	grep -h '] step [0-9]*: test loss' "$out" "$err" >"$tmp/eval$k"
done
[ "$(wc -l <"$tmp/eval1")" -ge 3 ] || fail "$(wc -l <"$tmp/eval1") evaluations logged, 3 expected"
cmp "$tmp/eval0" "$tmp/eval1" || fail "the evaluations differ with kept weights: $(cat "$tmp/eval0" "$tmp/eval1")"
[ "$(sort -u "$tmp/eval1" | wc -l)" -eq "$(wc -l <"$tmp/eval1")" ] || fail "an evaluation repeated: $(cat "$tmp/eval1")"
echo "PASS ($checks kiln runs)"
