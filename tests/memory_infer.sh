#!/bin/sh
# tests/memory_infer.sh - a model that never trains holds its weights
# alone (kiln_model_create_infer, docs/memory.md "Inference"): the device
# peak of kiln predict, eval, eval --fold, export and generate (the debug
# line kiln_device_close logs) is the same whether the config trains with
# SGD without momentum (no optimizer state) or AdamW (two f32 slots per
# weight).  Before session 37 inference allocated the gradients and the
# optimizer state too, and predict's fold held two such models at once:
# predict with this MLP (fc1.out = 2048) peaked at 34.2 MB under SGD, 68.3
# MB under AdamW; then 17.1 MB under either; since session 38, when the fold
# frees the trained weights before it builds the folded model, 14.6 MB, the
# peak of --no-fold.
name=memory_infer
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cfg="$srcdir/examples/fashion_mnist_mlp.ini"
big="layer.fc1.out=2048 data.eval.limit=200"
peak() { sed -n 's/.*debug: device cpu: peak \([0-9]*\) bytes allocated.*/\1/p' "$err" | tail -1; }
export KILN_LOG_LEVEL=debug

# a trained checkpoint under each optimizer (its optimizer state in it)
for o in sgd adamw; do
	kiln 0 train "$cfg" $big train.optimizer=$o train.momentum=0 run.out_dir="$tmp/$o" \
		train.max_steps=2 train.epochs=1 data.limit=256
done

# each command's device peak under both optimizers
same() { # WHAT: the two peaks p_sgd, p_adamw equal and nonzero
	[ -n "$p_sgd" ] && [ "$p_sgd" -gt 0 ] || fail "$1: no device peak in the debug log"
	[ "$p_sgd" = "$p_adamw" ] ||
		fail "$1: device peak $p_sgd bytes under sgd (momentum 0), $p_adamw under adamw (want the same: the weights alone, no gradients nor optimizer state)"
	echo "ok: $1: device peak $p_sgd bytes under either optimizer"
}
for o in sgd adamw; do
	kiln 0 predict "$cfg" $big train.optimizer=$o train.momentum=0 run.out_dir="$tmp/$o" \
		--eval-set --logits "$tmp/$o.npy"
	eval "p_$o=\$(peak)"
done
same "kiln predict (folded)"
p_fold=$p_sgd
for o in sgd adamw; do
	kiln 0 predict "$cfg" $big train.optimizer=$o train.momentum=0 run.out_dir="$tmp/$o" \
		--eval-set --no-fold --logits "$tmp/$o.nofold.npy"
	eval "p_$o=\$(peak)"
done
same "kiln predict --no-fold"
# the trained and the folded model are never both held: the trained
# weights go to host memory and leave the device before the folded model
# is built (session 38; before, the fold peaked at 17.1 MB here, 14.6 with
# --no-fold).  (The MLP folds nothing but the plan: the two models' weights
# are the same size.)
[ "$p_fold" = "$p_sgd" ] ||
	fail "kiln predict: device peak $p_fold bytes folded, $p_sgd with --no-fold (want the same: one model's weights at a time)"
echo "ok: kiln predict: device peak $p_fold bytes folded, as with --no-fold"
# the logits do not depend on what the model holds beside its weights:
# the sgd checkpoint under an adamw config (same weights) predicts alike
kiln 0 predict "$cfg" $big train.optimizer=adamw run.out_dir="$tmp/sgd" --eval-set \
	--logits "$tmp/sgd2.npy"
cmp -s "$tmp/sgd.npy" "$tmp/sgd2.npy" || fail "predict: the logits differ with the config's optimizer"
for f in "" --fold; do
	for o in sgd adamw; do
		# (a full training checkpoint, read for its weights)
		kiln 0 eval "$cfg" $big train.optimizer=$o train.momentum=0 run.out_dir="$tmp/$o" \
			--checkpoint "$(ck $o 2)" $f
		eval "p_$o=\$(peak)"
	done
	same "kiln eval --checkpoint $f"
done
for o in sgd adamw; do
	kiln 0 export "$cfg" $big train.optimizer=$o train.momentum=0 run.out_dir="$tmp/$o" \
		--safetensors "$tmp/$o.safetensors"
	eval "p_$o=\$(peak)"
done
same "kiln export --safetensors"
cmp -s "$tmp/sgd.safetensors" "$tmp/adamw.safetensors" &&
	fail "export: the two runs' weights are alike (the optimizers trained nothing?)"

# generate: a tiny GPT whose head is tied to the embedding (no tied
# weights' gradients either)
if "$kiln" plugins 2>/dev/null | grep -q "^source  *tokens .*available"; then
	i=0
	while [ $i -lt 60 ]; do
		echo "the quick brown fox jumps over the lazy dog $i times."
		i=$((i + 1))
	done >"$tmp/corpus.txt"
	kiln 0 pack --format tokens "$tmp/corpus.txt" --out "$tmp/data" --val-fraction 0.1
	{
		printf '[data]\nsource = tokens\npath = %s/data\ncontext = 16\nvocab = 256\n' "$tmp"
		printf '[train]\nlr = 3e-3\nbatch = 4\nepochs = 1\nmax_steps = 2\n'
		printf '[layer.wte]\ntype = embedding\nvocab = 256\ndim = 32\n'
		printf '[layer.wpe]\ntype = pos_embedding\nmax_len = 16\n'
		printf '[layer.ln]\ntype = layernorm\n[layer.fc]\ntype = linear\nout = 32\n'
		printf '[layer.lm_head]\ntype = linear\nout = 256\nbias = 0\ntie = wte\n'
		printf '[layer.loss]\ntype = softmax_xent\n'
	} >"$tmp/gpt.ini"
	for o in sgd adamw; do
		kiln 0 train "$tmp/gpt.ini" train.optimizer=$o train.momentum=0 run.out_dir="$tmp/g$o"
		kiln 0 generate "$tmp/gpt.ini" train.optimizer=$o train.momentum=0 run.out_dir="$tmp/g$o" \
			--prompt "the " --tokens 4
		eval "p_$o=\$(peak)"
	done
	same "kiln generate (tied head)"
else
	echo "SKIP (part): no tokens source for kiln generate"
fi
echo "ok: $checks kiln runs"
