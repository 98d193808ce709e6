#!/bin/sh
# tests/optim_subnormal_avx2.sh - the cpu device's optimizer kernels store
# state below FLT_MIN as a zero on AVX2 as on AVX-512 (session 45,
# kiln/ops.h "Optimizer state below FLT_MIN").  The kernels are GCC target
# clones (AVX-512, AVX2, baseline: plugins/common/clones.h) that the CPU's
# features pick when the plugin loads, so tests/check_device_optim's
# subnormal_state case runs only this machine's clone.  Under valgrind
# (--tool=none: no checking, just its CPU), whose CPU has AVX2 and never
# AVX-512, the same case runs the AVX2 clone on an AVX-512 machine: every
# optimizer's state against the IEEE reference loop, bit for bit.  The
# case prints the clone the resolvers saw, and this test asserts it was
# AVX2.  SKIP (77): without valgrind; when the plugin has no AVX2 clone
# (a sanitizer build or another compiler: its symbols name none); when the
# suite links a sanitizer's runtime (valgrind cannot run it); when the
# suite skips (no cpu plugin); where valgrind's CPU has no AVX2.
# The baseline (SSE2) clone cannot be forced here; it is the same source.
name=optim_subnormal_avx2
. "$(dirname "$0")/lib.sh"

command -v valgrind >/dev/null 2>&1 || { echo "SKIP: no valgrind"; exit 77; }
suite="$top_builddir/tests/check_device_optim"
[ -x "$suite" ] || fail "no $suite: build it first (make check builds it)"
plugin="$top_builddir/plugins/.libs/kiln-cpu.so"
[ -f "$plugin" ] || { echo "SKIP: no $plugin (the cpu plugin is not built)"; exit 77; }
# GCC names a target clone FUNCTION.avx2 (.N after it in some versions)
if command -v nm >/dev/null 2>&1; then
	nm "$plugin" 2>/dev/null | grep -q ' sgd_span\.avx2' ||
		{ echo "SKIP: $plugin has no AVX2 clone of sgd_span (nm: no sgd_span.avx2; plugins/common/clones.h)"; exit 77; }
else
	echo "SKIP: no nm to see the plugin's clones"; exit 77
fi
bin="$top_builddir/tests/.libs/check_device_optim"
[ -f "$bin" ] || bin=$suite
if command -v ldd >/dev/null 2>&1 &&
	"$top_builddir/libtool" --mode=execute ldd "$suite" 2>/dev/null | grep -Eq 'lib(a|t)san'; then
	echo "SKIP: $bin links a sanitizer runtime, which valgrind cannot run"; exit 77
fi

CK_RUN_CASE=subnormal_state CK_FORK=no KILN_TEST_DEVICE=cpu \
	"$top_builddir/libtool" --mode=execute valgrind --tool=none -q "$suite" >"$out" 2>"$err"
rc=$?
cat "$out"
[ "$rc" -eq 77 ] && { echo "SKIP: check_device_optim skipped under valgrind (no cpu device):"; tail -5 "$err"; exit 77; }
clone=$(sed -n 's/.*subnormal_state: the cpu clone \([a-z0-9]*\).*/\1/p' "$out" | head -1)
case $clone in
avx2) ;;
default) echo "SKIP: valgrind's CPU has no AVX2 here (the baseline clone ran: rc $rc)"; exit 77 ;;
*) echo "--- stderr:"; tail -20 "$err"; fail "the case did not say which clone ran (rc $rc)" ;;
esac
[ "$rc" -eq 0 ] || { echo "--- stderr:"; tail -20 "$err"; fail "subnormal_state failed on the AVX2 clone (exit $rc)"; }
echo "ok: subnormal_state on the AVX2 clone under valgrind"
