#!/bin/sh
# tests/install_link.sh - what a program gets from the installed kiln
# (session 36): `make install DESTDIR`, then
#  - a C++ program including every installed header (tests/oot/headers.cc)
#    compiles and links with `pkg-config --cflags --libs kiln` and runs:
#    each header has its extern "C" (kiln/image.h lacked it);
#  - `pkg-config --variable=pluginabi kiln` is the plugin ABI that
#    `kiln --version` prints (kiln.pc.in said 1 while the ABI was 2.22);
#  - `pkg-config --static --libs kiln` names every library the installed
#    libkiln.so needs (kiln.pc had no Requires.private/Libs.private, and a
#    static link missed HMAC, EVP_sha256, exp, ...).
# Environment (tests/local.mk): top_builddir, MAKE, kiln_includedir,
# kiln_pkgconfigdir.
name=install_link
. "$(dirname "$0")/lib.sh"
MAKE=${MAKE:-make}
: "${kiln_includedir:?set by tests/local.mk}" "${kiln_pkgconfigdir:?set by tests/local.mk}"
unset CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH LIBRARY_PATH
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: no pkg-config"; exit 77; }
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
dest="$tmp/dest"

if ! (unset MAKEFLAGS MFLAGS MAKELEVEL; \
      $MAKE -C "$top_builddir" install DESTDIR="$dest") >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	fail "make install DESTDIR=$dest failed"
fi
# pkg-config of the install: its kiln.pc first, then the system's
# directories
pc() {
	PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH= \
	PKG_CONFIG_LIBDIR="$dest$kiln_pkgconfigdir:$(pkg-config --variable pc_path pkg-config)" \
		pkg-config "$@" kiln
}
var() { v=$(pc --variable="$1"); case $v in "$dest"/*) echo "$v" ;; *) echo "$dest$v" ;; esac; }
libdir=$(var libdir)

# ---- the plugin ABI ------------------------------------------------------
abi=$(pc --variable=pluginabi) || fail "pkg-config --variable=pluginabi kiln failed"
ver=$("$top_builddir/kiln" --version) || fail "kiln --version failed"
case "$ver" in *"(plugin ABI $abi)"*) ;;
	*) fail "kiln.pc says pluginabi=$abi, kiln --version: $ver" ;; esac
echo "ok: pluginabi=$abi as '$ver'"

# ---- a plugin author's headers-only build: kiln.pc alone -----------------
# (Requires.private made --cflags and --exists fail without inih's, zlib's,
# ... .pc files: found by review, session 36; Libs.private now)
PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR="$dest$kiln_pkgconfigdir" \
	pkg-config --exists --print-errors kiln ||
	fail "pkg-config --exists kiln fails with kiln.pc alone on the search path"
echo "ok: kiln.pc alone answers --exists and --cflags"

# ---- static linking: the libraries libkiln.so needs ----------------------
if command -v readelf >/dev/null 2>&1; then
	static=$(pc --static --libs) || fail "pkg-config --static --libs kiln failed"
	so=$(ls "$libdir"/libkiln.so.* | head -n 1)
	[ -f "$so" ] || fail "no libkiln.so.* in $libdir"
	for lib in $(readelf -d "$so" | sed -n 's/.*NEEDED.*\[lib\([^].]*\)\.so.*/\1/p'); do
		case $lib in c|ld-linux*) continue ;; esac
		case " $static " in *" -l$lib "*) ;;
			*) fail "libkiln.so needs lib$lib; pkg-config --static --libs kiln: $static" ;; esac
	done
	echo "ok: pkg-config --static --libs kiln names every library libkiln.so needs: $static"
else
	echo "skip: no readelf (static libraries)"
fi

# ---- every installed header from C++ -------------------------------------
CXX=${CXX:-g++}
if command -v "${CXX%% *}" >/dev/null 2>&1; then
	for h in "$dest$kiln_includedir"/kiln/*.h; do
		grep -qx "#include <kiln/$(basename "$h")>" "$srcdir/tests/oot/headers.cc" ||
			fail "tests/oot/headers.cc does not include the installed kiln/$(basename "$h")"
	done
	flags=$(pc --cflags --libs) || fail "pkg-config --cflags --libs kiln failed"
	cp "$srcdir/tests/oot/headers.cc" "$tmp/headers.cc" || exit 99
	(cd "$tmp" && $CXX -Wall -Werror headers.cc $flags -o headers) >"$tmp/cxx.log" 2>&1 ||
		{ cat "$tmp/cxx.log"; fail "a C++ program with every installed header does not build"; }
	env -i LD_LIBRARY_PATH="$libdir" "$tmp/headers" >"$tmp/headers.out" 2>&1 ||
		{ cat "$tmp/headers.out"; fail "the C++ program failed"; }
	echo "ok: C++ with every installed header: $(cat "$tmp/headers.out")"
else
	echo "skip: no C++ compiler ($CXX)"
fi
echo "PASS"
exit 0
