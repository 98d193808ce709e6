#!/bin/sh
# tests/openblas_rlimit.sh - the cpu plugin under an address-space limit
# (ulimit -v) too small for OpenBLAS: a run on oneDNN alone and a line
# saying why, not a hang.
#
# OpenBLAS 0.3.21 (its OpenMP build) maps a 128 MiB buffer for each CPU as
# it loads, and retries forever where RLIMIT_AS refuses one.  Before
# session 41 kiln-cpu.so linked it, so below about 350 MB on 2 CPUs the
# dlopen of the plugin hung (the probe child's, then kiln's own: no
# output, no exit).  Now plugins/cpu/openblas.c loads it when the device
# opens, where the limit leaves room for its buffers (one per CPU it
# counts: the affinity mask, or OMP_NUM_THREADS), its library (48 MiB) and
# oneDNN's JIT room (16 MiB); else its GEMMs run on oneDNN, and
# `gemm_impl = openblas` is an error naming both sizes.
#  1. V, the address space when the device opens: the room the message
#     gives under a limit of 160 MiB, taken from that limit.
#  2. Under V + the need - 40 MiB (where the old plugin's load hung):
#     `kiln plugins` (its probe children) and `kiln train` exit 0 and say
#     the need, n x 128 MiB + 64 MiB for the n CPUs; with OMP_NUM_THREADS=1
#     it is 1 x 128 + 64; `gemm_impl = openblas` exits 2 saying so.
#  3. Under V + the need + 24 MiB, OpenBLAS loads (the device line names it);
#     an FFT convolution's GEMMs there run on oneDNN, the 128 MiB buffer of
#     OpenBLAS's first GEMM on a thread not fitting (a hang in the first
#     step before), and on OpenBLAS 128 + 40 MiB higher.
#  4. Under V / 2, where kiln-cpu.so's own libraries do not map: exit 1,
#     the file's dlopen error and the limit said, with and without a
#     [plugin.cpu] section (core/registry.c).
name=openblas_rlimit
. "$(dirname "$0")/lib.sh"
. "$srcdir/tests/config_lib.sh"
unset OMP_NUM_THREADS

"$kiln" plugins >"$out" 2>"$err" || fail "kiln plugins"
grep -q "^device cpu: .*OpenBLAS" "$out" ||
	{ echo "SKIP: the cpu device has no OpenBLAS here (configure --with-openblas)"; exit 77; }

cfg="$tmp/mlp.ini"
{
	ini run device=cpu threads=1 out_dir=
	ini_synthetic 256 "8 8" 10 image_channels=1 workers=0
	mlp10_layers 64
	ini train batch=32 eval=0 max_steps=2 epochs=1
} >"$cfg"

# under KIB CMD...: CMD (a kiln command) under ulimit -v KIB, output in
# $out and $err; its exit status (a hang: 137 after 60 s)
under() {
	_lim=$1
	shift
	last="$* (under ulimit -v $_lim)"
	(
		ulimit -v "$_lim" || exit 98
		exec timeout -s KILL 60 "$kiln" "$@" >"$out" 2>"$err"
	)
}
# the MiB figures of the message in $err: "leaves R MiB, below the M MiB"
room() { sed -n 's/.*OpenBLAS not loaded: the address space limit (RLIMIT_AS, ulimit -v) leaves \([0-9]*\) MiB.*/\1/p' "$err" | head -1; }

n=$(nproc)
need=$(awk -v n="$n" 'BEGIN { printf "%.0f", (n * 134225920 + 64 * 1048576) / 1048576 }')

# 1. V
st=0
under $((160 * 1024)) train "$cfg" || st=$?
[ $st = 0 ] || fail "kiln train under ulimit -v 160 MiB: exit $st"
r=$(room)
[ -n "$r" ] || fail "under ulimit -v 160 MiB: no 'OpenBLAS not loaded' line with the room"
V=$((160 - r))
echo "the device opens at about $V MiB of address space; OpenBLAS needs $need MiB ($n CPUs)"

# 2. below the need: no hang, a run, the sizes
lim=$(((V + need - 40) * 1024))
st=0
KILN_PROBE_CACHE=none under $lim plugins || st=$?
[ $st = 0 ] || fail "kiln plugins (probe children) exit $st (137: a hang)"
grep -q "^device  *cpu .*available" "$out" || fail "kiln plugins: the cpu device is not available"
st=0
under $lim train "$cfg" || st=$?
[ $st = 0 ] || fail "kiln train exit $st (137: a hang)"
r=$(room)
[ -n "$r" ] && [ "$r" -ge $((need - 42)) ] && [ "$r" -le $((need - 38)) ] ||
	fail "the room said, '$r' MiB, is not the limit's $((need - 40)) MiB (+-2)"
stderr_has " MiB, below the $need MiB the cpu plugin's BLAS (OpenBLAS) needs: 128 MiB for each of the $n threads it counts as it loads"
stderr_has "; its GEMMs run on oneDNN"
! grep -q "device cpu: .*OpenBLAS" "$err" || fail "the device line names OpenBLAS, which was not loaded"
echo "ok: under ulimit -v $((lim / 1024)) MiB OpenBLAS is left out and the MLP trains"
OMP_NUM_THREADS=1 under $((160 * 1024)) train "$cfg" || fail "OMP_NUM_THREADS=1: exit $?"
stderr_has " MiB, below the 192 MiB the cpu plugin's BLAS (OpenBLAS) needs: 128 MiB for each of the 1 threads"
st=0
under $lim train "$cfg" plugin.cpu.gemm_impl=openblas || st=$?
[ $st = 2 ] || fail "gemm_impl = openblas: exit $st, want 2"
stderr_has "kiln: error: device 'cpu': cpu: [plugin.cpu] gemm_impl = openblas: not loaded: the address space limit (RLIMIT_AS, ulimit -v) leaves"
stderr_has " MiB, below the $need MiB the cpu plugin's BLAS (OpenBLAS) needs"
echo "ok: gemm_impl = openblas is refused naming the sizes"

# 3. above it: loaded
lim=$(((V + need + 24) * 1024))
st=0
KILN_LOG_LEVEL=debug under $lim train "$cfg" || st=$?
[ $st = 0 ] || fail "kiln train under ulimit -v $((lim / 1024)) MiB: exit $st"
stderr_has "device cpu: oneDNN"
grep -q "device cpu: .*OpenBLAS" "$err" || fail "under ulimit -v $((lim / 1024)) MiB OpenBLAS was not loaded"
! grep -q "OpenBLAS not loaded" "$err" || fail "under ulimit -v $((lim / 1024)) MiB: 'not loaded' said"
echo "ok: under ulimit -v $((lim / 1024)) MiB OpenBLAS loads"

# 3b. an FFT convolution's GEMMs (OpenBLAS's, where it is loaded) each map
# a buffer of OpenBLAS's pool at a thread's first GEMM: under the same
# limit, 24 MiB above what loading takes, that one does not fit; before
# session 41 the first step hung there (ulimit -v 392000-450000 KiB
# here); now the plan maps it at prepare or runs its GEMMs on oneDNN
fft="$srcdir/tests/data/fft_convs.ini"
if "$kiln" train "$fft" >/dev/null 2>&1; then
	st=0
	KILN_LOG_LEVEL=debug under $lim train "$fft" || st=$?
	[ $st = 0 ] || fail "the FFT model under ulimit -v $((lim / 1024)) MiB: exit $st (137: a hang)"
	grep -q "CONV x .*: FFT 16x16.*(oneDNN)" "$err" || fail "the FFT's GEMMs are not oneDNN's"
	stderr_has "[cpu] OpenBLAS's GEMM buffers for the team's 1 threads (128 MiB each, 0 mapped) do not fit the "
	echo "ok: the FFT model under ulimit -v $((lim / 1024)) MiB: its GEMMs on oneDNN"
	lim2=$(((V + need + 128 + 40) * 1024))
	st=0
	KILN_LOG_LEVEL=debug under $lim2 train "$fft" || st=$?
	[ $st = 0 ] || fail "the FFT model under ulimit -v $((lim2 / 1024)) MiB: exit $st (137: a hang)"
	grep -q "CONV x .*: FFT 16x16.*(OpenBLAS)" "$err" || fail "the FFT's GEMMs are not OpenBLAS's"
	echo "ok: the FFT model under ulimit -v $((lim2 / 1024)) MiB: its GEMMs on OpenBLAS"
else
	echo "(no FFT convolution in this build: 3b skipped)"
fi

# 4. below what the plugin's own libraries map (oneDNN's): an error naming
# the file and the limit, exit 1 (before session 41, with a [plugin.cpu]
# section, "no device, comm, precision or optim plugin named 'cpu'", exit
# 2, where the hang did not come first)
lim=$((V / 2 * 1024))
[ $lim -ge 24576 ] || lim=24576
printf '[plugin.cpu]\nadaptive = 0\n' >>"$cfg"
st=0
under $lim train "$cfg" || st=$?
[ $st = 1 ] || fail "exit $st, want 1"
stderr_has "[plugin.cpu]: "
stderr_has "kiln-cpu.so: dlopen failed: "
stderr_has "(out of address space: RLIMIT_AS, ulimit -v, is $((lim / 1024)).0 MiB, "
sed -i '/^\[plugin.cpu\]/,$d' "$cfg"
st=0
under $lim train "$cfg" || st=$?
[ $st = 1 ] || fail "exit $st, want 1"
stderr_has "out of memory loading plugin file "
stderr_has "kiln-cpu.so (looking for device plugin 'cpu'): dlopen failed: "
stderr_has "(out of address space: RLIMIT_AS, ulimit -v, is $((lim / 1024)).0 MiB, "
echo "ok: under ulimit -v $((lim / 1024)) MiB the plugin's libraries do not map: said, exit 1"
echo "PASS: $name"
