#!/bin/sh
# Training throughput on a shared machine: kiln and PyTorch side by side,
# each benchmark under each condition.
#
# Benchmarks (--benches):
#   mlp        bench/mlp_bench.ini, one epoch (bench/pytorch_mlp.py --steps 0),
#              or E epochs with --mlp-epochs E: the start-up and the steady
#              state told apart.  What each side's rate leaves out: kiln's
#              (train_samples_per_s) is over the whole epoch with one epoch,
#              and over epochs 2..E with more (kiln times from epoch 2 once
#              a second epoch ran: the first epoch's plans, JIT, loader
#              start and the CPU team's first intervals excluded), in both
#              cases without evaluation and checkpoint writes; PyTorch's is
#              over every step but its first 20 (--warmup-steps), of all E
#              epochs
#   cnn-nchw   bench/cnn_bench.ini, WARMUP+STEPS steps (as bench/cnn.sh)
#   cnn-nhwc   the same, channels-last
#   cnn-bf16   the same, nchw, bf16 (kiln run.precision=bf16; PyTorch under
#              CPU autocast, bench/pytorch_cnn.py --precision bf16)
# Conditions (--conditions):
#   quiet      nothing else started by this script
#   busy       a competing process keeps one core busy: a shell busy loop
#              (`while :; do :; done`), started before each run and killed
#              after it; its measured CPU share is reported ("spin" column)
#   jitter     a competing process busy 2 ms of every 20 ms (10% of one
#              core, in bursts: a monitoring agent, a periodic job; python3),
#              started and stopped as busy's loop; its share is reported
#              busy's and jitter's competitor starts 0.3 s before the run
#              (a steady neighbour: its own start-up is over)
#   busy0, jitter0
#              the same competitor started with the run, not before it:
#              its start-up (python3's is ~50 ms of a CPU) falls in the
#              run's first 100 ms, the neighbour that comes and goes that
#              kiln's adaptive team must not keep one thread for (session
#              46, docs/PERFORMANCE.md)
#   core1      the run under `taskset -c 0`: one core
#   quota      the run in a cgroup with a 1.5-CPU quota (v2 cpu.max
#              "150000 100000", else v1 cpu.cfs_quota_us 150000); skipped,
#              saying why, when no cgroup can be created (needs root; the
#              start line says which cgroup version is used)
#   quota1     the same with a 1-CPU quota (100000 per 100000 us)
# Contenders (each run once per round; rounds interleave every contender
# of every benchmark and condition, so slow drifts of the machine's load
# fall on all of them alike):
#   kiln          $KILN train INI run.threads=0 (the team a user gets: no
#                 thread key set, so kiln picks its own team and adapts it;
#                 KILN_ADAPT=0 adds plugin.cpu.adaptive=0)
#   kiln-before   $KILN_BEFORE the same way, when KILN_BEFORE is set (e.g.
#                 a build of main: the before/after of a change)
#   kiln-sN       $KILN with GOMP_SPINCOUNT=N (libgomp's spin before a
#                 waiting thread sleeps; kiln sets 100000 unless it is set),
#                 one row per N of --spins
#   pt-default, pt-passive, pt-omp1
#                 PyTorch ($PYTHON) with 2 threads; with OMP_WAIT_POLICY=
#                 PASSIVE; with OMP_NUM_THREADS=1 (and 1 thread), all with
#                 common.sh's BLAS_ENV, as bench/mlp.sh and cnn.sh; the
#                 MLP's with --flush-denormal (torch.set_flush_denormal:
#                 PyTorch at its best from the third epoch on, when SGD's
#                 momentum of dead units goes subnormal; kiln's CPU
#                 optimizers store such state as zero, docs/training.md)
# Output: each run's JSON line on stderr; then per benchmark a table of
# medians (samples/s) by condition, "pt-best" (the fastest PyTorch setting
# in that condition), kiln / pt-best (the issue asks >= 1.2 under
# contention) and kiln's share of its own quiet rate (>= 0.45 asked with
# one core taken); /proc/loadavg at the start and end of each condition.
#
# Usage: bench/contention.sh [--runs N] [--steps N] [--benches LIST]
#                            [--conditions LIST]
#   --runs N         rounds (default 3; medians over them)
#   --steps N        CNN timed steps after 20 warm-up steps (default 100)
#   --mlp-steps N    MLP steps, 20 of them warm-up for PyTorch (default 0:
#                    the epochs of --mlp-epochs, as `kiln train ... train.epochs=1`)
#   --mlp-epochs E   MLP epochs (default 1): kiln train.epochs=E, PyTorch
#                    --epochs E (see mlp above for what each rate excludes)
#   --benches LIST   comma-separated (default mlp,cnn-nchw,cnn-nhwc,cnn-bf16)
#   --conditions L   comma-separated (default quiet,busy,core1,quota,quota1;
#                    jitter, busy0, jitter0 on request)
#   --spins LIST     comma-separated spin counts for kiln-sN rows (default none)
#   --short          a quick look (about 15 minutes on 2 cores): --runs 1 --steps 20
#                    --mlp-steps 300, unless those options come after it
#   --precedence     every run and the busy loop in a cgroup of the maximum
#                    CPU weight, so that on a machine other people load the
#                    conditions are (nearly) the ones this script sets; with
#                    autogroups (sched_autogroup_enabled) `nice` cannot do it
# Environment:
#   KILN         kiln binary (default ./kiln)
#   KILN_BEFORE  a second kiln binary to compare (default: none)
#   PYTHON       Python with PyTorch (default /usr/bin/python3; e.g.
#                /work/scratch/venv/bin/python for PyTorch 2.x)
# Run from the top of the source tree.

set -eu

RUNS=3
STEPS=100
MLP_STEPS=0
MLP_EPOCHS=1
WARMUP=20
BATCH=128
BENCHES=mlp,cnn-nchw,cnn-nhwc,cnn-bf16
CONDITIONS=quiet,busy,core1,quota,quota1
PRECEDENCE=0
SPINS=
KILN=${KILN:-./kiln}
KILN_BEFORE=${KILN_BEFORE:-}
PYTHON=${PYTHON:-/usr/bin/python3}
JIT_BUSY=0.002    # jitter: seconds busy of every JIT_PERIOD
JIT_PERIOD=0.020
HERE=$(dirname "$0")

. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

while [ $# -gt 0 ]; do
    case $1 in
        --benches) [ $# -ge 2 ] || usage; BENCHES=$2; shift 2 ;;
        --benches=*) BENCHES=${1#*=}; shift ;;
        --conditions) [ $# -ge 2 ] || usage; CONDITIONS=$2; shift 2 ;;
        --conditions=*) CONDITIONS=${1#*=}; shift ;;
        --precedence) PRECEDENCE=1; shift ;;
        --spins) [ $# -ge 2 ] || usage; SPINS=$2; shift 2 ;;
        --spins=*) SPINS=${1#*=}; shift ;;
        --short) RUNS=1; STEPS=20; MLP_STEPS=300; shift ;;
        --mlp-steps) [ $# -ge 2 ] || usage; MLP_STEPS=$2; shift 2 ;;
        --mlp-steps=*) MLP_STEPS=${1#*=}; shift ;;
        --mlp-epochs) [ $# -ge 2 ] || usage; MLP_EPOCHS=$2; shift 2 ;;
        --mlp-epochs=*) MLP_EPOCHS=${1#*=}; shift ;;
        -h|--help) usage ;;
        *) bench_opt "$@" || { echo "contention.sh: unknown argument: $1" >&2; usage; }
           shift "$NSHIFT" ;;
    esac
done
for v in "runs:$RUNS" "steps:$STEPS" "mlp-epochs:$MLP_EPOCHS"; do
    case ${v#*:} in
        ''|*[!0-9]*|0) echo "contention.sh: --${v%%:*} must be a positive integer" >&2; exit 2 ;;
    esac
done
case $MLP_STEPS in ''|*[!0-9]*) echo "contention.sh: --mlp-steps must be an integer >= 0" >&2; exit 2 ;; esac
BENCHES=$(printf '%s' "$BENCHES" | tr ',' ' ')
CONDITIONS=$(printf '%s' "$CONDITIONS" | tr ',' ' ')
for b in $BENCHES; do
    case $b in mlp|cnn-nchw|cnn-nhwc|cnn-bf16) ;;
        *) echo "contention.sh: unknown benchmark: $b" >&2; exit 2 ;; esac
done
for c in $CONDITIONS; do
    case $c in quiet|busy|jitter|busy0|jitter0|core1|quota|quota1) ;;
        *) echo "contention.sh: unknown condition: $c" >&2; exit 2 ;; esac
done
[ -x "$KILN" ] || { echo "contention.sh: $KILN not found or not executable (set KILN=)" >&2; exit 1; }
if [ -n "$KILN_BEFORE" ] && [ ! -x "$KILN_BEFORE" ]; then
    echo "contention.sh: KILN_BEFORE=$KILN_BEFORE is not executable" >&2; exit 1
fi
SPINROWS=
for s in $(printf '%s' "$SPINS" | tr ',' ' '); do
    case $s in ''|*[!0-9]*) echo "contention.sh: --spins: $s is not a count" >&2; exit 2 ;; esac
    SPINROWS="$SPINROWS kiln-s$s"
done
CONTENDERS="kiln${KILN_BEFORE:+ kiln-before}$SPINROWS pt-default pt-passive pt-omp1"

bench_tmpdir contention
SPIN_PID=
CG=          # the cgroup this script made: CG/run (every run), CG/quota, CG/quota1
CGV=         # its version: "v2" or "v1"
cleanup() {
    [ -z "$SPIN_PID" ] || { kill "$SPIN_PID" 2>/dev/null; wait "$SPIN_PID" 2>/dev/null; } || true
    if [ -n "$CG" ]; then
        # a run interrupted by a signal may still be in a leaf: say so
        rmdir "$CG/run" "$CG/quota" "$CG/quota1" "$CG" 2>/dev/null ||
            echo "contention.sh: cgroup $CG not removed (a process still in it?): rmdir its leaves and it" >&2
    fi
    rm -rf "$TMP"
    bench_cache_rm
}
trap cleanup EXIT   # INT, TERM, HUP exit through it (bench_tmpdir's traps)

# ---- conditions -------------------------------------------------------------

# make_cgroups: CG with three leaves, CG/run (every run but the quota
# conditions', and the busy loop), CG/quota (a 1.5-CPU quota) and
# CG/quota1 (1 CPU); with
# --precedence CG's weight is the maximum.  cgroup v2 (cpu.max, cpu.weight)
# or v1's cpu controller (cpu.cfs_quota_us, cpu.shares).  Status 1 and the
# reason on stdout when neither can be made (needs root).
make_cgroups() {
    d=/sys/fs/cgroup/kiln-contention.$$
    if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null && mkdir "$d" 2>/dev/null; then
        if { grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
             echo +cpu > /sys/fs/cgroup/cgroup.subtree_control; } 2>/dev/null &&
           echo +cpu > "$d/cgroup.subtree_control" 2>/dev/null &&
           mkdir "$d/run" "$d/quota" "$d/quota1" && echo "150000 100000" > "$d/quota/cpu.max" &&
           echo "100000 100000" > "$d/quota1/cpu.max" &&
           { [ "$PRECEDENCE" = 0 ] || echo 10000 > "$d/cpu.weight"; }; then
            CG=$d; CGV=v2; return 0
        fi 2>/dev/null
        rmdir "$d/run" "$d/quota" "$d/quota1" "$d" 2>/dev/null || true
    fi
    d=/sys/fs/cgroup/cpu/kiln-contention.$$
    if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && mkdir "$d" 2>/dev/null; then
        if mkdir "$d/run" "$d/quota" "$d/quota1" && echo 100000 > "$d/quota/cpu.cfs_period_us" &&
           echo 150000 > "$d/quota/cpu.cfs_quota_us" &&
           echo 100000 > "$d/quota1/cpu.cfs_period_us" &&
           echo 100000 > "$d/quota1/cpu.cfs_quota_us" &&
           { [ "$PRECEDENCE" = 0 ] || echo 262144 > "$d/cpu.shares"; }; then
            CG=$d; CGV=v1; return 0
        fi 2>/dev/null
        rmdir "$d/run" "$d/quota" "$d/quota1" "$d" 2>/dev/null || true
    fi
    echo "no writable cgroup (v2 with the cpu controller, or v1's cpu; needs root)"
    return 1
}

# in_cgroup DIR CMD...: CMD moved into cgroup DIR (none: as it is)
in_cgroup() {
    if [ -z "$1" ]; then shift; "$@"; return; fi
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$@"
}

# spin_start COND / spin_stop: the competing process of COND (busy,
# jitter, busy0, jitter0); spin_stop prints the share of one CPU it got
# (utime + stime over its lifetime).  Both run in this shell, never in
# $(...): SPIN_PID is what cleanup kills, and a subshell's SPIN_PID= (or
# wait) never reached it (a stale PID, possibly reused, after a round).
spin_start() {
    # a simple command in the background, so that $! is the loop itself;
    # jitter: busy JIT_BUSY s of every JIT_PERIOD s (time.sleep for the rest)
    if [ "${1%0}" = jitter ]; then
        loop="exec python3 -c 'import time
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < $JIT_BUSY: pass
    time.sleep($JIT_PERIOD - $JIT_BUSY)'"
    else
        loop='exec sh -c "while :; do :; done"'
    fi
    sh -c '[ -z "$0" ] || echo $$ > "$0/cgroup.procs"; eval "$1"' "${CG:+$CG/run}" "$loop" &
    SPIN_PID=$!
    SPIN_T0=$(date +%s.%N)
    # busy and jitter: the competitor settles before the run starts, a
    # steady neighbour (python3's own start-up is ~50 ms of a CPU: within
    # kiln's first 100 ms interval it reads as a neighbour, and session 45's
    # team stepped down for ~1 s, docs/PERFORMANCE.md); busy0 and jitter0
    # measure that start-up beside the run
    case $1 in *0) ;; *) sleep 0.3 ;; esac
}
spin_stop() {
    # fields 14, 15 of /proc/PID/stat: utime, stime in clock ticks
    ticks=$(awk '{ print $14 + $15 }' "/proc/$SPIN_PID/stat" 2>/dev/null || echo 0)
    kill "$SPIN_PID" 2>/dev/null || true
    wait "$SPIN_PID" 2>/dev/null || true
    SPIN_PID=
    awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v t0="$SPIN_T0" -v t1="$(date +%s.%N)" \
        'BEGIN { printf "%.2f\n", (t1 > t0) ? t / hz / (t1 - t0) : 0 }'
}

# under COND CMD...: CMD in condition COND.
under() {
    cond=$1; shift
    case $cond in
        quiet|busy|jitter|busy0|jitter0) in_cgroup "${CG:+$CG/run}" "$@" ;;
        core1) in_cgroup "${CG:+$CG/run}" taskset -c 0 "$@" ;;
        quota|quota1) in_cgroup "$CG/$cond" "$@" ;;
    esac
}

# ---- contenders ---------------------------------------------------------------

KSTEPS=$((WARMUP + STEPS))
# run_one BENCH WHO COND: one run of WHO on BENCH under COND
run_one() {
    bench=$1; who=$2; cond=$3
    layout=${bench#cnn-} prec=fp32
    [ "$bench" != cnn-bf16 ] || { layout=nchw; prec=bf16; }
    case $who in
        kiln*)
            # every row as a user runs it (no key: the adaptive team is the
            # default); KILN_ADAPT=0 measures the kiln row with the team fixed
            bin=$KILN; ad=run.threads=0; spin=
            [ -z "${KILN_ADAPT:-}" ] || ad=plugin.cpu.adaptive=$KILN_ADAPT
            case $who in
                kiln-before) bin=$KILN_BEFORE; ad=run.threads=0 ;;
                kiln-s*) spin=GOMP_SPINCOUNT=${who#kiln-s}; ad=run.threads=0 ;;
            esac
            probe_cache "$bin"
            if [ "$bench" = mlp ]; then
                under "$cond" env $BLAS_ENV $spin "$bin" train "$HERE/mlp_bench.ini" \
                    train.epochs="$MLP_EPOCHS" train.max_steps="$MLP_STEPS" run.threads=0 "$ad"
            else
                # run.precision=fp32 is the default: the same command line
                under "$cond" env $BLAS_ENV $spin "$bin" train "$HERE/cnn_bench.ini" \
                    model.layout="$layout" run.threads=0 "$ad" train.batch="$BATCH" \
                    data.limit=$((KSTEPS * BATCH)) train.max_steps="$KSTEPS" train.eval=0 \
                    run.precision="$prec"
            fi ;;
        pt-*)
            case $who in
                pt-default) set -- 2 ;;
                pt-passive) set -- 2 OMP_WAIT_POLICY=PASSIVE ;;
                pt-omp1) set -- 1 OMP_NUM_THREADS=1 ;;
            esac
            nt=$1; shift
            if [ "$bench" = mlp ]; then
                under "$cond" env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS $BLAS_ENV \
                    "$@" "$PYTHON" "$HERE/pytorch_mlp.py" --threads "$nt" --steps "$MLP_STEPS" \
                    --epochs "$MLP_EPOCHS" --flush-denormal
            else
                under "$cond" env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS $BLAS_ENV \
                    "$@" "$PYTHON" "$HERE/pytorch_cnn.py" --layout "$layout" --threads "$nt" \
                    --steps "$STEPS" --warmup-steps "$WARMUP" --batch "$BATCH" --eval-samples 500 \
                    --precision "$prec"
            fi ;;
    esac
}

# ---- the rounds -----------------------------------------------------------------

WHY=
if [ "$PRECEDENCE" = 1 ] || case " $CONDITIONS " in *" quota"*) true ;; *) false ;; esac; then
    make_cgroups > "$TMP/why" || WHY=$(cat "$TMP/why")
fi
if [ "$PRECEDENCE" = 1 ] && [ -z "$CG" ]; then
    echo "contention.sh: --precedence: $WHY" >&2; exit 1
fi
ACTIVE=
for c in $CONDITIONS; do
    if [ "${c%1}" = quota ] && [ -z "$CG" ]; then
        echo "contention.sh: $c condition skipped: $WHY" >&2
        continue
    fi
    ACTIVE="$ACTIVE $c"
done
[ -z "$CG" ] || echo "cgroups ($CGV): $CG/run, $CG/quota, $CG/quota1$([ "$PRECEDENCE" = 0 ] || echo ' (precedence)')" >&2

echo "start: $(date -u +%H:%M:%S) loadavg $(cat /proc/loadavg); $(nproc) CPUs; python $PYTHON" >&2
r=1
while [ "$r" -le "$RUNS" ]; do
    for c in $ACTIVE; do
        echo "round $r $c: loadavg $(cat /proc/loadavg)" >&2
        printf '%s\n' "$(cut -d' ' -f1 /proc/loadavg)" >> "$TMP/load-$c"
        for b in $BENCHES; do
            for who in $CONTENDERS; do
                case $c in busy|jitter|busy0|jitter0) spin_start "$c" ;; esac
                rc=0
                line=$(run_one "$b" "$who" "$c" 2> "$TMP/err" | json_line) || rc=$?
                case $c in busy|jitter|busy0|jitter0) spin_stop >> "$TMP/spin-$c" ;; esac
                if [ -z "$line" ]; then
                    echo "contention.sh: $b $who $c round $r printed no JSON line (exit $rc):" >&2
                    tail -n 3 "$TMP/err" | sed 's/^/    /' >&2
                    continue
                fi
                echo "$b $who $c round $r: $line" >&2
                printf '%s\n' "$line" >> "$TMP/$b-$who-$c.jsonl"
            done
        done
    done
    r=$((r + 1))
done
echo "end: $(date -u +%H:%M:%S) loadavg $(cat /proc/loadavg)" >&2

# ---- the tables -------------------------------------------------------------------

med() { # FILE: the median train_samples_per_s, or n/a
    if [ -s "$1" ]; then median_field "$1" train_samples_per_s; else echo n/a; fi
}
num() { case $1 in n/a|'') printf '%11s' n/a ;; *) printf '%11.0f' "$1" ;; esac; }
ratio() {
    case "$1$2" in *n/a*) printf '%9s' n/a; return ;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%9.2f", a / b; else printf "%9s", "n/a" }'
}

for b in $BENCHES; do
    echo
    what=
    [ "$b" != mlp ] || [ "$MLP_EPOCHS" = 1 ] || what=", $MLP_EPOCHS epochs (kiln: epochs 2..$MLP_EPOCHS)"
    echo "$b: median samples/s of $RUNS interleaved rounds ($PYTHON)$what"
    printf '%-7s %5s %5s' cond load spin
    for who in $CONTENDERS; do printf ' %12s' "$who"; done
    printf ' %11s %9s %9s\n' pt-best kiln/best kiln/quiet
    quiet=$(med "$TMP/$b-kiln-quiet.jsonl")
    for c in $ACTIVE; do
        load=$(median < "$TMP/load-$c")
        spin=-
        [ ! -s "$TMP/spin-$c" ] || spin=$(median < "$TMP/spin-$c")
        printf '%-7s %5s %5s' "$c" "$load" "$spin"
        best=0
        for who in $CONTENDERS; do
            m=$(med "$TMP/$b-$who-$c.jsonl")
            num "$m" | sed 's/^/  /'
            case $who in pt-*)
                [ "$m" = n/a ] || best=$(awk -v a="$m" -v b="$best" 'BEGIN { print (a > b) ? a : b }') ;;
            esac
        done
        k=$(med "$TMP/$b-kiln-$c.jsonl")
        printf ' %11.0f %s %s\n' "$best" "$(ratio "$k" "$best")" "$(ratio "$k" "$quiet")"
    done
done
