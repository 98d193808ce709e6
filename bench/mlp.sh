#!/bin/sh
# Side-by-side MLP benchmark on Fashion-MNIST: kiln vs PyTorch (CPU).
#
# PyTorch (bench/pytorch_mlp.py) runs under three OpenMP environments, all
# with common.sh's BLAS_ENV (SkylakeX kernels on AVX-512):
#   default   nothing else set
#   passive   OMP_WAIT_POLICY=PASSIVE
#   omp1      OMP_NUM_THREADS=1 (and torch.set_num_threads(1))
# Each setting runs N times and the median samples/s counts. The fastest
# setting is "pytorch-best". kiln then runs N times with
#   $KILN train bench/mlp_bench.ini train.epochs=1
# and its median is compared with pytorch-best.
#
# Usage: bench/mlp.sh [--runs N] [--steps N] [--threads N] [--no-kiln]
#   --runs N     repetitions per setting (default 3)
#   --steps N    PyTorch training steps incl. 20 warmup steps (default 0 = one
#                full epoch, which matches kiln's train.epochs=1)
#   --threads N  PyTorch intra-op threads (default 2, the same as mlp_bench.ini)
#   --precision P  fp32 (default) or bf16: PyTorch under CPU autocast
#                (bench/pytorch_mlp.py --precision bf16), kiln with
#                run.precision=bf16
#   --no-kiln    run only the PyTorch half
#   --anchors    instead: bench/anchors.sh --bench mlp (kiln beside PyTorch
#                2.x eager, torch.compile, Lightning and 1.13, interleaved)
# Environment:
#   KILN     kiln binary (default ./kiln)
#   PYTHON   Python with PyTorch (default /usr/bin/python3)
#   LD_LIBRARY_PATH is passed on. Debian's torch links libblas.so.3, which is
#   the slow reference BLAS unless OpenBLAS is installed or put first on
#   LD_LIBRARY_PATH. Check the "blas" field in the PyTorch JSON lines.
# Run from the top of the source tree.

set -eu

RUNS=3
STEPS=0
THREADS=2
DO_KILN=1
ANCHORS=0
PRECISION=fp32
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

while [ $# -gt 0 ]; do
    case $1 in
        --no-kiln) DO_KILN=0; shift ;;
        --anchors) ANCHORS=1; shift ;;
        -h|--help) usage ;;
        *) bench_opt "$@" || { echo "mlp.sh: unknown argument: $1" >&2; usage; }
           shift "$NSHIFT" ;;
    esac
done
case $PRECISION in fp32|bf16) ;; *) echo "mlp.sh: --precision must be fp32 or bf16" >&2; exit 2 ;; esac
case $RUNS in ''|*[!0-9]*|0) echo "mlp.sh: --runs must be a positive integer" >&2; exit 2 ;; esac
case $STEPS in ''|*[!0-9]*) echo "mlp.sh: --steps must be an integer >= 0" >&2; exit 2 ;; esac

[ "$ANCHORS" = 0 ] || exec "$HERE/anchors.sh" --bench mlp --runs "$RUNS" --threads "$THREADS"

bench_tmpdir mlp-bench

json_line_any() {
    grep '^[[:space:]]*{' | tail -n 1
}

run_pytorch() { # name, threads, then env assignments
    name=$1; nthreads=$2; shift 2
    collect_runs "$TMP/pytorch-$name.jsonl" "pytorch $name" \
        env $BLAS_ENV "$@" "$PYTHON" "$HERE/pytorch_mlp.py" \
        --threads "$nthreads" --steps "$STEPS" --precision "$PRECISION"
}

# Unset the variables under test so that the settings are what they say.
unset OMP_WAIT_POLICY OMP_NUM_THREADS

run_pytorch default "$THREADS"
run_pytorch passive "$THREADS" OMP_WAIT_POLICY=PASSIVE
# one thread means one: torch.set_num_threads(1) as well as OpenMP's
run_pytorch omp1 1 OMP_NUM_THREADS=1

KILN_SPS=
KILN_ACC=
if [ "$DO_KILN" = 1 ]; then
    if [ ! -x "$KILN" ]; then
        echo "mlp.sh: $KILN not found or not executable (set KILN=, or --no-kiln)" >&2
        exit 1
    fi
    out="$TMP/kiln.jsonl"
    collect_runs "$out" kiln env $BLAS_ENV "$KILN" train "$HERE/mlp_bench.ini" \
        train.epochs=1 run.precision="$PRECISION"
    KILN_SPS=$(median_field "$out" train_samples_per_s)
    KILN_ACC=$(median_field "$out" test_acc)
fi

BEST_NAME=
BEST_SPS=0
echo
printf '%-28s %14s %9s\n' "setting (median of $RUNS)" "samples/s" "test_acc"
for name in default passive omp1; do
    sps=$(median_field "$TMP/pytorch-$name.jsonl" train_samples_per_s)
    acc=$(median_field "$TMP/pytorch-$name.jsonl" test_acc)
    printf '%-28s %14.1f %9.4f\n' "pytorch $name" "$sps" "$acc"
    if awk -v a="$sps" -v b="$BEST_SPS" 'BEGIN { exit !(a > b) }'; then
        BEST_NAME=$name
        BEST_SPS=$sps
    fi
done
if [ -n "$KILN_SPS" ]; then
    printf '%-28s %14.1f %9.4f\n' "kiln" "$KILN_SPS" "$KILN_ACC"
fi
echo
echo "pytorch best: $BEST_NAME ($BEST_SPS samples/s)"
if [ -n "$KILN_SPS" ]; then
    awk -v k="$KILN_SPS" -v p="$BEST_SPS" \
        'BEGIN { printf "kiln / pytorch-best = %.3f\n", (p > 0 ? k / p : 0) }'
    # GEMM work per training sample of 784-512-256-10: forward, weight
    # gradients, and input gradients of fc2 and fc3 (fc1's input is data).
    FLOPS=2407424
    GEMM=${GEMM:-./bench/gemm_peak}
    if [ -x "$GEMM" ]; then
        peak=$("$GEMM" --threads "$THREADS" | json_line_any | tail -n 1)
        echo "oneDNN GEMM peak here (via kiln's cpu device): $peak"
        pk=$(printf '%s' "$peak" | "$PYTHON" -c 'import json,sys; print(json.loads(sys.stdin.read())["gflops"])')
        awk -v k="$KILN_SPS" -v f="$FLOPS" -v pk="$pk" -v p="$BEST_SPS" 'BEGIN {
            printf "kiln whole step: %.1f GFLOP/s = %.0f%% of the GEMM peak (%.1f GFLOP/s); pytorch-best: %.1f GFLOP/s = %.0f%%\n",
                k * f / 1e9, 100 * k * f / 1e9 / pk, pk, p * f / 1e9, 100 * p * f / 1e9 / pk }'
    fi
fi
