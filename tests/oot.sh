#!/bin/sh
# tests/oot.sh - an out-of-tree plugin against the installed kiln: install
# into a DESTDIR, build tests/oot/oot.c with `pkg-config --cflags kiln` of
# that install only (never the source tree's include/), and check that
# `kiln plugins` lists it as available and tests/oot_test reads its data.
# Environment (tests/local.mk): top_builddir, abs_top_builddir,
# abs_top_srcdir, MAKE, CC, kiln_includedir, kiln_pkgconfigdir; srcdir.
# The scratch directory (tests/lib.sh) is outside the build tree, so `make
# distcheck` finds nothing left behind.
name=oot
. "$(dirname "$0")/lib.sh"
abs_top_srcdir=${abs_top_srcdir:-$(cd "$srcdir" && pwd)}
MAKE=${MAKE:-make}
CC=${CC:-cc}
: "${kiln_includedir:?set by tests/local.mk}" "${kiln_pkgconfigdir:?set by tests/local.mk}"
unset CPATH C_INCLUDE_PATH

command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: no pkg-config"; exit 77; }
# (the installed tree has read-only parts)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
dest="$tmp/dest"

# ---- install -------------------------------------------------------------
# Without the caller's MAKEFLAGS: a `make check TESTS=...` must not pass its
# variables to the install, and the jobserver is not ours.
if ! (unset MAKEFLAGS MFLAGS MAKELEVEL; \
      $MAKE -C "$top_builddir" install DESTDIR="$dest") >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	fail "make install DESTDIR=$dest failed"
fi
echo "ok: installed into $dest"
[ -f "$dest$kiln_includedir/kiln/plugin.h" ] || fail "no $dest$kiln_includedir/kiln/plugin.h"
[ -f "$dest$kiln_pkgconfigdir/kiln.pc" ] || fail "no $dest$kiln_pkgconfigdir/kiln.pc"

# ---- build the plugin against the installed headers ----------------------
# (the install's kiln.pc, then the system's directories)
cflags=$(PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH= \
	PKG_CONFIG_LIBDIR="$dest$kiln_pkgconfigdir:$(pkg-config --variable pc_path pkg-config)" \
	pkg-config --cflags kiln) || fail "pkg-config --cflags kiln failed"
echo "ok: pkg-config --cflags kiln: $cflags"
case "$cflags" in *"$dest"*) ;; *) fail "cflags do not point into $dest: $cflags" ;; esac
mkdir "$tmp/plugins" || exit 99
# Compile from $tmp with a copy of the source, so nothing near the source
# tree can be found by a relative #include.
cp "$srcdir/tests/oot/oot.c" "$tmp/oot.c" || exit 99
(cd "$tmp" && $CC -shared -fPIC -fvisibility=hidden -Wall -Werror $cflags \
	-MD -MF oot.d -o plugins/kiln-oot.so oot.c) || fail "building kiln-oot.so failed"
echo "ok: built $tmp/plugins/kiln-oot.so"
! grep -q "$abs_top_srcdir/include" "$tmp/oot.d" ||
	fail "oot.c was compiled with the source tree's headers: $(cat "$tmp/oot.d")"
grep -q "$dest$kiln_includedir/kiln/plugin.h" "$tmp/oot.d" ||
	fail "oot.c did not use the installed headers: $(cat "$tmp/oot.d")"
echo "ok: only the installed headers were used"
if command -v nm >/dev/null 2>&1; then
	syms=$(nm -D --defined-only "$tmp/plugins/kiln-oot.so" | awk '$2 ~ /^[TDRB]$/ { print $3 }')
	[ "$syms" = kiln_plugin_init ] || fail "kiln-oot.so exports: $syms (expected only kiln_plugin_init)"
	echo "ok: kiln-oot.so exports only kiln_plugin_init"
fi

# ---- use it ----------------------------------------------------------------
"$top_builddir/kiln" plugins --path "$tmp/plugins" >"$tmp/plugins.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/plugins.out"; fail "kiln plugins --path exited $rc"; }
grep -qF "$tmp/plugins/kiln-oot.so: 1 plugin(s)" "$tmp/plugins.out" &&
	grep -qE "^source +ootsrc +2\.[0-9]+ +available " "$tmp/plugins.out" ||
	{ cat "$tmp/plugins.out"; fail "kiln plugins does not list ootsrc as available"; }
echo "ok: kiln plugins lists ootsrc as available"

"$top_builddir/tests/oot_test" "$tmp/plugins"
rc=$?
[ "$rc" -eq 0 ] || fail "tests/oot_test exited $rc"

# ---- the example layer plugin: build, load, gradient-check ---------------
cp "$srcdir/examples/plugins/swish.c" "$tmp/swish.c" || exit 99
(cd "$tmp" && $CC -shared -fPIC -fvisibility=hidden -Wall -Werror $cflags \
	-o plugins/kiln-swish.so swish.c) || fail "building examples/plugins/swish.c failed"
echo "ok: built $tmp/plugins/kiln-swish.so from examples/plugins/swish.c"
"$top_builddir/kiln" plugins --path "$tmp/plugins" 2>&1 | grep -qE "^layer +swish +2\.[0-9]+ +available " ||
	fail "kiln plugins does not list the swish layer as available"
"$top_builddir/tests/gradcheck" "$tmp/plugins" "$srcdir/tests/oot/swish.ini" 7 ||
	fail "the swish layer plugin's gradients disagree with finite differences"
echo "ok: swish gradients match finite differences"

# ---- the example optimizer plugin: build, load, check against PyTorch ----
cp "$srcdir/examples/plugins/lion.c" "$tmp/lion.c" || exit 99
(cd "$tmp" && $CC -shared -fPIC -fvisibility=hidden -Wall -Werror $cflags \
	-o plugins/kiln-lion.so lion.c) || fail "building examples/plugins/lion.c failed"
"$top_builddir/kiln" plugins --path "$tmp/plugins" 2>&1 | grep -qE "^optim +lion +2\.[0-9]+ +available " ||
	fail "kiln plugins does not list the lion optimizer as available"
"$top_builddir/tests/optim_ref" "$tmp/plugins" "$srcdir/tests/data/lion_refs.safetensors" ||
	fail "the lion optimizer plugin disagrees with PyTorch (tests/data/gen_lion_refs.py)"
echo "ok: [train] optimizer = lion matches PyTorch for 5 steps"
echo "PASS"
exit 0
