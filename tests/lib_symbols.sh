#!/bin/sh
# tests/lib_symbols.sh - libkiln.so exports exactly the functions the
# installed headers declare (include/kiln/*.h as include/local.mk installs
# them): no internal function a program could link to and then lose in
# the next release, no public one missing.  -version-info's rule ("added
# only": core/local.mk) is true of what the library exports only so.
# Before session 40 it was linked with -export-symbols-regex '^kiln_' and
# exported 490 internal functions besides the 197 public ones
# (kiln_ckpt_open, kiln_read_at, ...).  The list the linker is given is
# core/libkiln.sym; this compares it and `nm -D` of the built library with
# the headers' declarations, read from the preprocessed headers (comments
# and macros gone): an identifier kiln_* followed by "(" that is not a
# function pointer's "(*".
name=lib_symbols
. "$(dirname "$0")/lib.sh"
command -v nm >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
so="$top_builddir/.libs/libkiln.so"
[ -f "$so" ] || fail "no $so (build first)"

# the installed headers: make check names them (tests/local.mk); by hand,
# every header of include/kiln/
if [ -n "${kiln_public_headers:-}" ]; then
	headers=$kiln_public_headers
else
	headers=$(cd "$srcdir" && ls include/kiln/*.h)
fi
: > "$tmp/all.c"
src=$(cd "$srcdir" && pwd)
for h in $headers; do
	echo "#include \"$src/$h\"" >> "$tmp/all.c"
done
${CC:-cc} -E -P -I"$src/include" "$tmp/all.c" > "$tmp/all.i" 2>"$tmp/cpp.err" ||
	fail "cannot preprocess the public headers: $(cat "$tmp/cpp.err")"
tr '\n' ' ' < "$tmp/all.i" |
	grep -oE 'kiln_[A-Za-z0-9_]+[[:space:]]*\([[:space:]]*[^*[:space:]]' |
	sed 's/[[:space:]]*(.*//' | LC_ALL=C sort -u > "$tmp/declared"
nd=$(wc -l < "$tmp/declared")
[ "$nd" -gt 100 ] || fail "only $nd functions found in the public headers ($headers): the extraction broke"

# every symbol the library defines in its dynamic table
nm -D --defined-only "$so" | awk 'NF >= 3 { print $3 }' | LC_ALL=C sort -u > "$tmp/exported"
LC_ALL=C comm -13 "$tmp/declared" "$tmp/exported" > "$tmp/extra"
LC_ALL=C comm -23 "$tmp/declared" "$tmp/exported" > "$tmp/missing"
LC_ALL=C sort -u "$srcdir/core/libkiln.sym" | LC_ALL=C comm -3 - "$tmp/declared" > "$tmp/listdiff"
if [ -s "$tmp/extra" ] || [ -s "$tmp/missing" ] || [ -s "$tmp/listdiff" ]; then
	echo "exported by $so but declared in no public header ($(wc -l < "$tmp/extra")):"
	sed 's/^/  /' "$tmp/extra" | head -40
	echo "declared in the public headers but not exported ($(wc -l < "$tmp/missing")):"
	sed 's/^/  /' "$tmp/missing"
	echo "core/libkiln.sym (left) and the headers' declarations (right) differ:"
	sed 's/^/  /' "$tmp/listdiff"
	fail "libkiln.so must export exactly the public headers' functions: list a new public function in core/libkiln.sym (docs/plugins.md, \"libkiln's symbols\")"
fi
echo "PASS: libkiln.so exports exactly the $nd functions of the public headers ($(echo $headers | wc -w) headers), as core/libkiln.sym lists them"
exit 0
