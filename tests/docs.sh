#!/bin/sh
# docs/config.md must equal `kiln config --doc`: every key is documented, and
# the documentation cannot drift from the schema tables in the code.
set -u
: "${srcdir:=.}"
: "${top_builddir:=.}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$top_builddir/kiln" config --doc > "$out"; then
	echo "FAIL: kiln config --doc exited $?"; exit 1
fi
if ! diff -u "$srcdir/docs/config.md" "$out"; then
	echo "FAIL: docs/config.md is stale; regenerate: ./kiln config --doc > docs/config.md"
	exit 1
fi
echo "PASS: docs/config.md matches kiln config --doc"
