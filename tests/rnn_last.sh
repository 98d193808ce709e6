#!/bin/sh
# tests/rnn_last.sh - a sequence classifier on the final hidden state
# (`[layer.X] last = 1` on lstm/gru, PyTorch's h_n; session 41: before it
# no layer could take a row's last real step, so LSTM -> h_n -> Linear
# could not be built): examples/seq_classify.ini (digit sums mod 10 of
# 1..12 digits, padded rows, a bidirectional LSTM's two h_n joined) learns
# the task, 3 epochs, held-out accuracy >= 0.99 (measured 0.9995 at epoch
# 3, docs/rnn.md); `kiln eval` of its checkpoint gives the same numbers;
# the summary shows the layers' [B, H] outputs.
# (tests/check_rnn checks the numbers against PyTorch's h_n.)
name=rnn_last
. "$(dirname "$0")/lib.sh"
need_source seq2seq
ini="$srcdir/examples/seq_classify.ini"
kiln 0 train "$ini" run.out_dir="$tmp/sc" train.epochs=3
acc=$(field test_acc "$out")
echo "held-out accuracy after 3 epochs: $acc"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.99) }' || fail "test_acc $acc < 0.99"
cp "$out" "$tmp/train.out"
kiln 0 eval "$ini" run.out_dir="$tmp/sc" train.epochs=3
[ "$(field test_loss "$out")" = "$(field test_loss "$tmp/train.out")" ] ||
	fail "kiln eval: test_loss $(field test_loss "$out"), the run's $(field test_loss "$tmp/train.out")"
kiln 0 summary "$ini"
stdout_matches "^fwd \(lstm\) +\[1, 64\] "
stdout_matches "^h_n \(concat\) +\[1, 128\] "
echo "PASS: $checks checks"
