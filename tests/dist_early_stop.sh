#!/bin/sh
# tests/dist_early_stop.sh - an early stop off the log points on 2 ranks:
# the epoch's summary sums the open log interval's device sums over the
# ranks (trainer_epoch_summary -> trainer_epoch_sums, a collective no other
# test ran on more than one rank; session 41).  An MLP on 256 synthetic
# samples, 4 steps an epoch of a global batch of 64, log_every 4,
# eval_every 3 and early stopping with patience 1 and min_delta 100: the
# evaluation after step 6 (no log point: epoch 2's steps 5-6 are on the
# device) stops the run.  One process with batch 64 and `kiln launch -n 2`
# (gloo) with batch 32 a rank: both stop at step 6, no train line of epoch
# 2, and the 2 ranks' train_loss (metrics.jsonl's final line, in full;
# rank 1's final metrics, 6 digits) and train_acc (the final metrics)
# equal one process's to 1e-5 relative.
name=dist_early_stop needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/es.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini train epochs=3 optimizer=sgd momentum=0.9 lr=0.05 log_every=4 eval_every=3 \
		early_stop_patience=1 early_stop_min_delta=100 checkpoint_every=0
	ini dist timeout=60
} > "$ini"
run one 0 64
run two 2 32
for n in one two; do
	want=1
	[ $n = two ] && want=2
	[ "$(grep -c "early stop at step 6:" "$tmp/$n.log")" = "$want" ] ||
		bad "$n: not $want early stop(s) at step 6: $(grep "early stop" "$tmp/$n.log")"
	! grep -q "^epoch 2 step " "$tmp/$n.log" || bad "$n: a log point in epoch 2: $(grep "^epoch 2 step " "$tmp/$n.log")"
done
# final NAME KEY: KEY of NAME's metrics.jsonl final line (train_loss, in
# full), else of its stdout line (rank 0's; 6 digits)
final() {
	sed -n 's/.*"event":"final",.*"'"$2"'":\([-0-9.e+]*\),.*/\1/p' "$tmp/$1/metrics.jsonl" | grep . ||
		sed -n 's/^{"epochs": .*"'"$2"'": \([-0-9.e+]*\),.*/\1/p' "$tmp/$1.log"
}
# rank1 KEY: KEY of rank 1's final metrics (6 digits)
rank1() { sed -n 's/^kiln: rank 1.s final metrics: .*"'"$1"'": \([-0-9.e+]*\),.*/\1/p' "$tmp/two.log"; }
# near A B: A and B are numbers within 1e-5 relative
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b
	exit !(a != "" && b != "" && d <= 1e-5 * m + 1e-12) }'; }
for k in train_loss train_acc; do
	a=$(final one $k) b=$(final two $k) c=$(rank1 $k)
	echo "$k: one process $a, 2 ranks $b (rank 1: $c)"
	near "$b" "$a" || bad "$k of 2 ranks, $b, is not one process's $a"
	near "$c" "$a" || bad "$k of rank 1, $c, is not one process's $a"
done
[ "$fail" = 0 ] && echo "ok: an early stop off the log points sums the ranks' open interval as one process does"
exit $fail
