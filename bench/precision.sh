#!/bin/sh
# bf16 side by side, interleaved: kiln precision = bf16 against kiln fp32 and
# against PyTorch's bf16 CPU autocast at its best, on the Fashion-MNIST CNN
# (bench/cnn_bench.ini, bench/pytorch_cnn.py) or MLP (bench/mlp_bench.ini,
# bench/pytorch_mlp.py).
#
# Each repetition runs every setting once, in turn, so that the load of this
# shared machine falls on all of them alike; medians over the repetitions:
#   kiln-fp32       $KILN train <ini> run.precision=fp32
#   kiln-bf16       $KILN train <ini> run.precision=bf16 (the default
#                   [plugin.cpu] bf16_conv = bf16_gemm = auto: each bf16
#                   convolution and GEMM timed in oneDNN's bf16 and f32
#                   kernels at prepare, the faster kept)
#   kiln-bf16-bf16k the same with bf16_conv = bf16_gemm = bf16 (oneDNN's
#                   bf16 kernels everywhere)
#   kiln-bf16-f32k  the same with bf16_conv = bf16_gemm = f32 (oneDNN's f32
#                   kernels on the bf16 tensors everywhere)
#   torch-bf16-*    the PyTorch script with --precision bf16 under the three
#                   OpenMP settings of cnn.sh/mlp.sh (default, passive =
#                   OMP_WAIT_POLICY=PASSIVE, omp1 = one thread), all with
#                   common.sh's BLAS_ENV; the best median counts.
# kiln's samples/s include its warm-up steps, PyTorch's exclude 20.
#
# Usage: bench/precision.sh [--model cnn|mlp] [--runs N] [--steps N]
#                           [--threads N] [--layout nchw|nhwc]
#   --model M     cnn (default) or mlp
#   --runs N      repetitions (default 3)
#   --steps N     timed training steps (default 200; kiln runs N+20)
#   --threads N   threads of kiln and PyTorch (default 2)
#   --layout L    the CNN's activation layout (default nchw)
#   --anchors     instead: bench/anchors.sh --bench cnn-bf16 (kiln bf16
#                 beside PyTorch 2.x eager, torch.compile, Lightning
#                 "bf16-mixed" and 1.13, all bf16, interleaved)
# Environment: KILN (default ./kiln), PYTHON (default /usr/bin/python3).
# Run from the top of a built source tree.

set -eu

MODEL=cnn
RUNS=3
STEPS=200
THREADS=2
LAYOUT=nchw
ANCHORS=0
WARMUP=20
BATCH=128
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

while [ $# -gt 0 ]; do
    case $1 in
        --model) [ $# -ge 2 ] || usage; MODEL=$2; shift 2 ;;
        --runs) [ $# -ge 2 ] || usage; RUNS=$2; shift 2 ;;
        --steps) [ $# -ge 2 ] || usage; STEPS=$2; shift 2 ;;
        --threads) [ $# -ge 2 ] || usage; THREADS=$2; shift 2 ;;
        --layout) [ $# -ge 2 ] || usage; LAYOUT=$2; shift 2 ;;
        --anchors) ANCHORS=1; shift ;;
        -h|--help) usage ;;
        *) echo "precision.sh: unknown argument: $1" >&2; usage ;;
    esac
done
case $MODEL in cnn|mlp) ;; *) echo "precision.sh: --model cnn or mlp" >&2; exit 2 ;; esac
case $LAYOUT in nchw|nhwc) ;; *) echo "precision.sh: --layout nchw or nhwc" >&2; exit 2 ;; esac
for v in "$RUNS" "$STEPS" "$THREADS"; do
    case $v in ''|*[!0-9]*|0) echo "precision.sh: --runs, --steps, --threads: positive integers" >&2; exit 2 ;; esac
done
[ -x "$KILN" ] || { echo "precision.sh: $KILN not found (set KILN=)" >&2; exit 1; }

[ "$ANCHORS" = 0 ] || exec "$HERE/anchors.sh" --bench cnn-bf16 --runs "$RUNS" --threads "$THREADS" --steps "$STEPS"

bench_tmpdir precision-bench
unset OMP_WAIT_POLICY OMP_NUM_THREADS

KSTEPS=$((WARMUP + STEPS))
echo "load average before: $(cut -d" " -f1-3 /proc/loadavg)" >&2

kiln_once() { # precision [key=value...]
    p=$1; shift
    if [ "$MODEL" = cnn ]; then
        set -- "$HERE/cnn_bench.ini" model.layout="$LAYOUT" data.limit=$((KSTEPS * BATCH)) \
            train.max_steps="$KSTEPS" train.eval=0 run.precision="$p" "$@"
    else
        set -- "$HERE/mlp_bench.ini" data.limit=$((KSTEPS * BATCH)) train.max_steps="$KSTEPS" \
            train.eval=0 run.precision="$p" "$@"
    fi
    env $BLAS_ENV "$KILN" train "$@" run.threads="$THREADS" train.batch="$BATCH" \
        run.out_dir= 2> "$TMP/kiln.err" | json_line
}

torch_once() { # threads, env assignments...
    nt=$1; shift
    if [ "$MODEL" = cnn ]; then # --steps: timed steps
        set -- "$@" "$PYTHON" "$HERE/pytorch_cnn.py" --layout "$LAYOUT" --eval-samples 500 \
            --steps "$STEPS"
    else # --steps: all steps, warm-up included
        set -- "$@" "$PYTHON" "$HERE/pytorch_mlp.py" --steps "$KSTEPS"
    fi
    env $BLAS_ENV "$@" --threads "$nt" --warmup-steps "$WARMUP" \
        --batch "$BATCH" --precision bf16 | json_line
}

record() { # name, line
    if [ -z "$2" ]; then
        echo "precision.sh: $1 printed no result" >&2
        [ -s "$TMP/kiln.err" ] && tail -n 3 "$TMP/kiln.err" >&2
        exit 1
    fi
    echo "$1 run $i: $2" >&2
    case $1 in kiln-bf16) # the kernels `auto` chose, once
        [ "$i" -eq 1 ] && grep ': the \(bf16\|f32\) kernel$' "$TMP/kiln.err" | sed 's/^/  /' >&2 ;;
    esac
    printf '%s\n' "$2" >> "$TMP/$1.jsonl"
}

i=1
while [ "$i" -le "$RUNS" ]; do
    record kiln-fp32 "$(kiln_once fp32)"
    record kiln-bf16 "$(kiln_once bf16)"
    record kiln-bf16-bf16k "$(kiln_once bf16 plugin.cpu.bf16_conv=bf16 plugin.cpu.bf16_gemm=bf16)"
    record kiln-bf16-f32k "$(kiln_once bf16 plugin.cpu.bf16_conv=f32 plugin.cpu.bf16_gemm=f32)"
    record torch-bf16-default "$(torch_once "$THREADS")"
    record torch-bf16-passive "$(torch_once "$THREADS" OMP_WAIT_POLICY=PASSIVE)"
    record torch-bf16-omp1 "$(torch_once 1 OMP_NUM_THREADS=1)"
    i=$((i + 1))
done

"$PYTHON" - "$TMP" "$MODEL" "$LAYOUT" "$RUNS" "$THREADS" "$($KILN plugins 2>/dev/null | grep -o 'oneDNN [0-9][^,]*, ISA [^,]*' | head -n 1)" <<'EOF'
import json, statistics, sys
tmp, model, layout, runs, threads, isa = sys.argv[1:7]
med = {}
import os
for name in ("kiln-fp32", "kiln-bf16", "kiln-bf16-bf16k", "kiln-bf16-f32k", "torch-bf16-default",
             "torch-bf16-passive", "torch-bf16-omp1"):
    if not os.path.exists(f"{tmp}/{name}.jsonl"):
        continue
    vals = [json.loads(l)["train_samples_per_s"] for l in open(f"{tmp}/{name}.jsonl") if l.strip()]
    med[name] = statistics.median(vals)
    print(f"{name:20s} {med[name]:10.1f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in vals)})")
best = max(("torch-bf16-default", "torch-bf16-passive", "torch-bf16-omp1"), key=lambda k: med[k])
print(f"model {model}{' ' + layout if model == 'cnn' else ''}, {threads} threads, median of {runs}, {isa}")
print(f"kiln bf16 / PyTorch bf16 autocast best ({best}): {med['kiln-bf16'] / med[best]:.3f}x")
print(f"kiln bf16 / kiln fp32: {med['kiln-bf16'] / med['kiln-fp32']:.3f}x")
for k, what in (("kiln-bf16-bf16k", "bf16 kernels"), ("kiln-bf16-f32k", "f32 kernels")):
    print(f"kiln bf16 ({what} forced) / PyTorch bf16 best: {med[k] / med[best]:.3f}x, "
          f"/ kiln fp32: {med[k] / med['kiln-fp32']:.3f}x")
print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")
EOF
