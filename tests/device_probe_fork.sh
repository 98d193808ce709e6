#!/bin/sh
# A suite that runs on $KILN_TEST_DEVICE (tests/check_main.h,
# need_test_device) must not load a GPU device's plugin in the process
# Check forks its tests from: loading kiln-cuda.so runs its probe, which
# initialises the CUDA driver (cudaGetDeviceCount), and a process forked
# after that cannot use the GPU (every test would fail on a GPU machine).
# check_rnn with KILN_TEST_DEVICE=cuda, under glibc's LD_DEBUG=files: the
# process that loads kiln-cuda.so is a child, not the suite's main
# process.  Skipped (77) where kiln-cuda.so was not built.
: "${top_builddir:=.}"
[ -e "$top_builddir/plugins/.libs/kiln-cuda.so" ] || { echo "no kiln-cuda.so built here"; exit 77; }
[ -x "$top_builddir/tests/check_rnn" ] || { echo "no tests/check_rnn: build it first"; exit 1; }
log=$(mktemp "${TMPDIR:-/tmp}/kiln_probe_fork.XXXXXX") || exit 1
trap 'rm -f "$log"' EXIT
KILN_TEST_DEVICE=cuda LD_DEBUG=files "$top_builddir/tests/check_rnn" > "$log" 2>&1
rc=$?
main=$(sed -n 's/^ *\([0-9]*\):.*needed by .*check_rnn .*/\1/p' "$log" | head -1)
loader=$(sed -n 's/^ *\([0-9]*\):.*file=.*kiln-cuda\.so .*dynamically loaded.*/\1/p' "$log" | head -1)
if [ -z "$main" ] || [ -z "$loader" ]; then
	echo "could not tell the processes apart (main '$main', loader of kiln-cuda.so '$loader'; exit $rc)"
	exit 77
fi
if [ "$main" = "$loader" ]; then
	echo "FAIL: check_rnn's main process ($main) loaded kiln-cuda.so (ran its probe) before Check forked its tests"
	exit 1
fi
echo "kiln-cuda.so loaded by process $loader, not by the suite's main process $main (exit $rc)"
exit 0
