#!/bin/sh
# The device conformance suites (tests/check_device_*, one per op family) on
# the CUDA device.  Each exits 77 (SKIP) where the device cannot be opened
# (no driver, no GPU) and says why; on a GPU machine they run every op test
# against the reference loops (tests/gpu/run.sh runs them there).  Exit
# status: 1 when a suite failed, else 77 when one skipped, else 0.
: "${top_builddir:=.}"
KILN_TEST_DEVICE=cuda
export KILN_TEST_DEVICE
status=0
ran=0
for suite in "$top_builddir"/tests/check_device_*; do
	# the programs (libtool's wrappers), not their objects nor logs
	case ${suite##*/} in *.*) continue ;; esac
	[ -x "$suite" ] || continue
	ran=$((ran + 1))
	"$suite"
	rc=$?
	case $rc in
	0) ;;
	77) [ $status -eq 0 ] && status=77 ;;
	*) echo "${suite##*/}: exit $rc"; status=1 ;;
	esac
done
[ $ran -gt 0 ] || { echo "no tests/check_device_* under $top_builddir: build them first"; exit 1; }
exit $status
