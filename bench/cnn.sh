#!/bin/sh
# Side-by-side CNN benchmark on Fashion-MNIST: kiln vs PyTorch (CPU), for
# both activation layouts (nchw, nhwc = channels-last).
#
# Model of examples/fashion_mnist_cnn.ini (conv5x5-32, pool, conv5x5-64, pool,
# fc1024, dropout 0.4, fc10), batch 128, fp32. For each layout:
# PyTorch (bench/pytorch_cnn.py --layout L) runs under three OpenMP
# environments, all with common.sh's BLAS_ENV (SkylakeX kernels on AVX-512):
#   default   nothing else set
#   passive   OMP_WAIT_POLICY=PASSIVE
#   omp1      OMP_NUM_THREADS=1 (and torch.set_num_threads(1))
# Each setting runs N times and the median counts. The fastest setting is
# "pytorch-best", chosen separately for training and for evaluation. kiln then
# runs N times with
#   $KILN train bench/cnn_bench.ini model.layout=L run.threads=T
#       data.limit=S*128 train.max_steps=S data.eval.limit=E
# i.e. one short epoch of S = --steps + 20 steps (kiln's train_samples_per_s
# includes its warm-up steps; PyTorch's excludes its 20) and one evaluation of
# E test samples in batches of 500, and its medians are compared with
# pytorch-best. kiln's eval samples/s is its "eval_samples_per_s" field, "n/a"
# while kiln does not print one. GFLOP/s are computed from this model's FLOPs
# per sample and compared with bench/gemm_peak.
#
# Usage: bench/cnn.sh [--runs N] [--steps N] [--threads N] [--eval-samples N]
#                     [--layouts nchw,nhwc] [--no-kiln]
#   --runs N          repetitions per setting (default 3)
#   --steps N         PyTorch timed training steps after 20 untimed warm-up
#                     steps (default 200); kiln runs N+20 steps, all timed
#   --threads N       intra-op threads of PyTorch and kiln (default 2)
#   --eval-samples N  test samples for the evaluation timing (default 5000)
#   --layouts LIST    comma-separated layouts to run (default nchw,nhwc)
#   --precision P     fp32 (default) or bf16: PyTorch runs under CPU autocast
#                     (bench/pytorch_cnn.py --precision bf16), kiln with
#                     run.precision=bf16
#   --no-kiln         run only the PyTorch half
#   --anchors         instead: bench/anchors.sh for these layouts (or
#                     cnn-bf16 with --precision bf16): kiln beside PyTorch
#                     2.x eager, torch.compile, Lightning and 1.13, interleaved
# Environment:
#   KILN     kiln binary (default ./kiln)
#   PYTHON   Python with PyTorch (default /usr/bin/python3)
#   GEMM     GEMM peak probe (default ./bench/gemm_peak)
#   LD_LIBRARY_PATH is passed on; check the "blas" and "mkldnn" fields in the
#   PyTorch JSON lines (PyTorch's convolutions run in oneDNN, "conv_ops").
# Exit status: 0, or 1 when a PyTorch run failed or any kiln run failed (the
# tables are printed first, with kiln marked as failed).
# Run from the top of the source tree.

set -eu

RUNS=3
STEPS=200
WARMUP=20
THREADS=2
EVAL_SAMPLES=5000
LAYOUTS=nchw,nhwc
DO_KILN=1
ANCHORS=0
PRECISION=fp32
BATCH=128
TRAIN_SAMPLES=60000
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-/usr/bin/python3}
GEMM=${GEMM:-./bench/gemm_peak}
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

while [ $# -gt 0 ]; do
    case $1 in
        --eval-samples) [ $# -ge 2 ] || usage; EVAL_SAMPLES=$2; shift 2 ;;
        --eval-samples=*) EVAL_SAMPLES=${1#*=}; shift ;;
        --layouts) [ $# -ge 2 ] || usage; LAYOUTS=$2; shift 2 ;;
        --layouts=*) LAYOUTS=${1#*=}; shift ;;
        --no-kiln) DO_KILN=0; shift ;;
        --anchors) ANCHORS=1; shift ;;
        -h|--help) usage ;;
        *) bench_opt "$@" || { echo "cnn.sh: unknown argument: $1" >&2; usage; }
           shift "$NSHIFT" ;;
    esac
done
case $PRECISION in fp32|bf16) ;; *) echo "cnn.sh: --precision must be fp32 or bf16" >&2; exit 2 ;; esac
for v in "runs:$RUNS" "steps:$STEPS" "threads:$THREADS" "eval-samples:$EVAL_SAMPLES"; do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "cnn.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
LAYOUTS=$(printf '%s' "$LAYOUTS" | tr ',' ' ')
for l in $LAYOUTS; do
    case $l in
        nchw|nhwc) ;;
        *) echo "cnn.sh: unknown layout: $l (nchw, nhwc)" >&2; exit 2 ;;
    esac
done
[ -n "$LAYOUTS" ] || { echo "cnn.sh: --layouts is empty" >&2; exit 2; }

# FLOPs per sample, a multiply-add counting 2. conv: 2*Cin*K*K*Cout*OH*OW,
# linear: 2*in*out; 28x28x1 -> conv1 (pad 2) 28x28x32 -> pool 14x14x32 ->
# conv2 (pad 2) 14x14x64 -> pool 7x7x64 -> fc1 3136->1024 -> fc2 1024->10.
# A training step does each layer's forward, its weight gradient (the same
# FLOPs again) and its input gradient (again), except conv1's input gradient,
# which nobody needs. Bias, ReLU, pooling, dropout and loss are not counted.
CONV1=$((2 * 1 * 5 * 5 * 32 * 28 * 28))
CONV2=$((2 * 32 * 5 * 5 * 64 * 14 * 14))
FC1=$((2 * 64 * 7 * 7 * 1024))
FC2=$((2 * 1024 * 10))
FWD_FLOPS=$((CONV1 + CONV2 + FC1 + FC2))
TRAIN_FLOPS=$((3 * FWD_FLOPS - CONV1))

# kiln: one epoch of WARMUP+STEPS steps over the first (WARMUP+STEPS)*BATCH
# samples, so that the epoch (and its evaluation) ends with the run; past one
# full epoch of the data, one full epoch.
KSTEPS=$((WARMUP + STEPS))
KLIMIT=$((KSTEPS * BATCH))
if [ "$KLIMIT" -ge "$TRAIN_SAMPLES" ]; then
    KSTEPS=$((TRAIN_SAMPLES / BATCH))
    KLIMIT=0
fi

if [ "$ANCHORS" = 1 ]; then
    list=$(for l in $LAYOUTS; do printf 'cnn-%s,' "$l"; done)
    [ "$PRECISION" = fp32 ] || list=cnn-bf16,
    exec "$HERE/anchors.sh" --bench "${list%,}" --runs "$RUNS" --threads "$THREADS" --steps "$STEPS"
fi

bench_tmpdir cnn-bench

# num_or_na WIDTH PRECISION VALUE: VALUE as %WIDTH.PRECISIONf, or a
# right-aligned "n/a" when it is not a number.
num_or_na() {
    case $3 in
        n/a|'') awk -v w="$1" 'BEGIN { printf "%" w "s", "n/a" }' ;;
        *) awk -v w="$1" -v p="$2" -v v="$3" 'BEGIN { printf "%" w "." p "f", v }' ;;
    esac
}

# ratio A B: A/B with 3 decimals, "n/a" unless both are positive numbers.
ratio() {
    case "$1$2" in *n/a*) echo n/a; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f\n", a / b; else print "n/a" }'
}

# gflops SPS FLOPS PEAK: "G GFLOP/s" columns: GFLOP/s and % of PEAK.
gflops_cols() {
    case "$1" in n/a|'') printf '%9s %6s' n/a n/a; return ;; esac
    awk -v s="$1" -v f="$2" -v pk="$3" 'BEGIN {
        g = s * f / 1e9
        if (pk > 0) printf "%9.1f %5.0f%%", g, 100 * g / pk; else printf "%9.1f %6s", g, "n/a" }'
}

run_pytorch() { # layout, name, threads, then env assignments
    layout=$1; name=$2; nthreads=$3; shift 3
    out="$TMP/pytorch-$layout-$name.jsonl"
    : > "$out"
    i=1
    while [ "$i" -le "$RUNS" ]; do
        rc=0
        env $BLAS_ENV "$@" "$PYTHON" "$HERE/pytorch_cnn.py" \
            --layout "$layout" --threads "$nthreads" --steps "$STEPS" \
            --warmup-steps "$WARMUP" --batch "$BATCH" \
            --eval-samples "$EVAL_SAMPLES" --precision "$PRECISION" > "$TMP/py.out" || rc=$?
        line=$(json_line < "$TMP/py.out")
        if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
            echo "cnn.sh: pytorch $layout $name run $i failed (exit $rc) or printed no JSON line" >&2
            exit 1
        fi
        echo "pytorch $layout $name run $i: $line" >&2
        printf '%s\n' "$line" >> "$out"
        i=$((i + 1))
    done
}

KILN_FAILED=0
# kiln_runs LAYOUT [KEY=VALUE...]: N runs into $TMP/kiln-$LAYOUT.jsonl; on a
# failure, say why, keep the last stderr line in $TMP/kiln-$LAYOUT.error and
# return 1.
kiln_runs() {
    layout=$1; shift
    out="$TMP/kiln-$layout.jsonl"
    : > "$out"
    i=1
    while [ "$i" -le "$RUNS" ]; do
        rc=0
        env $BLAS_ENV "$KILN" train "$HERE/cnn_bench.ini" \
            model.layout="$layout" run.threads="$THREADS" train.batch="$BATCH" \
            data.limit="$KLIMIT" train.max_steps="$KSTEPS" \
            data.eval.limit="$EVAL_SAMPLES" run.precision="$PRECISION" "$@" \
            > "$TMP/kiln.out" 2> "$TMP/kiln.err" || rc=$?
        line=$(json_line < "$TMP/kiln.out")
        if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
            {
                printf 'cnn.sh: kiln %s run %d%s FAILED (exit %d%s); its last stderr lines:\n' \
                    "$layout" "$i" "${1:+ with $*}" "$rc" \
                    "$([ -n "$line" ] || echo ', no JSON line with train_samples_per_s')"
                tail -n 5 "$TMP/kiln.err" | sed 's/^/    /'
            } >&2
            tail -n 1 "$TMP/kiln.err" > "$TMP/kiln-$layout.error"
            : > "$out"
            return 1
        fi
        echo "kiln $layout run $i${1:+ with $*}: $line" >&2
        printf '%s\n' "$line" >> "$out"
        i=$((i + 1))
    done
}

# run_kiln LAYOUT: kiln_runs; when that fails, measure training alone
# (train.eval=0) so that a broken evaluation still leaves a training figure.
run_kiln() {
    if kiln_runs "$1"; then
        return 0
    fi
    KILN_FAILED=1
    cp "$TMP/kiln-$1.error" "$TMP/kiln-$1.fullerror"
    echo "cnn.sh: retrying kiln $1 with train.eval=0 (training throughput only)" >&2
    if kiln_runs "$1" train.eval=0; then
        echo "training only (train.eval=0); with evaluation: $(cat "$TMP/kiln-$1.fullerror")" \
            > "$TMP/kiln-$1.note"
    else
        echo "cnn.sh: kiln $1 failed with train.eval=0 too; no kiln figures for $1" >&2
    fi
}

# Unset the variables under test so that the settings are what they say.
unset OMP_WAIT_POLICY OMP_NUM_THREADS

if [ "$DO_KILN" = 1 ] && [ ! -x "$KILN" ]; then
    echo "cnn.sh: $KILN not found or not executable (set KILN=, or --no-kiln)" >&2
    exit 1
fi

# The GEMM peak, best of its runs before and after the benchmarks (the
# machines are shared; one low reading would flatter every %pk).
measure_peak

for layout in $LAYOUTS; do
    run_pytorch "$layout" default "$THREADS"
    run_pytorch "$layout" passive "$THREADS" OMP_WAIT_POLICY=PASSIVE
    # one thread means one: torch.set_num_threads(1) as well as OpenMP's
    run_pytorch "$layout" omp1 1 OMP_NUM_THREADS=1
    if [ "$DO_KILN" = 1 ]; then
        run_kiln "$layout"
    fi
done

measure_peak

echo
echo "Fashion-MNIST CNN, batch $BATCH, $THREADS threads, precision $PRECISION, median of $RUNS runs per setting."
echo "PyTorch: $STEPS timed steps after $WARMUP warm-up steps; kiln: one epoch of $KSTEPS steps, all timed."
echo "Evaluation: $EVAL_SAMPLES test samples, batch 500, no gradients."
awk -v f="$FWD_FLOPS" -v t="$TRAIN_FLOPS" 'BEGIN {
    printf "FLOPs per sample: forward %.2f M, training step %.2f M (fwd + weight grads + input grads but conv1'"'"'s)\n", f / 1e6, t / 1e6 }'
if awk -v p="$PEAK" 'BEGIN { exit !(p > 0) }'; then
    echo "GEMM peak ($GEMM --threads $THREADS, square 2048 f32, best before/after): $PEAK GFLOP/s; %pk is against it."
else
    echo "GEMM peak: $GEMM not available, no %pk."
fi

for layout in $LAYOUTS; do
    echo
    echo "== layout $layout"
    printf '%-16s %12s %9s %6s %12s %9s %6s %9s\n' setting "train smp/s" "GFLOP/s" "%pk" \
        "eval smp/s" "GFLOP/s" "%pk" test_acc
    BEST_T_NAME=; BEST_T=0; BEST_E_NAME=; BEST_E=0
    for name in default passive omp1; do
        f="$TMP/pytorch-$layout-$name.jsonl"
        tr=$(median_field "$f" train_samples_per_s)
        ev=$(median_field "$f" eval_samples_per_s)
        acc=$(median_field "$f" test_acc)
        printf '%-16s %12s %s %12s %s %9s\n' "pytorch $name" \
            "$(num_or_na 12 1 "$tr")" "$(gflops_cols "$tr" "$TRAIN_FLOPS" "$PEAK")" \
            "$(num_or_na 12 1 "$ev")" "$(gflops_cols "$ev" "$FWD_FLOPS" "$PEAK")" \
            "$(num_or_na 9 4 "$acc")"
        if awk -v a="$tr" -v b="$BEST_T" 'BEGIN { exit !(a > b) }'; then
            BEST_T_NAME=$name; BEST_T=$tr
        fi
        if awk -v a="$ev" -v b="$BEST_E" 'BEGIN { exit !(a > b) }'; then
            BEST_E_NAME=$name; BEST_E=$ev
        fi
    done
    if [ "$DO_KILN" = 1 ]; then
        f="$TMP/kiln-$layout.jsonl"
        if [ -s "$f" ]; then
            ktr=$(median_field "$f" train_samples_per_s)
            kev=$(median_field "$f" eval_samples_per_s)
            kacc=$(median_field "$f" test_acc)
            printf '%-16s %12s %s %12s %s %9s\n' kiln \
                "$(num_or_na 12 1 "$ktr")" "$(gflops_cols "$ktr" "$TRAIN_FLOPS" "$PEAK")" \
                "$(num_or_na 12 1 "$kev")" "$(gflops_cols "$kev" "$FWD_FLOPS" "$PEAK")" \
                "$(num_or_na 9 4 "$kacc")"
            if [ -s "$TMP/kiln-$layout.note" ]; then
                echo "  kiln: $(cat "$TMP/kiln-$layout.note")"
            fi
        else
            printf '%-16s FAILED: %s\n' kiln "$(cat "$TMP/kiln-$layout.error" 2>/dev/null || echo '?')"
            ktr=n/a; kev=n/a
        fi
    fi
    awk -v tn="$BEST_T_NAME" -v t="$BEST_T" -v en="$BEST_E_NAME" -v e="$BEST_E" 'BEGIN {
        printf "pytorch best: train %s (%.1f samples/s), eval %s (%.1f samples/s)\n", tn, t, en, e }'
    if [ "$DO_KILN" = 1 ]; then
        echo "kiln / pytorch-best: train $(ratio "$ktr" "$BEST_T"), eval $(ratio "$kev" "$BEST_E")"
    fi
done

if [ "$KILN_FAILED" = 1 ]; then
    echo
    echo "cnn.sh: kiln failed for at least one layout (see above); exit status 1" >&2
    exit 1
fi
