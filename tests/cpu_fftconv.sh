#!/bin/sh
# tests/cpu_fftconv.sh - [plugin.cpu] conv_algo on the CNN example: with
# `fft` its conv2 (32 -> 64, 5x5, pad 2) runs its three passes by FFT
# (plugins/cpu/fftconv.c; the debug lines say so, and that the forward
# and the weight gradient keep their spectra for the next pass; conv1 with its one input
# channel stays on oneDNN under the rule), two runs give the same metrics
# bit for bit (tests/check_cpu_fftconv checks the ops' bytes on 1 and 2
# threads; the GEMMs of fc1 differ between teams), and they
# agree with `direct` (oneDNN only) within 1e-3 of the loss and, each conv
# weight's second update, within 5e-3 (both layouts; measured: see the
# comments at the comparisons).  `fft` in a build without
# FFTW, and an unknown value, are refused by name.
name=cpu_fftconv
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cnn="$srcdir/examples/fashion_mnist_cnn.ini"
short="data.limit=1280 data.eval.limit=500 train.max_steps=10 train.epochs=1"

"$kiln" plugins 2>/dev/null | grep -q . || fail "kiln plugins lists nothing"

# the build's FFTW: `fft` works or is refused naming FFTW
# shellcheck disable=SC2086
"$kiln" train "$cnn" $short train.max_steps=1 "run.out_dir=" plugin.cpu.conv_algo=fft \
	>"$out" 2>"$err"
if grep -q "no FFTW" "$err"; then
	echo "SKIP: this build has no FFTW (configure --with-fftw)"
	exit 77
fi

for layout in nchw nhwc; do
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug kiln 0 train "$cnn" $short "run.out_dir=$tmp/fft1-$layout" \
		model.layout=$layout run.threads=2 plugin.cpu.conv_algo=fft
	cp "$out" "$tmp/fft1-$layout.out"
	for op in CONV CONV_BWD_DATA CONV_BWD_WEIGHTS; do
		grep -q "$op x \[128,32,14,14\] w \[64,32,5,5\] pad 2x2 .*: FFT 16x16" "$err" ||
			fail "$layout: conv2's $op did not run by FFT"
	done
	# the spectra kept: x's by the forward, dy's by the weight gradient
	for op in CONV CONV_BWD_WEIGHTS; do
		grep -q "$op x \[128,32,14,14\] w \[64,32,5,5\] pad 2x2 .*: FFT 16x16.*kept [1-9]" "$err" ||
			fail "$layout: conv2's $op kept nothing"
	done
	# shellcheck disable=SC2086
	kiln 0 train "$cnn" $short "run.out_dir=$tmp/fft2-$layout" model.layout=$layout \
		run.threads=2 plugin.cpu.conv_algo=fft
	cp "$out" "$tmp/fft2-$layout.out"
	same_metrics "fft" "$tmp/fft1-$layout.out" "fft again" "$tmp/fft2-$layout.out"
	# shellcheck disable=SC2086
	kiln 0 train "$cnn" $short "run.out_dir=$tmp/direct-$layout" model.layout=$layout \
		run.threads=2 plugin.cpu.conv_algo=direct
	cp "$out" "$tmp/direct-$layout.out"
	# float rounding only, after 10 steps of SGD with momentum:
	# measured 1.4e-6 (train) and 1.9e-5 (test loss) here, AVX2 (1.3e-5 before
	# the weight gradient became conj(DY)^T X: the order of its sums); a wrong gradient moves the loss
	# by far more
	losses_agree "$layout" fft "$tmp/fft1-$layout.out" direct "$tmp/direct-$layout.out" 1e-3
	# each conv weight's second update (step 1 to 2, from the same
	# initial weights; ckpt_tool step: |u_fft - u_direct| / |u_fft|,
	# 2-norms): float rounding only.  Measured here (AVX2): 1.6e-6
	# (conv2.bias) to 7.7e-4 (conv1.weight), both layouts; later steps
	# drift apart (max pooling's and ReLU's choices flip: 1.2e-2 at step
	# 9 to 10).  With one row of the FFT weight gradient broken on purpose
	# (fc_run: conv2's output channel 0 given channel 1's at every
	# frequency) the losses above still agree (2.9e-5, 1.9e-4) but these
	# do not: conv1.weight 0.136, conv1.bias 0.017, conv2.weight 0.098,
	# conv2.bias 0.023.
	for algo in fft direct; do
		# shellcheck disable=SC2086
		kiln 0 train "$cnn" $short "run.out_dir=$tmp/u-$algo-$layout" model.layout=$layout \
			run.threads=2 plugin.cpu.conv_algo=$algo train.max_steps=2 train.eval=0 \
			train.checkpoint_every=1
	done
	"$top_builddir/tests/ckpt_tool" step "$(ck u-fft-$layout 1)" "$(ck u-fft-$layout 2)" \
		"$(ck u-direct-$layout 1)" "$(ck u-direct-$layout 2)" 5e-3 \
		conv1.weight conv1.bias conv2.weight conv2.bias ||
		fail "$layout: fft and direct: the conv layers' second updates differ by more than float rounding"
	echo "ok: $layout: fft and direct: the conv layers' second updates agree"
done

# the rule (the default) never gives conv1, one input channel, the FFT
# shellcheck disable=SC2086
KILN_LOG_LEVEL=debug kiln 0 train "$cnn" $short train.max_steps=2 "run.out_dir="
! grep -q "x \[128,1,28,28\].*: FFT" "$err" || fail "rule: conv1 ran by FFT"
# and gives conv2 the FFT on every ISA (until session 21 only below
# AVX-512; on a Zen 4 the FFT's three passes took 19 ms a step against
# oneDNN's 31: docs/PERFORMANCE.md)
for pass in CONV CONV_BWD_DATA CONV_BWD_WEIGHTS; do
	grep -q "$pass x \[128,32,14,14\].*: FFT" "$err" || fail "rule: conv2's $pass did not run by FFT"
done

kiln 2 train "$cnn" $short "run.out_dir=" plugin.cpu.conv_algo=gemm
stderr_has "conv_algo"
echo "PASS: $name ($checks checks)"
