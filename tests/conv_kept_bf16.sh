#!/bin/sh
# tests/conv_kept_bf16.sh - kept copies of a bf16 CNN's NCHW convolutions
# (KILN_OPF_KEEP; plugins/cpu/tune.c, "kept copies of bf16 convolutions"):
# conv2's forward keeps its blocked x for the weight gradient, which keeps
# its blocked dy for the data gradient, in the kernel dtype the tuner chose
# (bf16: 2 bytes an element, f32: 4).  KILN_CPU_TUNEPICK (the tests' hook)
# sets the three ops' choices: where a copy's consumer chose another kernel
# dtype than its producer, the layer reads the tensor as it is (logged) and
# trains: its weights after 5 steps within bf16 rounding of the run whose
# ops agree.  Before the change the bf16 convs kept nothing; without the
# producer check the mismatched run failed (KILN_EINVAL, the size check).
name=conv_kept_bf16
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cnn="$srcdir/bench/cnn_bench.ini"
# conv_algo = direct: oneDNN's copies (the FFT's spectra: tests/cpu_fftconv_bf16.sh)
short="data.path=$FM data.limit=320 train.max_steps=5 train.batch=64 train.eval=0 run.precision=bf16 plugin.cpu.tune_cache=none plugin.cpu.conv_algo=direct"

# run LABEL PICKS: the bf16 CNN with the choices PICKS, debug log in $err
run() {
	# shellcheck disable=SC2086
	KILN_LOG_LEVEL=debug KILN_CPU_TUNEPICK=$2 kiln 0 train "$cnn" $short "run.out_dir=$tmp/$1"
	cp "$err" "$tmp/$1.err"
}

# kept OP PICKS SIZE: conv2's OP (x [n,32,14,14]) logged a kept copy of
# SIZE bytes an element: of x [n,32,14,14] (CONV), of dy [n,64,14,14]
# (CONV_BWD_WEIGHTS; a block of n samples where it runs in blocks)
kept() {
	_l=$(grep -E "^\[cpu\] debug: $1 x \[[0-9]+,32,14,14\] .* kept [1-9][0-9]*\$" "$err" | head -1)
	_n=$(echo "$_l" | sed -n 's/.* x \[\([0-9]*\),.*/\1/p')
	_k=$(echo "$_l" | sed -n 's/.* kept \([0-9]*\)$/\1/p')
	_c=32
	[ "$1" = CONV ] || _c=64
	[ -n "$_k" ] && [ "$_k" -eq $((_n * _c * 14 * 14 * $3)) ] ||
		fail "picks $2: conv2's $1 keeps no copy of $3 bytes an element: $(grep -E "$1 x \[[0-9]+,32,14,14\]" "$err" | head -3)"
}

run agree1 1,1,1
kept CONV 1,1,1 4
kept CONV_BWD_WEIGHTS 1,1,1 4
# below AVX-512 oneDNN 2.6 has no bf16 convolution but its reference
# loops (kiln's device line says "bf16 none"): the bf16-kernel choices do
# not exist there, so only the f32 kernel's copies are checked
if grep -q "ISA [a-z0-9_]*, bf16 none" "$tmp/agree1.err"; then
	echo "ok: bf16 conv2 keeps its f32 kernel's copies; $(grep -o "ISA [a-z0-9_]*, bf16 none" "$tmp/agree1.err" | head -1): no bf16 kernel, its choices not tested"
	echo "PASS: $checks runs"
	exit 0
fi
run agree0 0,0,0
kept CONV 0,0,0 2
kept CONV_BWD_WEIGHTS 0,0,0 2
echo "ok: bf16 conv2 keeps its copies, in the kernel's dtype"

for p in 0,1,0 1,0,0 0,0,1 1,1,0; do
	run "mix$p" "$p"
	grep -q "the producer of its kept copy chose another kernel dtype: read as it is" "$err" ||
		fail "picks $p: no consumer refused the other dtype's copy"
	near "$(ck agree0 5)" "$(ck "mix$p" 5)" 1e-3 params
	echo "ok: picks $p: the mismatched copy is not read, the weights agree"
done
echo "PASS: $checks runs"
