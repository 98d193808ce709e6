#!/bin/sh
# tests/embed.sh - examples/embed/embed.c, an application embedding a kiln
# model, built against the INSTALLED kiln only: `make install DESTDIR`,
# then `pkg-config --cflags --libs kiln` of that install, run with the
# installed library and plugins.  It classifies one image (a PGM of the
# first sample of tests/data/tr_cnn_images.idx) with the model of
# tests/data/tr_cnn.ini trained 5 steps: the class and probability equal
# `kiln predict`'s for the same pixels as a PNG.
# Environment (tests/local.mk): top_builddir, MAKE, CC, kiln_pkgconfigdir.
name=embed
. "$(dirname "$0")/lib.sh"
MAKE=${MAKE:-make}
CC=${CC:-cc}
: "${kiln_pkgconfigdir:?set by tests/local.mk}"
unset CPATH C_INCLUDE_PATH LIBRARY_PATH
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: no pkg-config"; exit 77; }
need_python3
need_source idx
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
dest="$tmp/dest"
data="$srcdir/tests/data"

if ! (unset MAKEFLAGS MFLAGS MAKELEVEL; \
      $MAKE -C "$top_builddir" install DESTDIR="$dest") >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	fail "make install DESTDIR=$dest failed"
fi
# pkg-config of the install: its kiln.pc first, then the system's directories
# (kiln.pc's Libs.private come from configure: no .pc lookups)
pkgc() {
	PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH= \
	PKG_CONFIG_LIBDIR="$dest$kiln_pkgconfigdir:$(pkg-config --variable pc_path pkg-config)" \
		pkg-config "$@"
}
pc() { pkgc "$@" kiln; }
flags=$(pc --cflags --libs) || fail "pkg-config --cflags --libs kiln failed"
# a variable of the install (pkg-config prefixes the sysroot to some only)
var() { v=$(pc --variable="$1"); case $v in "$dest"/*) echo "$v" ;; *) echo "$dest$v" ;; esac; }
libdir=$(var libdir)
plugindir=$(var plugindir)
[ -f "$(var includedir)/kiln/infer.h" ] || fail "kiln/infer.h is not installed"
# The build command of embed.c's header, which docs/inference.md shows too,
# run as written (session 36: it lacked the -lm that this test added), with
# cc as $CC plus warnings and a dependency file, pkg-config the install's.
cmd=$(sed -n 's/^ \*   \(cc examples\/embed\/embed\.c .*\)$/\1/p' "$srcdir/examples/embed/embed.c")
[ -n "$cmd" ] || fail "no 'cc examples/embed/embed.c ...' line in examples/embed/embed.c's header"
grep -qxF "$cmd" "$srcdir/docs/inference.md" ||
	fail "docs/inference.md does not show embed.c's build command: $cmd"
mkdir -p "$tmp/examples/embed" && cp "$srcdir/examples/embed/embed.c" "$tmp/examples/embed/embed.c" || exit 99
run=$(printf '%s\n' "$cmd" | sed -e 's/^cc /$CC -Wall -Werror -MD -MF embed.d /' -e 's/\$(pkg-config /$(pkgc /g')
(cd "$tmp" && eval "$run") >"$tmp/cc.log" 2>&1 ||
	{ cat "$tmp/cc.log"; fail "the documented build command failed: $cmd"; }
grep -q "$dest.*/kiln/infer.h" "$tmp/embed.d" || fail "embed.c did not use the installed headers"
echo "ok: built examples/embed against the install as documented: $cmd"

# a model, and one image as PGM (for embed) and PNG (for kiln predict)
kiln 0 train "$data/tr_cnn.ini" "data.path=$data" \
	"model.init_from=$data/tr_cnn_init.safetensors" "run.out_dir=$tmp/run"
ck="$tmp/run/checkpoints/ckpt-5.kiln"
awk -v d="$data" '{ print } $0 == "[data]" || $0 == "[data.eval]" { print "path = " d }' \
	"$data/tr_cnn.ini" >"$tmp/t.ini"
"$py" - "$data/tr_cnn_images.idx" "$tmp" <<'EOF' || exit 99
import struct, sys, zlib
px = open(sys.argv[1], "rb").read()[16:16 + 64]
open(sys.argv[2] + "/one.pgm", "wb").write(b"P5\n8 8\n255\n" + px)
chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
raw = b"".join(b"\0" + px[8 * y:8 * y + 8] for y in range(8))
open(sys.argv[2] + "/one.png", "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
                                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
EOF
LD_LIBRARY_PATH="$libdir" KILN_PLUGIN_PATH="$plugindir" "$tmp/embed" "$tmp/t.ini" "$ck" \
	"$tmp/one.pgm" >"$tmp/embed.out" 2>&1 || { cat "$tmp/embed.out"; fail "embed failed"; }
echo "embed: $(cat "$tmp/embed.out")"
kiln 0 predict "$tmp/t.ini" --checkpoint "$ck" "$tmp/one.png" --top-k 1
"$py" - "$tmp/embed.out" "$out" <<'EOF' || fail "embed and kiln predict disagree"
import json, sys
e = open(sys.argv[1]).read().split()
p = json.loads(open(sys.argv[2]).readline())["top"][0]
assert e[0] == "class" and int(e[1]) == p["index"], (e, p)
assert abs(float(e[3]) - p["prob"]) < 1e-5, (e, p)
EOF
# a broken image: an error naming it, exit 1
printf 'P5\n8 8\n255\nxx' >"$tmp/short.pgm"
LD_LIBRARY_PATH="$libdir" KILN_PLUGIN_PATH="$plugindir" "$tmp/embed" "$tmp/t.ini" "$ck" \
	"$tmp/short.pgm" >"$tmp/embed.out" 2>&1 && fail "embed accepted a truncated image"
grep -q "short.pgm: truncated" "$tmp/embed.out" || fail "embed: $(cat "$tmp/embed.out")"
echo "PASS: examples/embed, built against the install, classifies as kiln predict does"
exit 0
