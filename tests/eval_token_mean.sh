#!/bin/sh
# tests/eval_token_mean.sh - an evaluation is one mean over the set's
# counted rows, whatever [train] eval_batch (session 42): on token data
# with padding (ignore_index), the loss is (sum of the token losses) /
# (tokens not ignored) and the accuracy (tokens right) / (tokens not
# ignored) over the whole set, as PyTorch's CrossEntropyLoss(reduction =
# 'sum') summed over the loader and divided by the targets counted.
# Before, each batch added `batch` times its own token mean, so the set's
# number was a sample-weighted mean of the batches' means and moved with
# eval_batch (session 41: 2.315752 / 2.315757 / 2.315703 at 7 / 64 / 1000
# on examples/seq2seq.ini).
#
# The model is an embedding whose rows are the logits (vocab 11, dim 11)
# under softmax_xent with ignore_index = 0, on a token shard of 1000
# windows of 8 tokens, each window's share of pads (0) drawn from 0, 10%,
# 50% and 90%, so the batches' token means differ: tests/tok_pads.py
# writes them, the config and the weights (a safetensors file), and
# computes the reference in Python (the standard library, double): per
# token logsumexp(W[x]) - W[x][y], the first arg max for the accuracy.  `kiln eval` at eval_batch 7 (142
# full batches and one of 6), 64 (15 and one of 40) and 1000 (one batch)
# gives it within 1e-6 (the loss, relative; the accuracy, absolute: the
# JSON line's 6 decimals), and the three agree within 1e-6 of each other;
# `kiln train` on 2 data-parallel ranks (each its share of the set) and
# on 2 pipeline stages on 2
# ranks (at lr 0, each rank holding its stage's parameters alone, so the
# evaluation runs per stage) evaluates it too, loss and accuracy.  Before
# this session 7 and 64 were off by about 1e-3.
name=eval_token_mean
. "$(dirname "$0")/lib.sh"
need_python3
need_source tokens

"$py" "$srcdir/tests/tok_pads.py" "$tmp" 1000 42 >"$tmp/ref" || exit 99
read ref_loss ref_acc ref_n <"$tmp/ref"
echo "reference (Python, double): loss $ref_loss acc $ref_acc over $ref_n tokens"

ini="$tmp/softmax_xent.ini"

for eb in 7 64 1000; do
	kiln 0 eval "$ini" --checkpoint "$tmp/w.safetensors" train.eval_batch=$eb
	l=$(field test_loss "$out") a=$(field test_acc "$out")
	echo "eval_batch $eb: loss $l acc $a"
	[ "$(field test_samples "$out")" = 1000 ] || fail "eval_batch $eb: test_samples is not 1000"
	r=$(rel "$l" "$ref_loss")
	awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' ||
		fail "eval_batch $eb: loss $l, the token mean is $ref_loss (relative $r)"
	awk -v a="$a" -v b="$ref_acc" 'BEGIN { d = a - b; exit !(d <= 1e-6 && -d <= 1e-6) }' ||
		fail "eval_batch $eb: accuracy $a, the token accuracy is $ref_acc"
	eval "loss_$eb=\$l"
done
for eb in 7 64; do
	eval "l=\$loss_$eb"
	r=$(rel "$l" "$loss_1000")
	awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' ||
		fail "eval_batch $eb: loss $l, one batch of the set: $loss_1000 (relative $r)"
done

# the same through [dist] after 2 steps at lr 0 (the file's weights):
# 2 data-parallel ranks (each evaluates its share, since session 43: 143
# batches of 7, 71 and 72, the last of 6 rows; the shares' sums added),
# and 2 pipeline
# stages on 2 ranks, the loss alone on stage 1's, which evaluate per stage
# (core/dist_pipe_eval.c: the sums and the count summed over the pipe)
if [ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ]; then
	for how in ddp pipe; do
		if [ $how = pipe ]; then set -- dist.pipeline=2 "model.stages=emb|loss"; else set --; fi
		KILN_MASTER_PORT=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
		export KILN_MASTER_PORT
		kiln 0 launch -n 2 -- "$abs_top_builddir/kiln" train "$ini" \
			"model.init_from=$tmp/w.safetensors" run.comm=gloo dist.timeout=60 \
			train.optimizer=sgd train.lr=0 train.batch=8 train.max_steps=2 train.eval_batch=7 "$@"
		l=$(field test_loss "$out") a=$(field test_acc "$out")
		echo "$how, 2 ranks, eval_batch 7: loss $l acc $a"
		r=$(rel "$l" "$ref_loss")
		awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }' ||
			fail "$how on 2 ranks: loss $l, the token mean is $ref_loss (relative $r)"
		awk -v a="$a" -v b="$ref_acc" 'BEGIN { d = a - b; exit !(d <= 1e-6 && -d <= 1e-6) }' ||
			fail "$how on 2 ranks: accuracy $a, the token accuracy is $ref_acc"
		# (per stage: each rank holds its stage's parameters alone,
		# kiln_dist_pipe_eval_staged, and gathers nothing to evaluate)
		[ $how = ddp ] || for s in 0 1; do
			stderr_has "rank $s (pipeline stage $s): holds the stage's parameters and gradients alone"
		done
	done
else
	echo "(no gloo plugin: the 2-rank runs skipped)"
fi
echo "PASS: $checks checks"
