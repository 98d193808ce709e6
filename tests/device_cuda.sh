#!/bin/sh
# The device conformance suite (tests/check_device) on the CUDA device.  It
# exits 77 (SKIP) where the device cannot be opened (no driver, no GPU) and
# says why; on a GPU machine it runs every op test against the reference
# loops (tests/gpu/run.sh runs it there).
: "${top_builddir:=.}"
KILN_TEST_DEVICE=cuda
export KILN_TEST_DEVICE
exec "$top_builddir/tests/check_device"
