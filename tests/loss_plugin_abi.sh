#!/bin/sh
# tests/loss_plugin_abi.sh - a loss layer from a plugin and the loss
# gradient's seed (plugin ABI 2.23, docs/plugins.md "ABI 2.23"): with
# [train] accumulate = A > 1 (since session 37) and in a pipeline of M
# micro-batches (since session 12) the loss layers seed their gradient with
# 1/(M x A), passed as kiln_layer_run.loss_scale, which a loss layer built
# for ABI 2.22's docs could ignore in f32 (only fp16 was said to set it):
#  1. such a loss layer (tests/plugins/kiln-tloss22.so, ABI 2.22, never
#     reads loss_scale) is refused with accumulate = 4 and in a pipeline of
#     4 micro-batches, exit 2, naming the layer, its file and both ABIs
#     (before: it trained, every gradient 4 times too large); with neither
#     it trains as before;
#  2. the same layer built for this ABI (kiln-tloss.so, honours loss_scale
#     whenever l->loss_scaled is set): batch 8 x accumulate 4 and 2 stages
#     of 4 micro-batches of 8 end within 1e-6 of batch 32, whose parameters
#     equal the built-in softmax_xent's (1e-6);
#  3. evaluations (ABI 2.27, kiln_layer.eval_sums): the 2.22 layer counts
#     no rows, and the trainer divides its sums by the samples, as before;
#     the layer built for this ABI adds the rows it counted, which the
#     trainer divides by: at eval_batch 60 (4 batches and one of 16) both
#     evaluate the model of batch 32 as the built-in does (1e-6); so does
#     the layer written for 2.25 and rebuilt unchanged against this kiln's
#     headers (kiln-tloss25.so: this minor, never sets
#     kiln_layer.eval_counted, writes f32[3]): divided by the samples
#     (before: its ABI number alone said it counted, every evaluation inf).
name=loss_plugin_abi
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
plugdir="$abs_top_builddir/tests/plugins/.libs"
[ -f "$plugdir/kiln-tloss.so" ] && [ -f "$plugdir/kiln-tloss22.so" ] && [ -f "$plugdir/kiln-tloss25.so" ] ||
	{ echo "FAIL: test plugins not built in $plugdir (make check builds them)"; exit 99; }
abi=$("$kiln" --version | sed -n 's/.*plugin ABI \([0-9]*\.[0-9]*\).*/\1/p')
[ -n "$abi" ] || fail "kiln --version names no plugin ABI"

# mlp LOSS_TYPE: the MLP of the pipeline tests on synthetic data, its loss
# layer of type LOSS_TYPE, 6 SGD steps
mlp() {
	{
		ini run seed=5 threads=1
		ini_synthetic 256 8 16 workers=0
		ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=24 r2:relu \
			fc3:linear:out=16 loss:"$1"
		ini_sgd_steps 6 log_every=3 eval=0
	} >"$tmp/$1.ini"
}
mlp tloss22
mlp tloss25
mlp tloss
mlp softmax_xent
# train NAME LOSS_TYPE EXIT BATCH ACCUMULATE [KEY=VALUE...]
train() {
	_n=$1 _t=$2 _x=$3 _b=$4 _a=$5
	shift 5
	kiln "$_x" train "$tmp/$_t.ini" "run.plugin_path=$plugdir" "run.out_dir=$tmp/$_n" \
		"train.batch=$_b" "train.accumulate=$_a" "$@"
}

# ---- 1. a 2.22 loss layer where the seed is a mean: refused ------------------
refused="loss layer 'loss' (type tloss22) comes from $plugdir/kiln-tloss22.so, built for plugin ABI 2.22: this step is the mean over 4 micro-batches"
train old_acc tloss22 2 8 4
stderr_has "$tmp/tloss22.ini:"
stderr_has "$refused ([train] accumulate x a pipeline's micro-batches), whose 1/4 share kiln passes to a loss layer as kiln_layer_run.loss_scale, which a layer built before ABI 2.23 may ignore (its gradients would be 4 times too large)"
stderr_has "rebuild it against this kiln's headers (ABI $abi, docs/plugins.md \"ABI 2.23\")"
[ ! -e "$(ck old_acc 6)" ] || fail "the refused run wrote a checkpoint"
train old_pipe tloss22 2 32 1 layer.fc3.stage=1 pipeline.micro_batches=4
stderr_has "$refused"
# neither: its seed is 1 (no loss_scale), as before ABI 2.23
train old_one tloss22 0 32 1 train.eval=1 train.eval_batch=60
[ -e "$(ck old_one 6)" ] || fail "the 2.22 loss layer at accumulate = 1 wrote no checkpoint"
cp "$out" "$tmp/old_one.out"

# ---- 2. the layer built for this ABI: the mean, as the built-in's ---------------
train b32 tloss 0 32 1 train.eval=1 train.eval_batch=60
cp "$out" "$tmp/b32.out"
train builtin softmax_xent 0 32 1 train.eval=1 train.eval_batch=60
cp "$out" "$tmp/builtin.out"
near "$(ck builtin 6)" "$(ck b32 6)" 1e-6 params
train b8x4 tloss 0 8 4
near "$(ck b32 6)" "$(ck b8x4 6)" 1e-6 params
train pipe tloss 0 32 1 layer.fc3.stage=1 pipeline.micro_batches=4
near "$(ck b32 6)" "$(ck pipe 6)" 1e-6 params

# ---- 3. their evaluations: divided by the samples (2.22, 2.25 rebuilt) and by
# the rows
train rebuilt tloss25 0 32 1 train.eval=1 train.eval_batch=60
cp "$out" "$tmp/rebuilt.out"
near "$(ck builtin 6)" "$(ck rebuilt 6)" 1e-6 params
for f in old_one rebuilt b32; do
	for k in test_loss test_acc; do
		a=$(field $k "$tmp/$f.out") b=$(field $k "$tmp/builtin.out")
		[ -n "$a" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(d <= 1e-6 * (b > 1 ? b : 1)) }' ||
			fail "$f: $k '$a', the built-in softmax_xent's $b"
	done
done
# ... and on token logits with pads (label 0, ignored: kiln-tloss.so's token
# rule, the built-in's ignore_index = 0), where a mean over the tokens
# counted and the old mean over samples of batch token means differ: the
# layer built for this ABI evaluates the file's weights (lr 0) as Python's
# token mean and the built-in do (1e-6); the rebuilt 2.25 layer, divided by
# samples, is the old mean (apart by more than 1e-5)
if "$kiln" plugins 2>/dev/null | grep -q "^source  *tokens .*available"; then
	# (tests/tok_pads.py: 200 windows with pads, the weights, a config a
	# loss layer, and the token mean, Python's)
	for l in tloss tloss25 softmax_xent; do
		python3 "$srcdir/tests/tok_pads.py" "$tmp/tok" 200 7 $l >"$tmp/tok_ref" ||
			fail "python3 could not write the token files"
		kiln 0 train "$tmp/tok/$l.ini" "run.plugin_path=$plugdir" run.seed=5 \
			"run.out_dir=$tmp/tok_$l" "model.init_from=$tmp/tok/w.safetensors" \
			train.optimizer=sgd train.lr=0 train.batch=8 train.max_steps=1 train.eval_batch=7
		cp "$out" "$tmp/tok_$l.out"
	done
	# (lr 0: the file's weights, whose token mean Python computed)
	a=$(field test_loss "$tmp/tok_tloss.out") ref=$(cut -d' ' -f1 "$tmp/tok_ref")
	awk -v a="$a" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }' ||
		fail "tokens: tloss's test_loss '$a', the token mean is $ref (Python)"
	for k in test_loss test_acc; do
		a=$(field $k "$tmp/tok_tloss.out") o=$(field $k "$tmp/tok_tloss25.out")
		b=$(field $k "$tmp/tok_softmax_xent.out")
		echo "tokens with pads, $k: tloss $a, tloss25 (per sample) $o, built-in $b"
		[ -n "$a" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * (b > 1 ? b : 1)) }' ||
			fail "tokens: tloss's $k '$a', the built-in softmax_xent's $b"
		awk -v a="$o" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 1e-5) }' ||
			fail "tokens: the per-sample $k '$o' is the per-token $b: the data tells them not apart"
	done
fi
echo "PASS: $checks runs"
