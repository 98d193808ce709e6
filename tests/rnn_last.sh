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
# On tnornn24 (tests/plugins/tnodecode.c: the CPU device under ABI 2.24,
# before `last`, whose has_op says no to RNN) the model is refused as RNN
# not implemented by the device, exit 1 (KILN_ENOTSUP: rebuilding it would
# not help), not as built before 2.25 (exit 2, "rebuild it", before the
# fix of session 45; docs/plugins.md, has_op).
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
plugdir="$abs_top_builddir/tests/plugins/nodecode/.libs"
[ -f "$plugdir/kiln-tnodecode.so" ] || fail "no $plugdir/kiln-tnodecode.so (make check builds it)"
KILN_PLUGIN_PATH=$plugdir
export KILN_PLUGIN_PATH
kiln 1 train "$ini" run.out_dir="$tmp/nornn" run.device=tnornn24 train.max_steps=2
unset KILN_PLUGIN_PATH
stderr_has "tnornn24: RNN is not implemented by this device yet"
! grep -q "rebuild" "$err" || fail "tnornn24 told to rebuild: $(grep rebuild "$err")"
echo "PASS: $checks checks"
