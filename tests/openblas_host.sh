#!/bin/sh
# tests/openblas_host.sh - a program that loaded OpenBLAS before it opens
# a kiln CPU device keeps it as it was: its core (not chosen again under
# its own GEMMs), its pthread pool, its GEMM's numbers; the log advises
# OPENBLAS_CORETYPE instead (tests/openblas_host.c; plugins/cpu/openblas.c);
# and under an RLIMIT_AS too tight for a load of OpenBLAS but not for the
# device, the program's copy is shared, not refused (before session 43 the
# limit was looked at first).
# Each of Debian's two builds found is checked; skipped where neither is.
name=openblas_host
. "$(dirname "$0")/lib.sh"
unset OPENBLAS_CORETYPE OMP_NUM_THREADS OPENBLAS_NUM_THREADS
ran=0
for d in openblas-openmp openblas-pthread; do
	l=/usr/lib/x86_64-linux-gnu/$d/libopenblas.so.0
	[ -e "$l" ] || continue
	"$top_builddir/tests/openblas_host" "$l" >"$tmp/$d.out" 2>&1
	st=$?
	cat "$tmp/$d.out"
	[ $st -eq 77 ] && continue
	[ $st -eq 0 ] || fail "$d: openblas_host exited $st"
	"$top_builddir/tests/openblas_host" "$l" --rlimit >"$tmp/$d.lim" 2>&1
	st=$?
	cat "$tmp/$d.lim"
	[ $st -eq 0 ] || fail "$d: openblas_host --rlimit exited $st"
	ran=$((ran + 1))
done
[ $ran -gt 0 ] || { echo "SKIP: no OpenBLAS build of Debian's here"; exit 77; }
echo "PASS: $name ($ran builds)"
