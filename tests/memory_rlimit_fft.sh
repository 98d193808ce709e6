#!/bin/sh
# tests/memory_rlimit_fft.sh - the FFT convolution ([plugin.cpu] conv_algo
# = fft) under an address-space limit (ulimit -v, RLIMIT_AS) with its
# per-frequency GEMMs on oneDNN's dnnl_sgemm: never a signal.
#
# dnnl_sgemm makes its JIT kernels at its first call, and oneDNN 2.6
# writes them through NULL where the limit refuses their mapping.  Before
# session 41 the FFT plan (plugins/cpu/fftconv.c) called it first in the
# first step, outside the address-space check session 40 gave every
# oneDNN primitive (plugins/cpu/dnn.c): SIGSEGV in fc_gemm where the
# plans fitted and the loader's threads then took the room (this config:
# ulimit -v 94-98 MB here, 3 of the 2 MiB steps).  FFTW's planner, the
# plan's other library, aborts when an allocation fails (SIGABRT in
# fftwf_plan_dft_r2c, seen under 242 MB with the pthread OpenBLAS loaded).
# Now both are made at prepare, after the same check: an error naming the
# layer, or a run that trains.
#
# The GEMMs are oneDNN's here because the limits are below what OpenBLAS
# maps as it loads (128 MiB a CPU: plugins/cpu/openblas.c leaves it out
# and says so); the debug log's FFT lines say "(oneDNN)".
#  1. The baseline, measured: L, the smallest limit (1 MiB steps, bisected
#     between 64 MiB and a limit that trains) under which the run trains.
#  2. Every limit from L - 24 MiB to L + 4 MiB in 1 MiB steps: exit 0, or
#     1 with an error; never a signal or a hang.
name=memory_rlimit_fft
. "$(dirname "$0")/lib.sh"

"$kiln" plugins 2>/dev/null | grep -q "^device  *cpu .*available" ||
	{ echo "SKIP: no cpu device"; exit 77; }

# tests/data/fft_convs.ini: convolutions alone (no linear layer, whose
# plans would make dnnl_sgemm's kernels at prepare anyway: gemm.c's adding
# GEMM), both 5x5 on 14x14 (FFT 16x16), with three loader workers whose
# stacks are mapped after the plans
cfg="$srcdir/tests/data/fft_convs.ini"
if ! "$kiln" train "$cfg" data.workers=3 train.batch=32 >"$out" 2>"$err"; then
	grep -q "no FFTW" "$err" && { echo "SKIP: this build has no FFTW (configure --with-fftw)"; exit 77; }
	cat "$err"
	fail "the FFT model does not train without a limit"
fi

# run_under KIB: kiln train under ulimit -v KIB, output in $tmp/r.out and
# $tmp/r.err; the exit status (a signal: 128 + its number; a hang: 137)
run_under() {
	(
		ulimit -v "$1" || exit 98
		exec timeout -s KILL 60 env KILN_LOG_LEVEL=debug "$kiln" train "$cfg" \
			data.workers=3 train.batch=32 >"$tmp/r.out" 2>"$tmp/r.err"
	)
}

# 1. L: doubled from 128 MiB until the run trains (at most 512 MiB), then
# bisected down to 1 MiB
hi=131072
until run_under $hi; do
	st=$?
	[ $st -lt 124 ] || { cat "$tmp/r.err"; fail "ulimit -v $hi: exit $st (a signal or a hang)"; }
	[ $hi -lt 524288 ] || { cat "$tmp/r.err"; fail "the FFT model does not train under ulimit -v $hi"; }
	hi=$((hi * 2))
done
# the GEMMs are oneDNN's (the limit leaves OpenBLAS out)
grep -q "CONV x .*: FFT 16x16.*(oneDNN)" "$tmp/r.err" ||
	{ grep "FFT\|OpenBLAS" "$tmp/r.err"; fail "ulimit -v $hi: the FFT's GEMMs are not oneDNN's"; }
lo=65536
while [ $((hi - lo)) -gt 1024 ]; do
	mid=$(((lo + hi) / 2))
	st=0
	run_under $mid || st=$?
	[ $st -lt 124 ] || { cat "$tmp/r.err"; fail "ulimit -v $mid: exit $st (a signal or a hang)"; }
	if [ $st = 0 ]; then hi=$mid; else lo=$mid; fi
done
echo "baseline: the FFT model trains from ulimit -v $hi KiB"

# 2. below and around it, every MiB
v=$((hi - 24576))
n=0
while [ $v -le $((hi + 4096)) ]; do
	st=0
	run_under $v || st=$?
	case $st in
	0) ;;
	1) grep -q "error: " "$tmp/r.err" || { cat "$tmp/r.err"; fail "ulimit -v $v: exit 1 without an error"; } ;;
	*) tail -5 "$tmp/r.err"; fail "ulimit -v $v (L - $(((hi - v) / 1024)) MiB): exit $st (139: SIGSEGV, 134: SIGABRT, 137: a hang)" ;;
	esac
	echo "ok: ulimit -v $v: exit $st $(grep -o 'error: .*' "$tmp/r.err" | cut -c1-150)"
	n=$((n + 1))
	v=$((v + 1024))
done
echo "PASS: $name ($n limits)"
