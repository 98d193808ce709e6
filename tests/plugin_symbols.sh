#!/bin/sh
# tests/plugin_symbols.sh - no built plugin needs a kiln_* symbol from
# outside itself.  A plugin does not link libkiln (docs/plugins.md): such a
# reference resolved only while libkiln's symbols were global (the kiln CLI)
# and failed to load ("undefined symbol: kiln_dtype_size") in a program
# that dlopen()s libkiln RTLD_LOCAL, as Python's ctypes does (session 36:
# kiln-cpu.so).  The plugins link with -Wl,--no-undefined where the linker
# takes it (configure.ac); this checks the .so files whatever the linker,
# and that each exports kiln_plugin_init and nothing else.
name=plugin_symbols
. "$(dirname "$0")/lib.sh"
command -v nm >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
n=0
for so in "$top_builddir"/plugins/.libs/kiln-*.so; do
	[ -f "$so" ] || continue
	n=$((n + 1))
	syms=$(nm -D --undefined-only "$so" | awk '$1 == "U" && $2 ~ /^kiln_/ { print $2 }' | tr '\n' ' ')
	[ -z "$syms" ] || fail "$(basename "$so") needs from outside itself: $syms(a plugin does not link libkiln; docs/plugins.md)"
	# every defined dynamic symbol, not only kiln_*: a C++ plugin's weak
	# template instances and GNU-unique statics were exported (kiln-gloo.so
	# 53 more before session 41; the unique ones pin it in memory)
	def=$(nm -D --defined-only "$so" | awk '{ print $3 }' | tr '\n' ' ')
	[ "$def" = "kiln_plugin_init " ] || fail "$(basename "$so") exports: $def(expected only kiln_plugin_init)"
	echo "ok: $(basename "$so"): no undefined kiln_* symbol; exports only kiln_plugin_init"
done
[ "$n" -gt 0 ] || { echo "SKIP: no plugin built"; exit 77; }
echo "PASS: $n plugins"
exit 0
