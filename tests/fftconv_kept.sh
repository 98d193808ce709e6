#!/bin/sh
# tests/fftconv_kept.sh - the FFT convolution's kept spectra
# (plugins/cpu/fftconv.c, KILN_OPF_KEEP) are never stale: the CNN's conv2
# by FFT (`conv_algo = fft`) trained with its spectra kept (the forward's
# x and w for the weight and data gradients, the weight gradient's dy for
# the data gradient) gives the weights and momenta of the run that
# transforms every operand in every pass (KILN_CPU_FFT_NOKEEP, the hook
# that refuses the flag) bit for bit, where a kept spectrum could outlive
# its tensor: an evaluation between steps, gradient accumulation, two
# pipeline micro-batches whose forwards both run before their backwards
# (gpipe), recomputation, dropout before conv2, NHWC; and both agree with
# oneDNN's direct convolution (`direct`) within float rounding.  A forward
# that kept x's spectrum only on its first call (tried by hand) failed the
# bitwise check, and moved the weights 1.5e-4 from direct's after these 4
# steps; the rounding moves them 1.5e-8 to 1.1e-6.
name=fftconv_kept
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cnn="$srcdir/examples/fashion_mnist_cnn.ini"
short="data.path=$FM data.limit=512 data.eval.limit=128 train.batch=64 train.max_steps=4 train.epochs=1 run.threads=2"
tool="$top_builddir/tests/ckpt_tool"

# the build's FFTW: skip without it
# shellcheck disable=SC2086
"$kiln" train "$cnn" $short train.max_steps=1 "run.out_dir=" plugin.cpu.conv_algo=fft \
	>"$out" 2>"$err"
if grep -q "no FFTW" "$err"; then
	echo "SKIP: this build has no FFTW (configure --with-fftw)"
	exit 77
fi

# dropout between pool1 and conv2
sed -e 's/^\[layer.conv2\]/[layer.drop0]\ntype = dropout\np = 0.2\n\n[layer.conv2]/' "$cnn" >"$tmp/drop.ini"
grep -q "layer.drop0" "$tmp/drop.ini" || fail "no dropout inserted before conv2"

# case LABEL CONFIG ARGS...: kept, unkept and direct; the first two the
# same bytes, the direct within rounding
case_() {
	label=$1 cfg=$2
	shift 2
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug kiln 0 train "$cfg" $short "run.out_dir=$tmp/$label-kept" \
		plugin.cpu.conv_algo=fft "$@"
	grep -q "CONV_BWD_WEIGHTS x \[[0-9]*,32,14,14\] w \[64,32,5,5\] .*: FFT 16x16.*kept [1-9]" "$err" ||
		fail "$label: conv2's weight gradient kept nothing"
	grep -q "CONV x \[[0-9]*,32,14,14\] w \[64,32,5,5\] .*: FFT 16x16.*kept [1-9]" "$err" ||
		fail "$label: conv2's forward kept nothing"
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug KILN_CPU_FFT_NOKEEP=1 kiln 0 train "$cfg" $short \
		"run.out_dir=$tmp/$label-plain" plugin.cpu.conv_algo=fft "$@"
	! grep -q "x \[[0-9]*,32,14,14\] w \[64,32,5,5\] .*: FFT 16x16.*kept [1-9]" "$err" ||
		fail "$label: KILN_CPU_FFT_NOKEEP kept a spectrum"
	grep -q "CONV_BWD_DATA x \[[0-9]*,32,14,14\] w \[64,32,5,5\] .*: FFT 16x16" "$err" ||
		fail "$label: the unkept data gradient did not run by FFT"
	"$tool" same "$(ck "$label-kept" 4)" "$(ck "$label-plain" 4)" params optim.momentum ||
		fail "$label: kept and unkept spectra give different weights"
	# (oneDNN's conv1 too, as before session 24: with kiln's first-layer
	# kernel, convthin.c, the weights land 5.7e-5 from the FFT run's after
	# these 4 steps, as far as oneDNN's conv1 and conv2 land from `rule`'s
	# FFT conv2 (measured on the Zen 4); the losses agree to 6 digits, so a
	# discrete event (a zero crossing or a pooling tie) more than rounding;
	# tests/check_cpu_convthin checks convthin.c op by op)
	# shellcheck disable=SC2086
	KILN_CPU_CONVTHIN=0 kiln 0 train "$cfg" $short "run.out_dir=$tmp/$label-direct" \
		plugin.cpu.conv_algo=direct "$@"
	# measured <= 1.2e-6 here (AVX2); a stale spectrum: see the top.
	# On an Intel Xeon (AVX-512, session 39) the accumulate case lands
	# 5.69e-5 from direct's, main's build too: the discrete event above,
	# not rounding; the bound 1e-4 stays below the stale forward's 1.5e-4,
	# and the bitwise kept = unkept check above is the stale spectra's test
	near "$(ck "$label-direct" 4)" "$(ck "$label-kept" 4)" 1e-4 params
	echo "ok: $label: kept = unkept bit for bit, within 1e-4 of direct"
}

case_ eval_between "$cnn" train.eval_every=1
case_ nhwc "$cnn" model.layout=nhwc train.eval_every=2
case_ accumulate "$cnn" train.accumulate=2 train.batch=32
case_ gpipe "$cnn" layer.fc1.stage=1 pipeline.micro_batches=2 pipeline.schedule=gpipe
case_ recompute "$cnn" train.recompute=2
case_ dropout "$tmp/drop.ini"
echo "PASS: $name ($checks checks)"
