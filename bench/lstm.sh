#!/bin/sh
# LSTM training speed: kiln's `lstm` layers against PyTorch's nn.LSTM on the
# same model, batch, data, initial weights, loss and optimizer (issue 21).
#
# Models (bench/pytorch_lstm.py has their PyTorch form; the kiln INIs are
# written here):
#   seq2seq  examples/seq2seq.ini's model: embedding 11 -> 32, bidirectional
#            LSTM 64 encoder (masked by the token ids, as the example's),
#            LSTM 128 decoder, linear 11, cross-entropy at every position;
#            T 8
#   lm       embedding 256 -> 256, 2-layer LSTM (hidden --hidden, default
#            256), linear 256 at every position; T 64
# Both: batch 64, fp32, AdamW (lr 1e-3, no weight decay), clip_norm 1.0.
# bench/pytorch_lstm.py writes a random token shard (tokens 1 .. V-1, so
# every row has length T) and PyTorch's initial weights under kiln's names;
# kiln loads them ([model] init_from) and trains the shard's first batch
# every step (data.shuffle = 0, data.resident = 1), as the PyTorch script
# does, so the losses of the first and last steps must agree (the table
# shows both; they differ only by float rounding).
#
# RUNS rounds; each round runs every row once, in turn (interleaved, so load
# changes hit all rows alike); each row's figure is the median over the
# rounds of its steady samples/s (the steps after the warm-up):
#   kiln            $KILN train, run.threads = T (each of --threads), rate
#                   from its metrics.jsonl's step times after the warm-up
#   t2-omp1         PyTorch 2.x (KILN_VENV), OMP_NUM_THREADS=1, 1 thread
#   t2-default      nothing set, T threads                 } T > 1 only
#   t2-passive      OMP_WAIT_POLICY=PASSIVE, T threads     }
#   t113-*          the same with Debian's PyTorch 1.13 (/usr/bin/python3),
#                   seq2seq only unless --t113-lm: its nn.LSTM runs its own
#                   cell on the reference BLAS (1.8 samples/s at the lm shape)
# "PyTorch-best" at T threads is the fastest 2.x setting at T threads; the
# last line compares kiln's best thread count with PyTorch's best setting.
# A second table gives each row's CPU time per timed step (every thread of
# the process; the median over the rounds): on a shared, loaded machine the
# wall-clock rates above are not reliable, the CPU times much less affected;
# its last column is the least CPU of a PyTorch 2.x setting over kiln's.
# kiln's is (CPU of its run) - (CPU of a run of the warm-up steps alone),
# from /usr/bin/time (n/a without it), over the timed steps; PyTorch's the
# script's process_time over its timed steps.
# The vCPUs' placement (bench/common.sh's place_before / place_after): the
# probe bench/c2c_latency --rounds 1 before and after every timed run (the
# probe after one run is the one before the next; kiln's run of the warm-up
# steps alone, between them, is not probed); each run "fast" when both are
# under C2C_FAST_NS (200 ns: the two vCPUs on one L3), "slow", "mixed" or
# "no probe".  The first table then adds kiln's and PyTorch 2.x's medians
# over fast runs only ("8,320 (2 of 3 fast)") and their ratio
# (docs/PERFORMANCE.md, "Session 49: the anchors' placement probe").
# --no-probe: none, and the table as before.
#
# Usage: bench/lstm.sh [--runs N] [--threads "1 2"] [--models seq2seq,lm]
#                      [--steps N] [--lm-steps N] [--hidden H] [--short]
#                      [--t113-lm] [--no-t113] [--ini MODEL] [--no-probe]
#   --short      1 round, seq2seq 60 and lm 6 timed steps: a quick look
#   --runs N     rounds (default 3)
#   --steps N    seq2seq's timed steps (default 200; 20 more untimed)
#   --lm-steps N lm's timed steps (default 20; 3 more untimed)
#   --no-probe   no placement probe (above)
#   --ini MODEL  print MODEL's kiln INI (data.path and model.init_from are
#                given on the command line) and exit (bench/lstm_ab.sh)
# Environment: KILN (./kiln), KILN_VENV (/work/scratch/venv, else ./.venv),
#   PYTHON113 (/usr/bin/python3), C2C (./bench/c2c_latency).  Run from the top of a built source tree.

set -eu

RUNS=3
THREADS_LIST="1 2"
MODELS=seq2seq,lm
STEPS=200
LM_STEPS=20
HIDDEN=256
T113=seq2seq
PRINT_INI=
KILN=${KILN:-./kiln}
KILN_VENV=${KILN_VENV:-/work/scratch/venv}
[ -x "$KILN_VENV/bin/python" ] || KILN_VENV=./.venv
PYTHON113=${PYTHON113:-/usr/bin/python3}
PYTHON=$PYTHON113
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

while [ $# -gt 0 ]; do
    case $1 in
        --runs) [ $# -ge 2 ] || usage; RUNS=$2; shift 2 ;;
        --threads) [ $# -ge 2 ] || usage; THREADS_LIST=$(echo "$2" | tr ',' ' '); shift 2 ;;
        --models) [ $# -ge 2 ] || usage; MODELS=$2; shift 2 ;;
        --steps) [ $# -ge 2 ] || usage; STEPS=$2; shift 2 ;;
        --lm-steps) [ $# -ge 2 ] || usage; LM_STEPS=$2; shift 2 ;;
        --hidden) [ $# -ge 2 ] || usage; HIDDEN=$2; shift 2 ;;
        --short) RUNS=1 STEPS=60 LM_STEPS=6; shift ;;
        --t113-lm) T113=seq2seq,lm; shift ;;
        --no-t113) T113=; shift ;;
        --no-probe) PLACE_PROBE=0; shift ;;
        --ini) [ $# -ge 2 ] || usage; PRINT_INI=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "lstm.sh: unknown argument: $1" >&2; usage ;;
    esac
done
for v in "runs:$RUNS" "steps:$STEPS" "lm-steps:$LM_STEPS" "hidden:$HIDDEN" $(for t in $THREADS_LIST; do echo "threads:$t"; done); do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "lstm.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
[ -x "$KILN" ] || { echo "lstm.sh: $KILN not found (set KILN=)" >&2; exit 1; }
PY2=$KILN_VENV/bin/python
"$PY2" -c 'import torch, numpy' 2>/dev/null ||
    { echo "lstm.sh: $PY2 cannot import torch and numpy (set KILN_VENV)" >&2; exit 1; }
"$PYTHON113" -c 'import torch, numpy' 2>/dev/null || T113=
unset OMP_WAIT_POLICY OMP_NUM_THREADS

bench_tmpdir lstm
RES=$TMP/res.jsonl
: > "$RES"

# kiln_ini MODEL: the kiln form of bench/pytorch_lstm.py's MODEL
kiln_ini() {
    printf '[run]\ndevice = cpu\nseed = 1\n[data]\nsource = tokens\nshuffle = 0\nresident = 1\n'
    printf 'context = %s\n' "$(ctx_of "$1")"
    printf '[train]\noptimizer = adamw\nlr = 1e-3\nbeta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n'
    printf 'weight_decay = 0\nclip_norm = 1.0\nbatch = 64\neval = 0\nlog_every = 1\n'
    printf 'checkpoint_last = 0\n'
    case $1 in
    seq2seq)
        printf '[layer.enc.embed]\ntype = embedding\nvocab = 11\ndim = 32\n'
        printf '[layer.enc.fwd]\ntype = lstm\nhidden = 64\ninputs = enc.embed, data\npad_id = 0\n'
        printf '[layer.enc.bwd]\ntype = lstm\nhidden = 64\nreverse = 1\ninputs = enc.embed, data\npad_id = 0\n'
        printf '[layer.enc.out]\ntype = concat\ninputs = enc.fwd, enc.bwd\ndim = -1\n'
        printf '[layer.dec.lstm]\ntype = lstm\nhidden = 128\ninputs = enc.out, data\npad_id = 0\n'
        printf '[layer.dec.head]\ntype = linear\nout = 11\n' ;;
    lm)
        printf '[layer.embed]\ntype = embedding\nvocab = 256\ndim = 256\n'
        printf '[layer.r0]\ntype = lstm\nhidden = %s\n' "$HIDDEN"
        printf '[layer.r1]\ntype = lstm\nhidden = %s\nindex = 1\n' "$HIDDEN"
        printf '[layer.head]\ntype = linear\nout = 256\n' ;;
    esac
    printf '[layer.loss]\ntype = softmax_xent\nignore_index = 0\n'
}

# record MODEL ROW THREADS LINE: LINE (a JSON object) with the model, row,
# threads and the run's probes and placement (place_after's) added, into
# $RES; an empty LINE is a failed run
record() {
    if [ -z "$4" ]; then
        echo "lstm.sh: $1 $2 threads $3 round $round: FAILED" >&2
        return 0
    fi
    _pl=
    [ "$PLACE_PROBE" != 1 ] || _pl=$(place_json)
    echo "$1 $2 threads $3 round $round${_pl:+ ($PLACE)}: $4" >&2
    printf '%s\n' "$4" | sed "s/^[[:space:]]*{/{\"bench\": \"$1\", \"row\": \"$2\", \"nthreads\": $3, \"round\": $round, $_pl/" >> "$RES"
}

# kiln_train MODEL THREADS STEPS: one kiln run into $TMP/kout, its output in
# $TMP/kiln.out, its CPU seconds (user + sys) in $TMP/kiln.cpu when
# /usr/bin/time exists
kiln_train() {
    rm -rf "$TMP/kout" "$TMP/kiln.cpu"
    set -- "$KILN" train "$TMP/$1.ini" run.threads="$2" run.out_dir="$TMP/kout" \
        data.path="$TMP/$1.bin" model.init_from="$TMP/$1.safetensors" train.max_steps="$3"
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f '%U %S' -o "$TMP/kiln.time" "$@" > "$TMP/kiln.out" 2>&1 || return 1
        awk '{ print $1 + $2 }' "$TMP/kiln.time" > "$TMP/kiln.cpu"
    else
        "$@" > "$TMP/kiln.out" 2>&1
    fi
}

# kiln_run MODEL THREADS: kiln's steady rate, CPU per timed step, and first
# and last losses
kiln_run() {
    cpu_warm=
    kiln_train "$1" "$2" "$(warm_of "$1")" && [ -f "$TMP/kiln.cpu" ] && cpu_warm=$(cat "$TMP/kiln.cpu")
    place_fresh
    place_before
    rc=0
    kiln_train "$1" "$2" $(($(steps_of "$1") + $(warm_of "$1"))) || rc=$?
    place_after
    [ "$rc" = 0 ] || { tail -3 "$TMP/kiln.out" >&2; record "$1" kiln "$2" ""; return 0; }
    cpu_all=
    [ -f "$TMP/kiln.cpu" ] && cpu_all=$(cat "$TMP/kiln.cpu")
    record "$1" kiln "$2" "$("$PYTHON113" - "$TMP/kout/metrics.jsonl" "$(warm_of "$1")" "$cpu_warm" "$cpu_all" <<'PY'
import json, sys
tr = [r for r in map(json.loads, filter(str.strip, open(sys.argv[1]))) if r.get("event") == "train"]
warm = int(sys.argv[2])
t = {r["step"]: r["time"] for r in tr}
last = tr[-1]["step"]
out = {"train_samples_per_s": (last - warm) * 64 / (t[last] - t[warm]),
       "loss_first": tr[0]["loss"], "loss_last": tr[-1]["loss"], "timed_steps": last - warm}
if sys.argv[3] and sys.argv[4]:
    out["cpu_ms_per_step"] = 1000 * (float(sys.argv[4]) - float(sys.argv[3])) / (last - warm)
print(json.dumps(out))
PY
)"
}

# torch_run MODEL ROW THREADS PYTHON [ENV...]
torch_run() {
    m=$1 row=$2 nt=$3 py=$4
    shift 4
    place_before
    line=$(env "$@" "$py" "$HERE/pytorch_lstm.py" --model "$m" \
        --hidden "$HIDDEN" --shard "$TMP/$m.bin" --threads "$nt" --warmup-steps "$(warm_of "$m")" \
        --steps "$(steps_of "$m")" 2> "$TMP/torch.err" | grep '^{' | tail -n 1) ||
        { tail -3 "$TMP/torch.err" >&2; line=; }
    place_after
    record "$m" "$row" "$nt" "$line"
}

ctx_of() { if [ "$1" = lm ]; then echo 64; else echo 8; fi; }
steps_of() { if [ "$1" = lm ]; then echo "$LM_STEPS"; else echo "$STEPS"; fi; }
warm_of() { if [ "$1" = lm ]; then echo 3; else echo 20; fi; }
[ -z "$PRINT_INI" ] || { kiln_ini "$PRINT_INI"; exit 0; }

MODELS=$(echo "$MODELS" | tr ',' ' ')
for m in $MODELS; do
    case $m in seq2seq|lm) ;; *) echo "lstm.sh: unknown model $m (seq2seq, lm)" >&2; exit 2 ;; esac
    kiln_ini "$m" > "$TMP/$m.ini"
    "$PY2" "$HERE/pytorch_lstm.py" --model "$m" --write-shard "$TMP/$m.bin" \
        --tokens $((($(steps_of "$m") + $(warm_of "$m") + 2) * 64 * $(ctx_of "$m") + 1)) --seed 1
    "$PY2" "$HERE/pytorch_lstm.py" --model "$m" --hidden "$HIDDEN" --init "$TMP/$m.safetensors"
done

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
round=1
while [ "$round" -le "$RUNS" ]; do
    for m in $MODELS; do
        for t in $THREADS_LIST; do
            kiln_run "$m" "$t"
            if [ "$t" = 1 ]; then
                torch_run "$m" t2-omp1 1 "$PY2" OMP_NUM_THREADS=1
            else
                torch_run "$m" t2-default "$t" "$PY2"
                torch_run "$m" t2-passive "$t" "$PY2" OMP_WAIT_POLICY=PASSIVE
            fi
            case ",$T113," in *",$m,"*)
                if [ "$t" = 1 ]; then
                    torch_run "$m" t113-omp1 1 "$PYTHON113" OMP_NUM_THREADS=1
                else
                    torch_run "$m" t113-default "$t" "$PYTHON113"
                    torch_run "$m" t113-passive "$t" "$PYTHON113" OMP_WAIT_POLICY=PASSIVE
                fi ;;
            esac
        done
    done
    round=$((round + 1))
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), median of $RUNS interleaved rounds"
echo "load average before: $LOAD0, after: $LOAD1"
echo "command: bench/lstm.sh --runs $RUNS --threads \"$THREADS_LIST\" --models $(echo $MODELS | tr ' ' ,) --steps $STEPS --lm-steps $LM_STEPS --hidden $HIDDEN$( [ "$PLACE_PROBE" = 1 ] || echo ' --no-probe')"
"$PYTHON113" - "$RES" "$HIDDEN" "$HERE" <<'PY'
import json, statistics, sys
sys.path.insert(0, sys.argv[3])
from anchors_table import fast_median, placed  # noqa: E402 (bench/)
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
top = placed(rows)  # (no run with a placement: --no-probe; the table as before)
shape = {"seq2seq": "seq2seq (T 8)", "lm": "lm 2x%s (T 64)" % sys.argv[2]}
def runs(m, row, t):
    return [r for r in rows if (r["bench"], r["row"], r["nthreads"]) == (m, row, t)]
def med(m, row, t, key="train_samples_per_s"):
    v = [r[key] for r in runs(m, row, t)]
    return statistics.median(v) if v else None
def fmed(m, row, t):
    """the median over fast runs only"""
    return fast_median(runs(m, row, t), "train_samples_per_s")[0]
T2 = ("t2-omp1", "t2-default", "t2-passive")
def f(v, nd=1):
    return "n/a" if v is None else "%.*f" % (nd, v)
print()
print("| model | threads | kiln samples/s | PyTorch 2.x best (setting) | kiln / best | PyTorch 1.13 best | loss step 1 kiln / torch | loss last kiln / torch |"
      + (" kiln, fast runs | PyTorch 2.x best, fast runs (setting) | kiln / best, fast runs |" if top else ""))
print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if top else ""))
for m in dict.fromkeys(r["bench"] for r in rows):
    best_all = (None, None)
    kiln_all = (None, None)
    fbest_all = (None, None)
    fkiln_all = (None, None)
    for t in sorted({r["nthreads"] for r in rows if r["bench"] == m}):
        k = med(m, "kiln", t)
        t2 = max(((med(m, n, t), n) for n in ("t2-omp1", "t2-default", "t2-passive")
                  if med(m, n, t) is not None), default=(None, None))
        t1 = max((med(m, n, t) or 0 for n in ("t113-omp1", "t113-default", "t113-passive")),
                 default=0) or None
        if t2[0] is not None and (best_all[0] is None or t2[0] > best_all[0]):
            best_all = (t2[0], "%s, %d thread%s" % (t2[1], t, "s" * (t > 1)))
        if k is not None and (kiln_all[0] is None or k > kiln_all[0]):
            kiln_all = (k, t)
        src = t2[1] or "t2-omp1"
        loss = ["%s / %s" % (f(med(m, "kiln", t, key), 6), f(med(m, src, t, key), 6))
                for key in ("loss_first", "loss_last")]
        fast = ""
        if top:
            fk = fmed(m, "kiln", t)
            ft2 = max(((fmed(m, n, t), n) for n in T2 if fmed(m, n, t)), default=(None, None))
            # (no 2.x setting with a fast run: the count over all of them)
            t2runs = runs(m, ft2[1], t) if ft2[1] else [r for n in T2 for r in runs(m, n, t)]
            fast = " %s (%d of %d fast) | %s (%s%d of %d fast) | %s |" % (
                f(fk), *fast_median(runs(m, "kiln", t), "train_samples_per_s")[1:],
                f(ft2[0]), ft2[1] + ", " if ft2[1] else "",
                *fast_median(t2runs, "train_samples_per_s")[1:],
                f(fk / ft2[0], 2) + "x" if fk and ft2[0] else "n/a")
            if ft2[0] and (fbest_all[0] is None or ft2[0] > fbest_all[0]):
                fbest_all = (ft2[0], "%s, %d thread%s" % (ft2[1], t, "s" * (t > 1)))
            if fk and (fkiln_all[0] is None or fk > fkiln_all[0]):
                fkiln_all = (fk, t)
        print("| %s | %d | %s | %s (%s) | %s | %s | %s | %s |%s" % (
            shape[m], t, f(k), f(t2[0]), t2[1] or "-",
            f(k / t2[0], 2) + "x" if k and t2[0] else "n/a", f(t1), loss[0], loss[1], fast))
    if kiln_all[0] and best_all[0]:
        fast = ""
        if top:
            fast = " %s | %s | %s |" % (
                "%s (%d thread%s)" % (f(fkiln_all[0]), fkiln_all[1], "s" * (fkiln_all[1] > 1))
                if fkiln_all[0] else "n/a", "%s (%s)" % (f(fbest_all[0]), fbest_all[1])
                if fbest_all[0] else "n/a",
                "**%.2fx**" % (fkiln_all[0] / fbest_all[0]) if fkiln_all[0] and fbest_all[0] else "n/a")
        print("| %s | best | %s (%d thread%s) | %s (%s) | **%.2fx** | | | |%s" % (
            shape[m], f(kiln_all[0]), kiln_all[1], "s" * (kiln_all[1] > 1), f(best_all[0]),
            best_all[1], kiln_all[0] / best_all[0], fast))
if top:
    print()
    print("Fast runs: each run between two `bench/c2c_latency --rounds 1` probes (ns, CPU 0 <-> 1); "
          "\"fast\" when both read under %g ns (the two vCPUs on one L3); the median over a "
          "row's fast runs, and how many of its runs were fast; PyTorch 2.x's best by that median"
          % max(r.get("c2c_fast_ns", 0) for r in rows))
names = ["kiln", "t2-omp1", "t2-default", "t2-passive", "t113-omp1", "t113-default", "t113-passive"]
names = [n for n in names if any(r["row"] == n and "cpu_ms_per_step" in r for r in rows)]
if names:
    print()
    print("CPU ms per timed step (every thread; median over the rounds); the last column: "
          "the least CPU of a PyTorch 2.x setting over kiln's")
    print()
    print("| model | threads | " + " | ".join(names) + " | PyTorch 2.x / kiln |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for m in dict.fromkeys(r["bench"] for r in rows):
        for t in sorted({r["nthreads"] for r in rows if r["bench"] == m}):
            c = {n: med(m, n, t, "cpu_ms_per_step") for n in names}
            t2 = [c[n] for n in ("t2-omp1", "t2-default", "t2-passive") if c.get(n)]
            print("| %s | %d | %s | %s |" % (shape[m], t, " | ".join(f(c[n]) for n in names),
                  f(min(t2) / c["kiln"], 2) + "x" if t2 and c.get("kiln") else "n/a"))
PY
