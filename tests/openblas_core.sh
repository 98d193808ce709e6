#!/bin/sh
# tests/openblas_core.sh - the kernels OpenBLAS runs in the cpu plugin, on
# a CPU with AVX-512 or AVX2, are not its Prescott (SSE3) ones.
#
# OpenBLAS's DYNAMIC_ARCH build (Debian's 0.3.21) picks its kernels from
# the CPU's family and model as it loads; a CPU it does not know (an
# Emerald Rapids, family 6 model 207) gets Prescott's, at a fraction of
# the speed (the FFT convolution's per-frequency GEMMs run on it:
# docs/plugins.md).  plugins/cpu/openblas.c then has it choose again as
# OPENBLAS_CORETYPE would (SkylakeX where CPUID says AVX-512, Haswell
# where AVX2 and FMA) and says so once, at debug level; a core the user
# sets is kept.
#  1. The device line names a core other than Prescott; where the log
#     says kiln chose, it names the core the CPU's flags call for, and the
#     device line that core; at the default log level nothing says so
#     (before session 43 an INFO line on every command's stderr).
#  2. OPENBLAS_CORETYPE=Prescott set by the user: Prescott, no such line.
#  3. An MLP whose f32 GEMMs all run on OpenBLAS (gemm_impl = openblas,
#     1 thread) gives the losses of the same run on oneDNN, with either
#     core, within float rounding (1e-4 of the loss).
#  4. With the pthread build first on LD_LIBRARY_PATH (refused), its
#     thread pool is stopped as the device opens.
# Skipped where the plugin has no usable OpenBLAS, and on a CPU without
# AVX2 (where Prescott's may be the right kernels).
name=openblas_core
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
unset OPENBLAS_CORETYPE KILN_LOG_LEVEL

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
	cpu_core=SkylakeX
elif has avx2 && has fma; then
	cpu_core=Haswell
else
	echo "SKIP: this CPU has neither AVX-512 nor AVX2 with FMA (Prescott's kernels may be the right ones)"
	exit 77
fi

{
	ini run seed=7 threads=1
	ini_synthetic 512 8 10 image_channels=1 workers=0
	ini_layers flat:flatten fc1:linear:out=96 r1:relu fc2:linear:out=64 r2:relu \
		fc3:linear:out=10 loss:softmax_xent
	ini train epochs=1 max_steps=8 batch=64 lr=0.05 log_every=1 eval=1
} >"$tmp/mlp.ini"

# run LABEL IMPL [ARGS...]: the MLP with every eligible f32 GEMM on IMPL
run() {
	_l=$1 _i=$2
	shift 2
	KILN_LOG_LEVEL=debug kiln 0 train "$tmp/mlp.ini" "run.out_dir=$tmp/$_l" \
		"plugin.cpu.gemm_impl=$_i" plugin.cpu.tune_cache=none "$@"
	cp "$out" "$tmp/$_l.out"
}
# core: the core the device line names: "OpenBLAS 0.3.21 (OpenMP, CORE)"
core() { sed -n 's/.*device cpu: .*OpenBLAS [0-9.]* *(OpenMP, \([A-Za-z0-9_]*\)).*/\1/p' "$err" | head -1; }

run dnn onednn
grep -q "device cpu: .*OpenBLAS" "$err" ||
	{ echo "SKIP: the cpu plugin has no usable OpenBLAS here (the device line names none)"; exit 77; }

# 1. not Prescott
run ob openblas
grep -q "GEMM .*(OpenBLAS)" "$err" || fail "gemm_impl = openblas: no GEMM planned on OpenBLAS"
c=$(core)
[ -n "$c" ] || fail "no OpenBLAS core in the device line"
[ "$c" != Prescott ] ||
	fail "OpenBLAS runs its Prescott (SSE3) kernels on a CPU with $cpu_core's instruction set"
if grep -q "so kiln had it choose" "$err"; then
	stderr_has "OpenBLAS took its Prescott (SSE3) kernels on this CPU, which it does not know"
	stderr_has "so kiln had it choose $cpu_core: it runs "
	# the core it then runs: $cpu_core's, or the one its build maps that
	# to (a NO_AVX512 DYNAMIC_ARCH build runs Haswell's for SkylakeX)
	ran=$(sed -n "s/.*so kiln had it choose $cpu_core: it runs \([A-Za-z0-9_]*\)'s kernels.*/\1/p" "$err" | head -1)
	[ -n "$ran" ] && [ "$ran" != Prescott ] ||
		fail "kiln chose $cpu_core for OpenBLAS; the core the log says it runs: '$ran'"
	[ "$c" = "$ran" ] || fail "the log says OpenBLAS runs $ran's kernels, the device line says $c"
	echo "ok: OpenBLAS did not know this CPU; kiln had it take $c's kernels"
else
	echo "ok: OpenBLAS knows this CPU: $c"
fi
[ "$(grep -c "so kiln had it choose" "$err")" -le 1 ] || fail "the choice said more than once"
if grep -q "so kiln had it choose" "$err"; then
	kiln 0 train "$tmp/mlp.ini" "run.out_dir=$tmp/quiet" plugin.cpu.gemm_impl=openblas \
		plugin.cpu.tune_cache=none
	! grep -q "kiln had it choose" "$err" ||
		fail "the choice of OpenBLAS's core is said at the default log level (a debug line)"
	echo "ok: at the default log level the choice is not said"
fi

# 2. the user's choice kept
OPENBLAS_CORETYPE=Prescott run user openblas
[ "$(core)" = Prescott ] || fail "OPENBLAS_CORETYPE=Prescott: the device line says '$(core)'"
! grep -q "kiln had it choose" "$err" || fail "OPENBLAS_CORETYPE=Prescott: kiln chose a core"
echo "ok: OPENBLAS_CORETYPE set by the user is kept"

# 3. the numbers: float rounding only (measured: the same 7 digits)
losses_agree "$c" openblas "$tmp/ob.out" onednn "$tmp/dnn.out" 1e-4
losses_agree Prescott openblas "$tmp/user.out" onednn "$tmp/dnn.out" 1e-4

# 4. OpenBLAS's pthread build found first (LD_LIBRARY_PATH): refused, and
# its thread pool, started as it loaded, stopped then (each pool thread
# maps a 128 MiB buffer as it first runs: under ulimit -v, in the middle
# of oneDNN's JIT, a crash).  The run's threads, the most of 10 looks
# over a second of training, are those of the run on the OpenMP build
# (before: one more a CPU past the first).
# threads LABEL [LD_LIBRARY_PATH]: that most, of a long run of the MLP
# (its stdout is the number: a failure's words go to stderr; a thread
# count of the environment's would let the pool's check pass unseen)
threads() {
	unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
	_llp=${LD_LIBRARY_PATH:-}
	[ -z "${2:-}" ] || _llp="$2${_llp:+:$_llp}"
	LD_LIBRARY_PATH=$_llp "$kiln" train "$tmp/mlp.ini" \
		"run.out_dir=" train.max_steps=1000000 train.epochs=100000 plugin.cpu.tune_cache=none \
		>"$tmp/$1.bg" 2>&1 &
	_pid=$!
	_n=0
	until grep -q "step 3/" "$tmp/$1.bg"; do
		[ $_n -lt 600 ] && kill -0 $_pid 2>/dev/null ||
			{ kill $_pid 2>/dev/null; cat "$tmp/$1.bg" >&2; fail "$1: no third step in 60 s" >&2; }
		sleep 0.1
		_n=$((_n + 1))
	done
	_most=0
	for _i in 1 2 3 4 5 6 7 8 9 10; do
		_t=$(ls "/proc/$_pid/task" | wc -l)
		[ "$_t" -le $_most ] || _most=$_t
		sleep 0.1
	done
	kill $_pid
	wait $_pid 2>/dev/null
	echo $_most
}
pt=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ -e "$pt/libopenblas.so.0" ] && [ "$(nproc)" -ge 2 ]; then
	base=$(threads openmp) || exit 1
	with=$(threads pthread "$pt") || exit 1
	echo "threads while training: $base on the OpenMP build, $with with the pthread build first"
	[ "$with" -le "$base" ] ||
		fail "with the pthread OpenBLAS first on LD_LIBRARY_PATH the run has $with threads, $base without: its pool still runs"
else
	echo "(no $pt/libopenblas.so.0, or one CPU: the pthread build's pool not checked)"
fi
echo "PASS: $name ($checks checks)"
