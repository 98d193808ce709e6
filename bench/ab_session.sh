#!/bin/sh
# bench/ab_session.sh - a session's change against the build before it on
# the same machine, interleaved: the MLP and CNN examples' training
# samples/s (one epoch of 20,000 samples, 3 rounds), and the CNN under
# `kiln launch -n 2` with [dist] zero = 0 and 1 (samples/s and the largest
# rank's device_peak_bytes, 2 rounds).  A=the build before (its `kiln`
# wrapper), B=this build's; run from the top of the build tree:
#   A=/path/to/old/kiln B=./kiln sh bench/ab_session.sh
A=${A:?set A to the kiln of the build before}; B=${B:-./kiln}
run() { # bin cfg extra...
	b=$1; c=$2; shift 2
	$b train $c run.out_dir= train.epochs=1 data.eval.limit=1000 "$@" 2>/dev/null | tail -1 | sed 's/.*"train_samples_per_s": \([0-9.]*\).*/\1/'
}
for m in mlp cnn; do
	for r in 1 2 3; do
		a=$(run $A examples/fashion_mnist_$m.ini data.limit=20000)
		b=$(run $B examples/fashion_mnist_$m.ini data.limit=20000)
		echo "$m round $r: before $a this $b"
	done
done
for r in 1 2; do
	for z in 0 1; do
		a=$($A launch -n 2 -- $A train examples/fashion_mnist_cnn.ini run.out_dir= train.epochs=1 data.limit=8192 data.eval.limit=500 train.optimizer=adamw train.lr=0.001 dist.zero=$z 2>/dev/null | tail -1 | sed 's/.*"train_samples_per_s": \([0-9.]*\).*device_peak_bytes": \([0-9]*\).*/\1 \2/')
		b=$($B launch -n 2 -- $B train examples/fashion_mnist_cnn.ini run.out_dir= train.epochs=1 data.limit=8192 data.eval.limit=500 train.optimizer=adamw train.lr=0.001 dist.zero=$z 2>/dev/null | tail -1 | sed 's/.*"train_samples_per_s": \([0-9.]*\).*device_peak_bytes": \([0-9]*\).*/\1 \2/')
		echo "cnn ddp zero=$z round $r: before $a | this $b"
	done
done
uptime
