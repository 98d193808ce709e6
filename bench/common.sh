# bench/common.sh - what the benchmark scripts share; sourced (not run) as
#   . "$(dirname "$0")/common.sh"
# after setting PYTHON (for median_field).  Gives:
#   usage                  the script's header comment as help; exit 2
#   bench_tmpdir NAME      TMP, a scratch directory kiln-NAME.XXXXXX removed
#                          on exit (and on INT / TERM / HUP, with 130 / 143 /
#                          129: dash runs no EXIT trap on a signal it leaves
#                          untrapped)
#   XDG_CACHE_HOME         set on sourcing, unless the caller set it: kiln's
#                          caches (the CPU tune cache, inflated IDX data, the
#                          plugin probe) in BENCH_CACHE, a directory of this
#                          script run's own, shared by its runs (the first
#                          tunes, the later ones find it warm), never the
#                          user's ~/.cache
#   bench_cache_rm         removes BENCH_CACHE: the exit traps of common.sh and
#                          bench_tmpdir call it; a script that sets an EXIT
#                          trap of its own calls it there
#   json_line              the last JSON line on stdin with "train_samples_per_s"
#   median_field FILE KEY  median of KEY over FILE's JSON lines that have it
#   field KEY              the last number logged as "KEY": on stdin
#   median                 the median of the numbers on stdin, one a line
#   bench_opt ARGS...      the options cnn.sh and mlp.sh share (see below)
#   measure_peak           PEAK = the larger of PEAK (0 at first) and the GFLOP/s
#                          of $GEMM --threads $THREADS (bench/gemm_peak)
#   collect_runs OUT LABEL CMD...
#                          CMD's JSON line of each of RUNS runs into OUT
#   BLAS_ENV               env's arguments for Debian's OpenBLAS (PyTorch 1.13,
#                          numpy): OPENBLAS_CORETYPE=SkylakeX where the CPU has
#                          AVX-512 (OpenBLAS 0.3.21 does not recognise some of
#                          those CPUs and falls back to SSE kernels); elsewhere
#                          "-u OPENBLAS_CORETYPE", OpenBLAS's own choice (forced
#                          SkylakeX kernels die with SIGILL on an AVX2-only CPU;
#                          an empty value is not "unset": it falls back to
#                          Haswell kernels, not Zen's); use as `env $BLAS_ENV CMD`
#   real_kiln              when $KILN is libtool's wrapper script of an uninstalled
#                          kiln, sets KILN to the binary it runs (DIR/.libs/kiln)
#                          and puts DIR/.libs first in the exported LD_LIBRARY_PATH:
#                          the wrapper's bash and sed runs cost 10-100 ms of each
#                          whole-run time that an installed kiln does not pay.
#                          Paths may hold spaces; every script calls it after
#                          setting KILN.  It also calls probe_cache "$KILN"
#   probe_cache BIN        KILN_PROBE_CACHE = the plugin probe's file of BIN's
#                          build (one a build directory, in ~/.cache/kiln),
#                          unless the caller set KILN_PROBE_CACHE or
#                          XDG_CACHE_HOME; scripts that alternate two kilns
#                          call it before each run
#   C2C_FAST_NS            200: a run is "fast" when the placement probes
#                          before and after it both read under this many ns
#   C2C_TIMEOUT_S          10 (the caller's, if set): a placement probe that
#                          runs longer is stopped and is no probe
#   place_before, place_after
#                          the placement probe around one run (below): C2C_BEFORE,
#                          C2C_AFTER, PLACE (fast, slow, mixed or "no probe")
#   place_fresh            the next place_before probes anew
#   place_json             the run's probes and placement as JSON members
#   run_words BIN          the words that run BIN: libtool's wrapper's real
#                          binary (DIR/.libs/BIN) with its own build's
#                          libraries, else BIN, after `env` (which execs it,
#                          so $! is kiln's own pid); for scripts that run two
#                          builds in turn, where real_kiln's one KILN and
#                          exported LD_LIBRARY_PATH do not fit.  Unquoted:
#                          paths without spaces

usage() {
    sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

# A benchmark's timings, taken under whatever load the machine has, must not
# become the user's tune cache, nor the user's cache decide the benchmark's
# (session 16).  To measure on a warm cache of one's own, set XDG_CACHE_HOME.
# The caches of content alone, which no timing decides and which are used
# only when they match their files (the plugin probe's answers, the idx
# source's inflated copies), stay the user's ($HOME/.cache/kiln): a fresh
# folder made every run 1 of a kiln row inflate Fashion-MNIST and probe the
# plugins, 0.35 s that no later run pays (session 17).
bench_cache_rm() {
    [ -z "${BENCH_CACHE:-}" ] || rm -rf "$BENCH_CACHE"
}
if [ -z "${XDG_CACHE_HOME:-}" ]; then
    BENCH_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-cache.XXXXXX")
    XDG_CACHE_HOME=$BENCH_CACHE
    export XDG_CACHE_HOME
    trap 'bench_cache_rm' EXIT
    if [ -n "${HOME:-}" ] && mkdir -p "$HOME/.cache/kiln/idx" 2>/dev/null; then
        mkdir -p "$BENCH_CACHE/kiln"
        ln -s "$HOME/.cache/kiln/idx" "$BENCH_CACHE/kiln/idx"
        # keyed by build (probe_cache below), unless the caller chose a file
        [ -n "${KILN_PROBE_CACHE:-}" ] || _bc_probe_dir=$HOME/.cache/kiln
    fi
fi

# probe_cache BIN: when common.sh chose the probe cache (above), points
# KILN_PROBE_CACHE at the file of BIN's build, plugin_probe.<cksum of the
# build directory> in ~/.cache/kiln (BIN's directory, less a trailing
# .libs: libtool's wrapper and the binary it runs share one).  One file
# for every build would lose a build's answers each time a build of
# another ABI rewrote it (core/probe_cache.c keeps the lines of its own
# ABI only): A/B runs alternating builds would probe every run (session 20).
# real_kiln calls it for KILN; a script that runs a second kiln calls it
# before each run of either.
probe_cache() {
    [ -n "${_bc_probe_dir:-}" ] || return 0
    _pc_dir=$(cd "$(dirname "$1")" 2>/dev/null && pwd -P) || _pc_dir=$(dirname "$1")
    _pc_dir=${_pc_dir%/.libs}
    KILN_PROBE_CACHE=$_bc_probe_dir/plugin_probe.$(printf '%s' "$_pc_dir" | cksum | cut -d' ' -f1)
    export KILN_PROBE_CACHE
}
[ -z "${KILN:-}" ] || probe_cache "$KILN"

bench_tmpdir() {
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln-$1.XXXXXX")
    trap 'rm -rf "$TMP"; bench_cache_rm' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
}

json_line() {
    grep '^[[:space:]]*{.*"train_samples_per_s"' | tail -n 1 || true
}

# Negative values, and zero rates, mean "not measured" (kiln writes test_acc
# -1 and eval_samples_per_s 0 when it did not evaluate); "n/a" when no line
# has a measured KEY.
median_field() {
    "$PYTHON" - "$1" "$2" <<'PY'
import json, statistics, sys
vals = []
for l in open(sys.argv[1]):
    if l.strip():
        v = json.loads(l).get(sys.argv[2])
        if isinstance(v, (int, float)) and v >= 0 and not (v == 0 and sys.argv[2].endswith("_per_s")):
            vals.append(float(v))
print(statistics.median(vals) if vals else "n/a")
PY
}

field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | tail -1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# bench_opt "$@": when $1 is --runs, --steps, --threads or --precision (with
# its value as the next word, or after "="), sets RUNS, STEPS, THREADS or
# PRECISION and NSHIFT to the number of words used; returns 1 for any other
# $1, so the caller reports it as unknown.  These variables are read by the
# sourcing script (its `shift "$NSHIFT"`), which shellcheck cannot see.
# shellcheck disable=SC2034
bench_opt() {
    case $1 in
        --runs|--steps|--threads|--precision) [ $# -ge 2 ] || usage; _bo_v=$2; NSHIFT=2 ;;
        --runs=*|--steps=*|--threads=*|--precision=*) _bo_v=${1#*=}; NSHIFT=1 ;;
        *) return 1 ;;
    esac
    case ${1%%=*} in
        --runs) RUNS=$_bo_v ;;
        --steps) STEPS=$_bo_v ;;
        --threads) THREADS=$_bo_v ;;
        --precision) PRECISION=$_bo_v ;;
    esac
}

# collect_runs OUT LABEL CMD...: runs CMD $RUNS times; each run's json_line
# goes to OUT (emptied first) and, as "LABEL run I: LINE", to stderr.  A run
# that prints none ends the script (exit 1) naming LABEL and the run.
collect_runs() {
    _cr_out=$1 _cr_label=$2
    shift 2
    : > "$_cr_out"
    _cr_i=1
    while [ "$_cr_i" -le "$RUNS" ]; do
        _cr_line=$("$@" | json_line) || true
        if [ -z "$_cr_line" ]; then
            echo "$(basename "$0"): $_cr_label run $_cr_i printed no JSON line with train_samples_per_s" >&2
            exit 1
        fi
        echo "$_cr_label run $_cr_i: $_cr_line" >&2
        printf '%s\n' "$_cr_line" >> "$_cr_out"
        _cr_i=$((_cr_i + 1))
    done
}

# ab_rounds RUNS ITEMS ROWS FN: an interleaved A/B.  RUNS rounds, A before
# B in odd rounds and B before A in even ones, each of ITEMS (words) in turn;
# FN W ITEM prints one build's figures for ITEM (W is A or B), appended to
# ROWS as "ITEM W FIGURES" and shown on stderr with its round.
ab_rounds() {
    _ab_runs=$1 _ab_items=$2 _ab_rows=$3 _ab_fn=$4
    _ab_r=1
    while [ "$_ab_r" -le "$_ab_runs" ]; do
        _ab_order="A B"
        [ $((_ab_r % 2)) -eq 1 ] || _ab_order="B A"
        for _ab_it in $_ab_items; do
            for _ab_w in $_ab_order; do
                _ab_res=$("$_ab_fn" "$_ab_w" "$_ab_it")
                echo "round $_ab_r $_ab_it $_ab_w: $_ab_res" >&2
                echo "$_ab_it $_ab_w $_ab_res" >> "$_ab_rows"
            done
        done
        _ab_r=$((_ab_r + 1))
    done
}

PEAK=0
measure_peak() {
    [ -x "$GEMM" ] || return 0
    p=$("$GEMM" --threads "$THREADS" 2>/dev/null | grep '^[[:space:]]*{' | head -n 1 |
        "$PYTHON" -c 'import json,sys; print(json.loads(sys.stdin.read())["gflops"])' 2>/dev/null) || p=0
    PEAK=$(awk -v a="$PEAK" -v b="${p:-0}" 'BEGIN { print (b > a ? b : a) }')
}

# shellcheck disable=SC2034 # BLAS_ENV is for the sourcing script
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    BLAS_ENV=OPENBLAS_CORETYPE=SkylakeX
else
    BLAS_ENV="-u OPENBLAS_CORETYPE"
fi

real_kiln() {
    _rk_dir=$(dirname "$KILN")
    _rk_base=$(basename "$KILN")
    if [ -x "$_rk_dir/.libs/$_rk_base" ] && head -c 200 "$KILN" 2>/dev/null | grep -q '^#! */bin/bash' &&
        grep -q 'libtool' "$KILN" 2>/dev/null; then
        _rk_abs=$(cd "$_rk_dir" && pwd)
        LD_LIBRARY_PATH="$_rk_abs/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export LD_LIBRARY_PATH
        KILN="$_rk_abs/.libs/$_rk_base"
    fi
    probe_cache "$KILN"
}

run_words() {
    _rw_dir=$(cd "$(dirname "$1")" && pwd)
    _rw_base=$(basename "$1")
    if [ -x "$_rw_dir/.libs/$_rw_base" ]; then
        echo "env LD_LIBRARY_PATH=$_rw_dir/.libs $_rw_dir/.libs/$_rw_base"
    else
        echo "env $1"
    fi
}

# The placement probe (docs/PERFORMANCE.md, "Session 48: the VM's two speeds
# are the vCPUs' distance", "Session 49: the anchors' placement probe").  On
# the 2-vCPU VM of sessions 46-49 the host runs the two vCPUs on one CCD
# (one L3) or on two, by turns, tens of seconds at a time, and a 2-thread
# run on two CCDs loses up to a third of its speed.  $C2C --rounds 1
# (bench/c2c_latency: one cache line's round trip CPU 0 <-> 1, 0.01-0.15 s;
# ~1 s a probe under heavy load)
# reads ~55-130 ns on one CCD and ~300-360 ns on two; C2C_FAST_NS, between
# the two, is the one threshold of every script that classifies runs.  A
# CPU that other processes keep busy also reads slow (a round trip waits
# for the other thread's next time slice): "slow" means the run's two CPUs
# were far apart or shared, either way not the fast case.
#   place_before   C2C_BEFORE = the last probe taken since place_fresh (the
#                  probe after one run is the probe before the next), else a
#                  new one
#   place_after    a new probe, C2C_AFTER; PLACE = "fast" when both are under
#                  C2C_FAST_NS, "slow" when neither is, "mixed" otherwise,
#                  "no probe" when either is not a number (failed, empty)
# A probe is "null" when PLACE_PROBE is not 1 (a script's --no-probe), $C2C
# is missing, or it fails (e.g. CPU 1 not in the affinity mask: `taskset -c
# 0`) or runs past C2C_TIMEOUT_S, 10 s (timeout(1), where it exists: a hung
# probe cannot hang a benchmark); the first failure is reported on stderr,
# the runs go on.
C2C_FAST_NS=200
C2C_TIMEOUT_S=${C2C_TIMEOUT_S:-10}
C2C=${C2C:-./bench/c2c_latency}
PLACE_PROBE=1
C2C_LAST=
_place_warned=
place_probe() {
    C2C_LAST=null
    [ "$PLACE_PROBE" = 1 ] || return 0
    # at most C2C_TIMEOUT_S (a hung probe is no probe), where timeout(1) exists
    _pp_rc=0
    if command -v timeout >/dev/null 2>&1; then
        _pp_out=$(timeout "$C2C_TIMEOUT_S" "$C2C" --rounds 1 2>&1) || _pp_rc=$?
    else
        _pp_out=$("$C2C" --rounds 1 2>&1) || _pp_rc=$?
    fi
    [ "$_pp_rc" != 124 ] || _pp_out="timed out after $C2C_TIMEOUT_S s"
    _pp=$(printf '%s\n' "$_pp_out" | sed -n 's/^{.*"round_trip_ns_median": *\([0-9][0-9.]*\).*/\1/p' | tail -n 1)
    if [ -n "$_pp" ]; then
        C2C_LAST=$_pp
    elif [ -z "$_place_warned" ]; then
        _place_warned=1
        echo "$(basename "$0"): no placement probe ($C2C: $(printf '%s\n' "$_pp_out" | tail -n 1 | cut -c1-200)); runs marked \"no probe\"" >&2
    fi
}
place_fresh() { C2C_LAST=; }
place_before() {
    [ -n "$C2C_LAST" ] || place_probe
    C2C_BEFORE=$C2C_LAST
}
place_after() {
    place_probe
    C2C_AFTER=$C2C_LAST
    PLACE=$(awk -v b="$C2C_BEFORE" -v a="$C2C_AFTER" -v t="$C2C_FAST_NS" 'BEGIN {
        # only numbers are classified: null, empty or anything else is no probe
        num = "^[0-9]+([.][0-9]*)?$"
        if (b !~ num || a !~ num) { print "no probe"; exit }
        f = (b + 0 < t) + (a + 0 < t)
        print f == 2 ? "fast" : f == 0 ? "slow" : "mixed" }')
}
place_json() {
    printf '"c2c_before": %s, "c2c_after": %s, "placement": "%s", "c2c_fast_ns": %s, ' \
        "$C2C_BEFORE" "$C2C_AFTER" "$PLACE" "$C2C_FAST_NS"
}
