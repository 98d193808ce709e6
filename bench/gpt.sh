#!/bin/sh
# GPT-2 training steps side by side on the CPU: kiln vs PyTorch 2.x (eager
# and torch.compile) vs llm.c's CPU trainer, on the same GPT-2-shaped model
# (examples/gpt2_small.ini's blocks: pre-norm, tanh GELU, lm_head tied to
# wte), the same B x T tokens per step, the same threads, AdamW.
#
# bench/gpt_inputs.py writes a random token shard and a randomly initialised
# model in llm.c's formats (nothing is downloaded).  Then RUNS rounds, each
# running every system once (interleaved, so load changes hit all alike):
#   kiln           $KILN train on a config written here (the llm.c model
#                  file as [model] init_from, the shard as [data] path,
#                  log_every 1); step time = B / the median samples_per_s of
#                  its steps after the first WARMUP
#   torch eager    $TORCH_PYTHON bench/pytorch_gpt2.py (WARMUP untimed steps)
#                  from the same model.bin and the same batches of train.bin
#                  as kiln (--init, --tokens): the same model, the same losses
#   torch compile  the same with --compile (its warm-up compiles)
#   llm.c          $LLMC MODEL SHARD B T STEPS: a binary built OUTSIDE this
#                  repository around llm.c's train_gpt2.c (its training loop
#                  body unchanged; see docs/PERFORMANCE.md for the driver
#                  and how it was built); median of its "took X ms" after
#                  the first WARMUP.  Skipped when LLMC is unset.
#   kiln rc=auto   (--recompute) kiln again with train.recompute=auto: the
#                  step time recomputation costs, beside recompute=none
# Reported: the median over the rounds of each system's step time, tokens/s,
# GFLOP/s and % of the GEMM peak (bench/gemm_peak, best before/after), and
# torch.compile's compilation time (its warm-up steps' wall time, median over
# the rounds; never part of its step time).
# FLOPs per token of a training step: 6 N + 6 L T C (N = 12 L C^2 + V C,
# the matmul weights with lm_head; the attention's QK^T and PV, causal
# half, forward and backward), the usual count (Kaplan et al., PaLM).
#
# Usage: bench/gpt.sh [--runs N] [--steps N] [--threads N] [--precision P]
#                     [--layers L] [--dim C] [--heads H] [--vocab V]
#                     [--context T] [--batch B] [--warmup W] [--short]
#                     [--recompute]
#        bench/gpt.sh --suite [--short] [--shape S] [--runs N] [--steps N] [--threads N]
#        bench/gpt.sh --gpt2 [--precision P] [--runs N]
#        bench/gpt.sh --cpu [--shape S] [--threads N] [--runs N] [--steps N] [--warmup W]
#   --suite: the issue's side by side in one command: the char GPT
#   (examples/gpt_char.ini's shape: 4 x 128, 4 heads, V 256, T 128, B 16)
#   and the reduced GPT-2 shape (12 x 768, 12 heads, V 50304, T 64, B 4,
#   with --recompute in fp32), each in fp32 and bf16 (llm.c in fp32 only),
#   one table each, then one summary table of the four.
#   --short: 1 round of 4 steps (the first untimed): a quick look; the
#   figures want the default 3 rounds.
#   --shape char|gpt2: the suite's two shapes by name (char: 4 x 128, 4 heads,
#   V 256, T 128, B 16; gpt2: 12 x 768, 12 heads, V 50304, T 64, B 4); with
#   --suite, only that shape (fp32 and bf16).
#   --gpt2: the quiet multi-round 12 x 768 figure in one command: --shape
#   gpt2, 3 rounds of 5 steps (the first untimed), kiln, eager, compile and
#   llm.c (LLMC set) interleaved; about 5 minutes on a quiet 2-core machine
#   (with --precision bf16: kiln and autocast-bf16 PyTorch).
#   --cpu: CPU seconds (user + sys) per step instead of wall time, kiln and
#   torch eager interleaved: each system runs WARMUP steps and then STEPS
#   steps as two processes, and the difference of their CPU seconds over
#   STEPS - WARMUP is its step's CPU (start-up, data and warm-up cancel);
#   with --threads 1 a figure that a loaded machine leaves nearly intact.
#   GOMP_SPINCOUNT=0 for kiln, so that waiting at a barrier costs no CPU.
#   defaults: 3 runs, 6 steps (of which the first 2 untimed), 2 threads,
#   fp32, GPT-2 small's shape (12 x 768, 12 heads, V 50304) at B 4, T 64
#   (llm.c's train_gpt2.c's B and T).
# Environment:
#   KILN          kiln binary (default ./kiln)
#   TORCH_PYTHON  Python with PyTorch 2.x (default /work/scratch/venv/bin/python
#                 when it has torch, else /usr/bin/python3: PyTorch 1.13, whose
#                 torch.compile is missing: that column then says n/a)
#   LLMC          the llm.c driver binary (unset or not executable: no llm.c
#                 row, and the table says why)
#   KILN_ARGS     extra settings for kiln's run, e.g. train.recompute=auto
#   GEMM          GEMM peak probe (default ./bench/gemm_peak)
# Run from the top of the source tree.

set -eu

RUNS=3
STEPS=6
WARMUP=2
RECOMPUTE=0
CPU=0
THREADS=2
PRECISION=fp32
L=12 C=768 H=12 V=50304 T=64 B=4
KILN=${KILN:-./kiln}
PYTHON=/usr/bin/python3
if [ -z "${TORCH_PYTHON:-}" ]; then
    TORCH_PYTHON=/usr/bin/python3
    ls -d /work/scratch/venv/lib/python3*/site-packages/torch/ >/dev/null 2>&1 &&
        TORCH_PYTHON=/work/scratch/venv/bin/python
fi
LLMC=${LLMC:-}
GEMM=${GEMM:-./bench/gemm_peak}
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

# shape_args NAME: the options of the suite's shape NAME
shape_args() {
    case $1 in
        char) echo --layers 4 --dim 128 --heads 4 --vocab 256 --context 128 --batch 16 ;;
        gpt2) echo --layers 12 --dim 768 --heads 12 --vocab 50304 --context 64 --batch 4 ;;
        *) echo "gpt.sh: --shape must be char or gpt2" >&2; exit 2 ;;
    esac
}

if [ "${1:-}" = --gpt2 ]; then
    shift
    # shellcheck disable=SC2046 # one word per option
    exec "$0" $(shape_args gpt2) --runs 3 --steps 5 --warmup 1 "$@"
fi
if [ "${1:-}" = --suite ]; then
    shift
    SHAPES="char gpt2"
    if [ "${1:-}" = --shape ]; then
        [ $# -ge 2 ] || usage
        shape_args "$2" >/dev/null || exit 2
        SHAPES=$2
        shift 2
    fi
    SUITE_SUMMARY=$(mktemp "${TMPDIR:-/tmp}/kiln-gpt-suite.XXXXXX")
    export SUITE_SUMMARY
    trap 'rm -f "$SUITE_SUMMARY"; bench_cache_rm' EXIT
    for p in fp32 bf16; do
        for sh in $SHAPES; do
            rc=
            [ $p = fp32 ] && [ "$sh" = gpt2 ] && rc=--recompute
            # shellcheck disable=SC2046 # one word per option
            "$0" $(shape_args "$sh") --precision $p $rc "$@"
        done
    done
    echo
    echo "Summary (tokens/s; x = kiln's speed-up; best torch = the faster of eager and compile):"
    printf '%-22s %9s %9s %9s %9s %9s %7s %7s %6s\n' shape kiln eager compile llm.c comp_s \
        x_torch x_llmc %peak
    cat "$SUITE_SUMMARY"
    exit 0
fi
while [ $# -gt 0 ]; do
    case $1 in
        --layers) L=$2; shift 2 ;;
        --dim) C=$2; shift 2 ;;
        --heads) H=$2; shift 2 ;;
        --vocab) V=$2; shift 2 ;;
        --context) T=$2; shift 2 ;;
        --batch) B=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --short) RUNS=1 STEPS=4 WARMUP=1; shift ;;
        --shape) [ $# -ge 2 ] || usage
                 _sa=$(shape_args "$2") || exit 2
                 shift 2
                 # shellcheck disable=SC2086 # one word per option
                 set -- $_sa "$@" ;;
        --recompute) RECOMPUTE=1; shift ;;
        --cpu) CPU=1; shift ;;
        -h|--help) usage ;;
        *) bench_opt "$@" || { echo "gpt.sh: unknown argument: $1" >&2; usage; }
           shift "$NSHIFT" ;;
    esac
done
case $PRECISION in fp32|bf16) ;; *) echo "gpt.sh: --precision must be fp32 or bf16" >&2; exit 2 ;; esac
for v in "runs:$RUNS" "steps:$STEPS" "threads:$THREADS" "layers:$L" "dim:$C" "heads:$H" \
         "vocab:$V" "context:$T" "batch:$B"; do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "gpt.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
[ "$STEPS" -gt "$WARMUP" ] || { echo "gpt.sh: --steps must exceed --warmup ($WARMUP)" >&2; exit 2; }
[ $((C % H)) -eq 0 ] || { echo "gpt.sh: --dim must be a multiple of --heads" >&2; exit 2; }

LLMC_WHY=
if [ -z "$LLMC" ]; then
    LLMC_WHY="LLMC is unset (docs/PERFORMANCE.md: how to build llm.c's driver outside the tree)"
elif [ ! -x "$LLMC" ]; then
    LLMC_WHY="LLMC=$LLMC is not an executable file"
elif [ "$PRECISION" != fp32 ]; then
    LLMC_WHY="llm.c's CPU trainer is fp32 only"
fi

bench_tmpdir gpt-bench
"$PYTHON" "$HERE/gpt_inputs.py" "$TMP" "$L" "$C" "$H" "$V" "$T" $(((STEPS + 1) * B * T + 1))

# kiln's config: examples/gpt2_small.ini's layers at this size
{
    printf '[run]\nseed = 1\nthreads = %s\nprecision = %s\n' "$THREADS" "$PRECISION"
    printf '[model]\ninit_from = %s/model.bin\n' "$TMP"
    printf '[data]\nsource = tokens\npath = %s/train.bin\ncontext = %s\nvocab = %s\nshuffle = 0\n' "$TMP" "$T" "$V"
    printf '[train]\noptimizer = adamw\nlr = 1e-4\nweight_decay = 0\nbatch = %s\nepochs = 1\n' "$B"
    printf 'max_steps = %s\nlog_every = 1\neval = 0\ncheckpoint_last = 0\n' "$STEPS"
    printf '[layer.transformer.wte]\ntype = embedding\nvocab = %s\ndim = %s\n' "$V" "$C"
    printf '[layer.transformer.wpe]\ntype = pos_embedding\nmax_len = %s\n' "$T"
    prev=transformer.wpe
    i=0
    while [ $i -lt "$L" ]; do
        h=transformer.h.$i
        printf '[layer.%s.ln_1]\ntype = layernorm\ninput = %s\n' $h $prev
        printf '[layer.%s.attn.c_attn]\ntype = linear\nout = %s\n' $h $((3 * C))
        printf '[layer.%s.attn.sdpa]\ntype = attention\nheads = %s\n' $h "$H"
        printf '[layer.%s.attn.c_proj]\ntype = linear\nout = %s\n' $h "$C"
        printf '[layer.%s.res_1]\ntype = add\ninputs = %s.attn.c_proj, %s\n' $h $h $prev
        printf '[layer.%s.ln_2]\ntype = layernorm\n' $h
        printf '[layer.%s.mlp.c_fc]\ntype = linear\nout = %s\n' $h $((4 * C))
        printf '[layer.%s.mlp.gelu]\ntype = gelu\napproximate = tanh\n' $h
        printf '[layer.%s.mlp.c_proj]\ntype = linear\nout = %s\n' $h "$C"
        printf '[layer.%s.res_2]\ntype = add\ninputs = %s.mlp.c_proj, %s.res_1\n' $h $h $h
        prev=$h.res_2
        i=$((i + 1))
    done
    printf '[layer.transformer.ln_f]\ntype = layernorm\n'
    printf '[layer.lm_head]\ntype = linear\nout = %s\nbias = 0\ntie = transformer.wte\n' "$V"
    printf '[layer.loss]\ntype = softmax_xent\n'
} >"$TMP/gpt.ini"

# FLOPs per token of a training step (see the header)
FLOPS_TOKEN=$(awk -v L="$L" -v C="$C" -v V="$V" -v T="$T" \
    'BEGIN { printf "%.0f", 6 * (12 * L * C * C + V * C) + 6 * L * T * C }')

# kiln_step TAG [SETTING...]: kiln's median step seconds after WARMUP steps
kiln_step() {
    _k=$1
    shift
    # shellcheck disable=SC2086 # one argument per setting
    "$KILN" train "$TMP/gpt.ini" "run.out_dir=$TMP/kiln$_k" ${KILN_ARGS:-} "$@" \
        >"$TMP/kiln$_k.out" 2>&1 ||
        { echo "gpt.sh: kiln failed:" >&2; tail -5 "$TMP/kiln$_k.out" >&2; echo n/a; return; }
    "$PYTHON" - "$TMP/kiln$_k/metrics.jsonl" "$WARMUP" "$B" <<'PY'
import json, statistics, sys
rates = [e["samples_per_s"] for e in map(json.loads, filter(str.strip, open(sys.argv[1])))
         if e.get("event") == "train"][int(sys.argv[2]):]
print(int(sys.argv[3]) / statistics.median(rates) if rates else "n/a")
PY
}

# torch_step RUN [--compile]
torch_step() {
    _r=$1
    shift
    "$TORCH_PYTHON" "$HERE/pytorch_gpt2.py" --layers "$L" --dim "$C" --heads "$H" --vocab "$V" \
        --context "$T" --batch "$B" --steps $((STEPS - WARMUP)) --warmup "$WARMUP" \
        --threads "$THREADS" --precision "$PRECISION" --init "$TMP/model.bin" \
        --tokens "$TMP/train.bin" "$@" >"$TMP/torch$_r$*.out" 2>&1 ||
        { echo "gpt.sh: PyTorch $* failed:" >&2; tail -3 "$TMP/torch$_r$*.out" >&2; echo n/a; return; }
    grep '^{' "$TMP/torch$_r$*.out" | tail -n 1 | field step_s
    [ "$*" != --compile ] ||
        grep '^{' "$TMP/torch$_r$*.out" | tail -n 1 | field warmup_s >>"$TMP/compile_s"
}

# llmc_step RUN
llmc_step() {
    OMP_NUM_THREADS=$THREADS "$LLMC" "$TMP/model.bin" "$TMP/train.bin" "$B" "$T" "$STEPS" \
        >"$TMP/llmc$1.out" 2>&1 ||
        { echo "gpt.sh: llm.c failed:" >&2; tail -3 "$TMP/llmc$1.out" >&2; echo n/a; return; }
    sed -n 's/.*took \([0-9.]*\) ms.*/\1/p' "$TMP/llmc$1.out" | tail -n +$((WARMUP + 1)) |
        median | awk '{ print $1 / 1000 }'
}

# cpu_s FILE: user + sys seconds in FILE (/usr/bin/time -f '%U %S')
cpu_s() { awk '{ print $1 + $2 }' "$1"; }

# cpu_step SYSTEM RUN: SYSTEM's (kiln or eager) CPU seconds per step, from
# a WARMUP-step and a STEPS-step process
cpu_step() {
    for _n in "$WARMUP" "$STEPS"; do
        if [ "$1" = kiln ]; then
            # shellcheck disable=SC2086 # one argument per setting
            GOMP_SPINCOUNT=0 /usr/bin/time -f '%U %S' -o "$TMP/cpu_$_n" "$KILN" train "$TMP/gpt.ini" \
                "run.out_dir=$TMP/cpukiln$2_$_n" train.max_steps="$_n" ${KILN_ARGS:-} \
                >"$TMP/cpukiln$2_$_n.out" 2>&1
        else
            /usr/bin/time -f '%U %S' -o "$TMP/cpu_$_n" "$TORCH_PYTHON" "$HERE/pytorch_gpt2.py" \
                --layers "$L" --dim "$C" --heads "$H" --vocab "$V" --context "$T" --batch "$B" \
                --steps "$_n" --warmup 0 --threads "$THREADS" --precision "$PRECISION" \
                --init "$TMP/model.bin" --tokens "$TMP/train.bin" >"$TMP/cputorch$2_$_n.out" 2>&1
        fi || { echo "gpt.sh: $1 failed (--cpu)" >&2; echo n/a; return; }
    done
    awk -v a="$(cpu_s "$TMP/cpu_$WARMUP")" -v b="$(cpu_s "$TMP/cpu_$STEPS")" -v n=$((STEPS - WARMUP)) \
        'BEGIN { printf "%.4f\n", (b - a) / n }'
}

if [ "$CPU" = 1 ]; then
    : >"$TMP/kiln"
    : >"$TMP/eager"
    r=1
    while [ $r -le "$RUNS" ]; do
        echo "round $r of $RUNS (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        cpu_step kiln $r >>"$TMP/kiln"
        cpu_step eager $r >>"$TMP/eager"
        printf '  kiln %s  eager %s\n' "$(tail -n 1 "$TMP/kiln")" "$(tail -n 1 "$TMP/eager")" >&2
        r=$((r + 1))
    done
    echo
    echo "GPT-2 shape: $L layers x $C channels, $H heads, vocab $V; B $B x T $T; $THREADS threads, $PRECISION;"
    echo "CPU seconds (user + sys) per step: ($STEPS-step run - $WARMUP-step run) / $((STEPS - WARMUP)), median of $RUNS rounds;"
    echo "load average now $(cut -d' ' -f1-3 /proc/loadavg)."
    k=$(grep '^[0-9]' "$TMP/kiln" | median) e=$(grep '^[0-9]' "$TMP/eager" | median)
    printf '%-16s %12s %10s\n' system cpu_s/step kiln_x
    awk -v k="$k" -v e="$e" 'BEGIN {
        printf "%-16s %12.4f %9.2fx\n", "kiln", k, 1
        printf "%-16s %12.4f %9.2fx\n", "torch eager", e, (k > 0 ? e / k : 0) }'
    exit 0
fi

measure_peak
for f in kiln kilnrc eager compile llmc compile_s; do : >"$TMP/$f"; done
r=1
while [ $r -le "$RUNS" ]; do
    echo "round $r of $RUNS (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    kiln_step $r >>"$TMP/kiln"
    [ "$RECOMPUTE" = 0 ] || kiln_step rc$r train.recompute=auto >>"$TMP/kilnrc"
    torch_step $r >>"$TMP/eager"
    torch_step $r --compile >>"$TMP/compile"
    [ -n "$LLMC_WHY" ] || llmc_step $r >>"$TMP/llmc"
    for s in kiln kilnrc eager compile llmc; do
        printf '  %-8s %s\n' $s "$(tail -n 1 "$TMP/$s" 2>/dev/null)" >&2
    done
    r=$((r + 1))
done
measure_peak

# med FILE: the median of FILE's numbers; empty when it has none
med() { ! grep -q '^[0-9]' "$1" || grep '^[0-9]' "$1" | median; }
TORCH_VERSION=$("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
echo
echo "GPT-2 shape: $L layers x $C channels, $H heads, vocab $V; B $B x T $T = $((B * T)) tokens/step;"
echo "$THREADS threads, $PRECISION, AdamW; median of $RUNS rounds of $((STEPS - WARMUP)) timed steps after $WARMUP;"
echo "load average now $(cut -d' ' -f1-3 /proc/loadavg); PyTorch $TORCH_VERSION ($TORCH_PYTHON)."
awk -v f="$FLOPS_TOKEN" 'BEGIN { printf "training FLOPs per token: %.3f G\n", f / 1e9 }'
if awk -v p="$PEAK" 'BEGIN { exit !(p > 0) }'; then
    echo "GEMM peak ($GEMM --threads $THREADS, best before/after): $PEAK GFLOP/s"
fi
printf '%-16s %10s %10s %10s %7s %10s\n' system step_s tokens/s GFLOP/s %peak kiln_x
KS=$(med "$TMP/kiln")
for s in kiln kilnrc eager compile llmc; do
    m=$(med "$TMP/$s")
    [ -n "$m" ] || continue
    awk -v s="$s" -v m="$m" -v n=$((B * T)) -v f="$FLOPS_TOKEN" -v pk="$PEAK" -v k="${KS:-0}" 'BEGIN {
        names["kiln"] = "kiln"; names["kilnrc"] = "kiln rc=auto"; names["eager"] = "torch eager"; names["compile"] = "torch compile"
        names["llmc"] = "llm.c"
        g = n * f / m / 1e9
        pct = pk > 0 ? 100 * g / pk : 0
        x = k > 0 ? m / k : 0
        printf "%-16s %10.3f %10.1f %10.1f %6.1f%% %9.2fx\n", names[s], m, n / m, g, pct, x }'
done
echo "(kiln_x: the system's step time over kiln's: kiln's speed-up over it)"
CS=$(med "$TMP/compile_s")
[ -z "$CS" ] || echo "torch.compile: compilation (its $WARMUP warm-up steps) ${CS} s, not in its step time"
[ -z "$LLMC_WHY" ] || echo "llm.c: skipped: $LLMC_WHY"
RC=$(med "$TMP/kilnrc")
[ -z "$RC" ] || [ -z "$KS" ] ||
    awk -v a="$RC" -v n="$KS" 'BEGIN { printf "recompute=auto: %+.1f%% step time over recompute=none\n", 100 * (a / n - 1) }'
if [ -n "${SUITE_SUMMARY:-}" ]; then
    awk -v k="${KS:-0}" -v e="$(med "$TMP/eager")" -v c="$(med "$TMP/compile")" \
        -v l="$(med "$TMP/llmc")" -v cs="${CS:-}" -v n=$((B * T)) -v f="$FLOPS_TOKEN" \
        -v pk="$PEAK" -v shape="${L}x${C} T$T B$B $PRECISION" 'BEGIN {
        tk = k > 0 ? n / k : 0
        best = (e != "" && c != "") ? (e < c ? e : c) : (e != "" ? e : c)
        printf "%-22s %9.1f %9s %9s %9s %9s %7s %7s %6s\n", shape, tk,
            e != "" ? sprintf("%.1f", n / e) : "n/a", c != "" ? sprintf("%.1f", n / c) : "n/a",
            l != "" ? sprintf("%.1f", n / l) : "n/a", cs != "" ? sprintf("%.0f", cs) : "n/a",
            (best != "" && k > 0) ? sprintf("%.2f", best / k) : "n/a",
            (l != "" && k > 0) ? sprintf("%.2f", l / k) : "n/a",
            (pk > 0 && k > 0) ? sprintf("%.1f", 100 * n * f / k / 1e9 / pk) : "n/a" }' >>"$SUITE_SUMMARY"
fi
