#!/bin/sh
# kiln against today's anchors, every benchmark in one command: kiln, PyTorch
# 2.x eager at its best, PyTorch 2.x with torch.compile, a Lightning
# Trainer.fit of the same module, and Debian's PyTorch 1.13, side by side,
# interleaved (each repetition runs every row once, in turn, so that the load
# of a shared machine falls on all rows alike); medians over the repetitions.
#
# Benchmarks (--bench, comma-separated; default all; "training" = mlp,
# cnn-nchw, cnn-nhwc, cnn-bf16):
#   mlp        Fashion-MNIST MLP, one epoch (bench/mlp_bench.ini, pytorch_mlp.py)
#   cnn-nchw   Fashion-MNIST CNN, fp32, nchw (bench/cnn_bench.ini, pytorch_cnn.py)
#   cnn-nhwc   the same, channels-last
#   cnn-bf16   the same, nchw, bf16 (kiln run.precision=bf16; PyTorch CPU
#              autocast, Lightning precision "bf16-mixed")
#   gpt        examples/gpt_char.ini's model (pytorch_gpt.py)
#   data       the data loader: kiln's folder loader vs torchvision's
#              ImageFolder + DataLoader, 2.x and 1.13 (bench/data.sh's set-up)
#   ddp-mlp, ddp-cnn, ddp-cnn-nhwc ("ddp": all three): the MLP and the fp32
#              CNN (nchw, nhwc) data-parallel on 2 ranks of --threads / 2
#              threads each (at least 1), the same global batch (128):
#              kiln launch -n 2 (train.batch=64 a rank, [plugin.cpu] async
#              at its default, auto: each rank sync or async by the model's
#              size and a 40 ms probe of contention at the plan, turning async under contention;
#              docs/distributed.md, item 6) against torch.distributed gloo DDP
#              of 2 processes (pytorch_ddp.py, which imports the models of
#              pytorch_mlp.py and pytorch_cnn.py); their rows: kiln,
#              t2-eager-omp1, t2-compile, t2-compile-max, t2-lightning
#              (Trainer strategy "ddp", 2 CPU devices), t113-omp1, every
#              PyTorch process with OMP_NUM_THREADS = its threads
# Rows of a training benchmark:
#   kiln                $KILN train <ini> ... train.eval=0; its rate is
#                       the steady one, as the PyTorch rows': the steps
#                       after the first 20 (GPT: 10), from the times of its
#                       metrics.jsonl train lines (log_every = the warm-up
#                       steps); its train_samples_per_s, which counts the
#                       warm-up, is kept as kiln_all_steps_per_s; its
#                       whole-run rate is samples / the process's wall time
#   t2-eager-default    $KILN_VENV/bin/python, nothing set
#   t2-eager-passive    OMP_WAIT_POLICY=PASSIVE
#   t2-eager-omp1       OMP_NUM_THREADS=1, torch.set_num_threads(1)
#   t2-compile          torch.compile(model), mode default       } under the
#   t2-compile-max      mode max-autotune-no-cudagraphs          } --torch-env
#   t2-lightning        Trainer.fit, rate over the whole fit     } setting
#   t113-default, t113-passive, t113-omp1: /usr/bin/python3 (Debian's 1.13)
#   kiln-async0, kiln-async1  kiln's row with plugin.cpu.async=0 / 1: the
#                       two settings the default chooses from (auto: off
#                       for one process; on a rank, sync or async by the
#                       model's size and a probe of contention, async under
#                       contention: docs/distributed.md, item 6).  Run only when --rows names
#                       them (mlp, cnn-*, gpt and the ddp benchmarks)
# All PyTorch rows with common.sh's BLAS_ENV: OPENBLAS_CORETYPE=SkylakeX on
# an AVX-512 CPU (DESIGN.md section 8), OpenBLAS's own choice elsewhere.
# kiln's row also reports setup_s and fit_s (metrics.jsonl's final line):
# its fit, first step to final checkpoint, is what Lightning's fit() times.
# compile rows: the first warm-up steps compile and are not timed; compile_s
# (their time beyond that many steady steps) is reported apart.  Inductor's
# cache is one fresh directory per invocation unless --inductor-cache names
# one: run 1 compiles cold, later runs find its cache warm.
#
# Usage: bench/anchors.sh [--runs N] [--bench LIST] [--threads N] [--steps N]
#                         [--torch-env passive|default|omp1] [--out DIR]
#                         [--rows LIST] [--inductor-cache DIR] [--short]
#                         [--full-epoch] [--no-probe]
#   --short         a quick look: --runs 1 --steps 30 --mlp-steps 60 --bench
#                   training (every row; most of its time is compiling);
#                   options after it override it
#   --full-epoch    the CNN rows train one whole epoch too (--steps 448:
#                   kiln 468 steps, PyTorch 20 + 448), as the MLP's do by
#                   default
#   --runs N        repetitions (default 3)
#   --threads N     threads of every row (default 2)
#   --steps N       timed steps of the CNN and GPT rows (default 100; kiln
#                   runs N+20 CNN / N+10 GPT steps, the last N timed)
#   --mlp-steps N   the MLP's timed steps (default 0: one epoch, 468 steps,
#                   PyTorch timing the last 448; else N+20 steps, as the CNN)
#   --torch-env E   the OpenMP setting of the compile rows (default passive);
#                   the Lightning row runs with PyTorch's own OpenMP defaults,
#                   as a user runs it (6-9% faster than under PASSIVE in
#                   session 13's quiet window), except that omp1 (the DDP
#                   rows' 1 thread a rank) applies to it too
#   --out DIR       keep every run's JSON line in DIR/BENCH.jsonl (default: a
#                   scratch directory, removed)
#   --rows LIST     only these rows (comma-separated names above; the data
#                   benchmark's: kiln-folder, t2-dataloader, t113-dataloader)
#   --inductor-cache DIR  TORCHINDUCTOR_CACHE_DIR (default: fresh, removed)
#   --no-probe      no placement probe around the runs (below)
# Environment: KILN (./kiln), KILN_VENV (./.venv; scripts/install-deps
#   --bench makes it), PYTHON113 (/usr/bin/python3), GEMM (./bench/gemm_peak,
#   the GEMM peak), C2C (./bench/c2c_latency, the placement probe),
#   GPT_DATA (data/gpt_char; made by scripts/make-gpt-char-data when missing).
# A row whose Python is missing is skipped with the reason; a failed run is
# recorded as failed and the others go on.  Prints one markdown table per
# benchmark (bench/anchors_table.py) with the load averages.
# The vCPUs' placement: on this VM a 2-thread run is up to a third slower
# for tens of seconds at a time, while the host has put the two vCPUs on
# two CCDs (docs/PERFORMANCE.md, "Session 48: the VM's two speeds are the
# vCPUs' distance"), longer than a run and shorter than a repetition, so a
# row can land in one placement and kiln in the other.  The probe,
# `$C2C --rounds 1` (bench/c2c_latency, one cache line's round trip CPU 0
# <-> 1, 0.01-0.15 s; ~1 s under heavy load), runs before every run and
# after it (the probe after one run is the one before the next); its ns go
# into the run's line as c2c_before / c2c_after, with the run's placement:
# "fast" when both are under C2C_FAST_NS (bench/common.sh, 200), "slow"
# when neither is, "mixed" otherwise, "no probe" when one failed
# (c2c_latency missing, CPU 1 not in the affinity mask, past
# C2C_TIMEOUT_S).  The table adds each row's median over its fast runs
# ("73,554 (7 of 8 fast)") and kiln / row over fast runs only, beside the
# medians over all runs (bench/anchors_table.py; docs/PERFORMANCE.md,
# "Session 49: the anchors' placement probe").  --no-probe: none (the runs'
# lines without them; the tables then as they were before the probe).
# Run from the top of a built source tree.

set -eu

RUNS=3
THREADS=2
STEPS=100
TORCH_ENV=passive
BENCHES=mlp,cnn-nchw,cnn-nhwc,cnn-bf16,gpt,data,ddp-mlp,ddp-cnn,ddp-cnn-nhwc
OUT=
ROWS=
MLP_TIMED=0
ICACHE=
KILN=${KILN:-./kiln}
KILN_VENV=${KILN_VENV:-./.venv}
PYTHON113=${PYTHON113:-/usr/bin/python3}
GEMM=${GEMM:-./bench/gemm_peak}
GPT_DATA=${GPT_DATA:-data/gpt_char}
HERE=$(dirname "$0")
# shellcheck disable=SC2034 # read by common.sh's helpers
PYTHON=$PYTHON113

. "$HERE/common.sh"

while [ $# -gt 0 ]; do
    case $1 in
        --bench) [ $# -ge 2 ] || usage; BENCHES=$2; shift 2 ;;
        --torch-env) [ $# -ge 2 ] || usage; TORCH_ENV=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        --rows) [ $# -ge 2 ] || usage; ROWS=$2; shift 2 ;;
        --mlp-steps) [ $# -ge 2 ] || usage; MLP_TIMED=$2; shift 2 ;;
        --inductor-cache) [ $# -ge 2 ] || usage; ICACHE=$2; shift 2 ;;
        --short) RUNS=1 STEPS=30 MLP_TIMED=60 BENCHES=training; shift ;;
        --full-epoch) STEPS=448 MLP_TIMED=0; shift ;;
        --no-probe) PLACE_PROBE=0; shift ;;
        -h|--help) usage ;;
        *) bench_opt "$@" || { echo "anchors.sh: unknown argument: $1" >&2; usage; }
           shift "$NSHIFT" ;;
    esac
done
for v in "runs:$RUNS" "steps:$STEPS" "threads:$THREADS"; do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "anchors.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
case $TORCH_ENV in
    default) TENV= ;;
    passive) TENV=OMP_WAIT_POLICY=PASSIVE ;;
    omp1) TENV=OMP_NUM_THREADS=1 ;;
    *) echo "anchors.sh: --torch-env passive, default or omp1" >&2; exit 2 ;;
esac
[ -x "$KILN" ] || { echo "anchors.sh: $KILN not found (set KILN=)" >&2; exit 1; }
# the kiln rows run the binary itself, not libtool's wrapper
real_kiln

bench_tmpdir anchors
RES=${OUT:-$TMP/res}
mkdir -p "$RES"
export TORCHINDUCTOR_CACHE_DIR="${ICACHE:-$TMP/inductor}"
unset OMP_WAIT_POLICY OMP_NUM_THREADS

PY2=$KILN_VENV/bin/python
SKIP2=
if [ ! -x "$PY2" ]; then
    SKIP2="no $PY2 (scripts/install-deps --bench makes it; or set KILN_VENV)"
elif ! "$PY2" -c 'import torch, lightning, torchvision' 2>/dev/null; then
    SKIP2="$PY2 cannot import torch, lightning and torchvision"
fi
SKIP113=
"$PYTHON113" -c 'import torch' 2>/dev/null || SKIP113="$PYTHON113 cannot import torch (python3-torch)"

# one_run BENCH ROW SAMPLES CMD...: runs CMD once, between two placement
# probes (common.sh's place_before / place_after; the one after it is the
# next run's before); its last JSON line, with the row, the repetition, the
# process's wall time, the probes and placement (unless --no-probe) and
# SAMPLES (the samples the whole run trains, for the whole-run rate; 0 = not
# known) added, goes to
# $RES/BENCH.jsonl; a run without one is recorded as failed.  A row not in
# --rows is not run.  With STEADY set (kiln's rows: "WARM BATCH"), the
# line's train_samples_per_s becomes the steady rate of $TMP/kout's
# metrics.jsonl after WARM steps, the old one kiln_all_steps_per_s.
one_run() {
    b=$1 row=$2 samples=$3
    shift 3
    case ",${ROWS:-$row}," in *",$row,"*) ;; *) return 0 ;; esac
    case $row in kiln-async*) case ",$ROWS," in *",$row,"*) ;; *) return 0 ;; esac ;; esac
    place_before
    t0=$(date +%s.%N)
    rc=0
    "$@" > "$TMP/run.out" 2> "$TMP/run.err" || rc=$?
    t1=$(date +%s.%N)
    place_after
    line=$(grep '^[[:space:]]*{.*samples_per_s' "$TMP/run.out" | tail -n 1 || true)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    head="{\"row\": \"$row\", \"rep\": $rep, \"run_wall_s\": $wall, \"run_samples\": $samples, "
    [ "$PLACE_PROBE" != 1 ] || head="$head$(place_json)"
    if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
        why=$(tail -n 1 "$TMP/run.err" | tr -d '"\\' | cut -c1-200)
        echo "$b $row run $rep: FAILED (exit $rc): $why" >&2
        printf '%s"failed": "exit %d: %s"}\n' "$head" "$rc" "$why" >> "$RES/$b.jsonl"
        return 0
    fi
    if [ -n "$STEADY" ]; then
        line=$("$PYTHON113" "$HERE/anchors_table.py" --steady "$TMP/kout/metrics.jsonl" $STEADY "$line") || {
            echo "$b $row run $rep: FAILED: no steady rate in its metrics.jsonl" >&2
            printf '%s"failed": "no steady rate"}\n' "$head" >> "$RES/$b.jsonl"
            return 0
        }
    fi
    echo "$b $row run $rep$( [ "$PLACE_PROBE" != 1 ] || echo " ($PLACE, $C2C_BEFORE/$C2C_AFTER ns)"): $line" >&2
    printf '%s\n' "$line" | sed "s/^[[:space:]]*{/$head/" >> "$RES/$b.jsonl"
}

# torch_rows BENCH SAMPLES_2X SCRIPT ARGS...: the PyTorch rows of one
# repetition (SAMPLES_2X: what Lightning's whole fit trains).
torch_rows() {
    b=$1 lsamples=$2 script=$3
    shift 3
    if [ -z "$SKIP2" ]; then
        one_run "$b" t2-eager-default 0 env $BLAS_ENV \
            "$PY2" "$HERE/$script" --threads "$THREADS" "$@"
        one_run "$b" t2-eager-passive 0 env $BLAS_ENV OMP_WAIT_POLICY=PASSIVE \
            "$PY2" "$HERE/$script" --threads "$THREADS" "$@"
        one_run "$b" t2-eager-omp1 0 env $BLAS_ENV OMP_NUM_THREADS=1 \
            "$PY2" "$HERE/$script" --threads 1 "$@"
        nt=$THREADS; [ "$TORCH_ENV" = omp1 ] && nt=1
        for m in compile compile-max lightning; do
            e=$TENV
            [ "$m" = lightning ] && [ "$TORCH_ENV" != omp1 ] && e=
            one_run "$b" "t2-$m" "$lsamples" env $BLAS_ENV $e \
                "$PY2" "$HERE/$script" --threads "$nt" --mode "$m" "$@"
        done
    fi
    if [ -z "$SKIP113" ]; then
        one_run "$b" t113-default 0 env $BLAS_ENV \
            "$PYTHON113" "$HERE/$script" --threads "$THREADS" "$@"
        one_run "$b" t113-passive 0 env $BLAS_ENV OMP_WAIT_POLICY=PASSIVE \
            "$PYTHON113" "$HERE/$script" --threads "$THREADS" "$@"
        one_run "$b" t113-omp1 0 env $BLAS_ENV OMP_NUM_THREADS=1 \
            "$PYTHON113" "$HERE/$script" --threads 1 "$@"
    fi
}

STEADY=
# kiln_row BENCH SAMPLES WARM BATCH INI KEY=VALUE...: the kiln row, then
# (when --rows names them) kiln-async0 and kiln-async1; with LAUNCH set
# (the ddp benchmarks: "launch -n 2 -- KILN"), through kiln launch
LAUNCH=
kiln_row() {
    b=$1 samples=$2 warm=$3 batch=$4 ini=$5
    shift 5
    for kr in kiln kiln-async0 kiln-async1; do
        ka=
        case $kr in kiln-async*) ka=plugin.cpu.async=${kr#kiln-async} ;; esac
        rm -rf "$TMP/kout"
        STEADY="$warm $batch"
        one_run "$b" "$kr" "$samples" env $BLAS_ENV KILN_MASTER_PORT="$(free_port)" \
            "$KILN" $LAUNCH train "$ini" run.threads="$THREADS" train.eval=0 run.out_dir="$TMP/kout" \
            train.log_every="$warm" "$@" $ka
        STEADY=
    done
}

# a TCP port free a moment ago (the ddp rows' rendezvous)
free_port() {
    "$PYTHON113" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $(( 30000 + $$ % 20000 ))
}

# ddp_torch_rows BENCH SAMPLES_2X ARGS...: the PyTorch rows of a ddp
# benchmark, 2 processes of DDP_THREADS threads (pytorch_ddp.py ARGS)
ddp_torch_rows() {
    b=$1 lsamples=$2
    shift 2
    o1="OMP_NUM_THREADS=$DDP_THREADS"
    set -- --world 2 --threads "$DDP_THREADS" --port 0 "$@"
    if [ -z "$SKIP2" ]; then
        one_run "$b" t2-eager-omp1 0 env $BLAS_ENV $o1 "$PY2" "$HERE/pytorch_ddp.py" "$@"
        for m in compile compile-max lightning; do
            one_run "$b" "t2-$m" "$lsamples" env $BLAS_ENV $TENV $o1 \
                "$PY2" "$HERE/pytorch_ddp.py" --mode "$m" "$@"
        done
    fi
    [ -n "$SKIP113" ] ||
        one_run "$b" t113-omp1 0 env $BLAS_ENV $o1 "$PYTHON113" "$HERE/pytorch_ddp.py" "$@"
}

BATCH=128
DDP_THREADS=$((THREADS / 2))
[ "$DDP_THREADS" -ge 1 ] || DDP_THREADS=1
CNN_KSTEPS=$((STEPS + 20))
GPT_KSTEPS=$((STEPS + 10))
MLP_STEPS=$((60000 / BATCH)) MLP_LIMIT=0
[ "$MLP_TIMED" = 0 ] || MLP_STEPS=$((MLP_TIMED + 20)) MLP_LIMIT=$(((MLP_TIMED + 20) * BATCH))
rep_of() { # BENCH: one repetition of its rows
    case $1 in
    mlp)
        kiln_row mlp $((MLP_STEPS * BATCH)) 20 $BATCH "$HERE/mlp_bench.ini" train.epochs=1 \
            data.limit=$MLP_LIMIT train.max_steps=$MLP_STEPS
        torch_rows mlp $((MLP_STEPS * BATCH)) pytorch_mlp.py --steps $((MLP_LIMIT / BATCH)) ;;
    cnn-nchw|cnn-nhwc|cnn-bf16)
        layout=nchw prec=fp32
        [ "$1" = cnn-nhwc ] && layout=nhwc
        [ "$1" = cnn-bf16 ] && prec=bf16
        kiln_row "$1" $((CNN_KSTEPS * BATCH)) 20 $BATCH "$HERE/cnn_bench.ini" model.layout=$layout \
            run.precision=$prec train.batch=$BATCH data.limit=$((CNN_KSTEPS * BATCH)) \
            train.max_steps=$CNN_KSTEPS
        torch_rows "$1" $((CNN_KSTEPS * BATCH)) pytorch_cnn.py --layout $layout \
            --precision $prec --steps "$STEPS" --warmup-steps 20 --eval-samples 1000 ;;
    gpt)
        kiln_row gpt $((GPT_KSTEPS * 16)) 10 16 examples/gpt_char.ini data.path="$GPT_DATA" \
            train.max_steps=$GPT_KSTEPS train.checkpoint_every=0
        torch_rows gpt $((GPT_KSTEPS * 16)) pytorch_gpt.py --data "$GPT_DATA" \
            --steps "$STEPS" --warmup-steps 10 ;;
    ddp-mlp)
        LAUNCH="launch -n 2 -- $KILN"
        kiln_row ddp-mlp $((MLP_STEPS * BATCH)) 20 $BATCH "$HERE/mlp_bench.ini" train.epochs=1 \
            run.threads=$DDP_THREADS train.batch=$((BATCH / 2)) data.limit=$MLP_LIMIT \
            train.max_steps=$MLP_STEPS
        LAUNCH=
        ddp_torch_rows ddp-mlp $((MLP_STEPS * BATCH)) --model mlp --batch $BATCH \
            --steps $((MLP_STEPS - 20)) --warmup-steps 20 ;;
    ddp-cnn|ddp-cnn-nhwc)
        layout=nchw
        [ "$1" = ddp-cnn-nhwc ] && layout=nhwc
        LAUNCH="launch -n 2 -- $KILN"
        kiln_row "$1" $((CNN_KSTEPS * BATCH)) 20 $BATCH "$HERE/cnn_bench.ini" model.layout=$layout \
            run.threads=$DDP_THREADS train.batch=$((BATCH / 2)) \
            data.limit=$((CNN_KSTEPS * BATCH)) train.max_steps=$CNN_KSTEPS
        LAUNCH=
        ddp_torch_rows "$1" $((CNN_KSTEPS * BATCH)) --model cnn --layout $layout --batch $BATCH \
            --steps "$STEPS" --warmup-steps 20 ;;
    data)
        d=$DATA_DIR/jpeg
        one_run data kiln-folder 0 "$KILN" bench data "$HERE/data_bench.ini" "data.path=$d" \
            data.workers=2 --batches 40
        set -- "$d/train" --workers 2 --batch 128 --batches 40 --size 112 --crop resized \
            --flip --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25
        [ -n "$SKIP2" ] || one_run data t2-dataloader 0 "$PY2" "$HERE/pytorch_data.py" "$@"
        [ -n "$SKIP113" ] || one_run data t113-dataloader 0 "$PYTHON113" "$HERE/pytorch_data.py" "$@" ;;
    *) echo "anchors.sh: unknown benchmark: $1" >&2; exit 2 ;;
    esac
}

BENCHES=$(printf '%s' "$BENCHES" | sed 's/training/mlp,cnn-nchw,cnn-nhwc,cnn-bf16/;
    s/\(^\|,\)ddp\(,\|$\)/\1ddp-mlp,ddp-cnn,ddp-cnn-nhwc\2/' | tr ',' ' ')
for b in $BENCHES; do
    case $b in
        mlp|cnn-nchw|cnn-nhwc|cnn-bf16|gpt|data|ddp-mlp|ddp-cnn|ddp-cnn-nhwc) ;;
        *) echo "anchors.sh: unknown benchmark: $b (mlp, cnn-nchw, cnn-nhwc, cnn-bf16, gpt, data," \
               "ddp-mlp, ddp-cnn, ddp-cnn-nhwc)" >&2
           exit 2 ;;
    esac
done
case " $BENCHES " in *" gpt "*)
    [ -f "$GPT_DATA/train-000000.bin" ] || KILN="$KILN" "$HERE/../scripts/make-gpt-char-data" "$GPT_DATA" >&2 ;;
esac
DATA_DIR=/tmp/kiln-bench-data
case " $BENCHES " in *" data "*)
    PYTHON="$PYTHON113" "$HERE/data.sh" --part prepare --dir "$DATA_DIR" >&2 ;;
esac

# The GEMM peak, best of its runs before and after (one low reading on a
# shared machine would flatter every %pk).
PEAKS=
measure_peak() {
    [ -x "$GEMM" ] || return 0
    p=$("$GEMM" --threads "$THREADS" 2>/dev/null | grep '^[[:space:]]*{' | head -n 1 |
        sed -n 's/.*"gflops": *\([0-9.e+-]*\).*/\1/p') || p=
    PEAKS="$PEAKS ${p:-0}"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
measure_peak
for b in $BENCHES; do
    : > "$RES/$b.jsonl"
    place_fresh
    echo "load $(cut -d' ' -f1-3 /proc/loadavg) before $b" > "$RES/$b.load"
    rep=1
    while [ "$rep" -le "$RUNS" ]; do
        rep_of "$b"
        rep=$((rep + 1))
    done
    echo "load $(cut -d' ' -f1-3 /proc/loadavg) after $b" >> "$RES/$b.load"
done
measure_peak
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

[ -z "$SKIP2" ] || echo "anchors.sh: PyTorch 2.x rows skipped: $SKIP2"
[ -z "$SKIP113" ] || echo "anchors.sh: PyTorch 1.13 rows skipped: $SKIP113"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $THREADS threads, median of $RUNS interleaved runs"
echo "load average before: $LOAD0, after: $LOAD1; compile rows under --torch-env $TORCH_ENV, Lightning's under $( [ "$TORCH_ENV" = omp1 ] && echo omp1 || echo "PyTorch's defaults")"
echo "command: bench/anchors.sh --runs $RUNS --threads $THREADS --steps $STEPS --mlp-steps $MLP_TIMED --torch-env $TORCH_ENV --bench $(echo $BENCHES | tr ' ' ,)$( [ "$PLACE_PROBE" = 1 ] || echo ' --no-probe')"
for b in $BENCHES; do
    "$PYTHON113" "$HERE/anchors_table.py" "$b" "$RES/$b.jsonl" "$(cat "$RES/$b.load" | tr '\n' ';')" $PEAKS
done
