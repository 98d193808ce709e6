#!/bin/sh
# Fused attention forward + backward, kiln (bench/attention) vs PyTorch 1.13
# (bench/pytorch_attention.py: explicit ops and autograd), causal, f32, at
# the two shapes of issue 20: B=4 T=128 C=128 H=4 (the char GPT's) and
# B=4 T=64 C=768 H=12 (GPT-2 small's at T=64).  The two alternate, ROUNDS
# times each (default 3), on THREADS threads (default 2); each run prints the
# median and the minimum of its 30 pairs.  PyTorch runs with
# OMP_WAIT_POLICY=PASSIVE (as kiln's OpenMP does), which is faster on a
# shared machine.
#
# Usage: bench/attention.sh [ROUNDS] [THREADS]   (from the top of a built tree)
# Environment: PYTHON (default /usr/bin/python3).  Debian's torch links
#   libblas.so.3, the slow reference BLAS unless OpenBLAS is installed
#   (scripts/install-deps --bench) or put first on LD_LIBRARY_PATH.
ROUNDS=${1:-3}
THREADS=${2:-2}
PYTHON=${PYTHON:-/usr/bin/python3}
r=0
while [ "$r" -lt "$ROUNDS" ]; do
	for shape in "4 128 128 4" "4 64 768 12"; do
		# shellcheck disable=SC2086 # the shape is four words
		bench/attention "$THREADS" $shape 30 || exit 1
		# shellcheck disable=SC2086
		OMP_WAIT_POLICY=PASSIVE "$PYTHON" bench/pytorch_attention.py "$THREADS" $shape 30 || exit 1
	done
	r=$((r + 1))
done
