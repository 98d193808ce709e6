#!/bin/sh
# tests/plugin_junk.sh - a lookup that finds no plugin names the plugin
# files that failed to load, with `kiln plugins`' words for each.  Before
# session 37 only a file named after the plugin (kiln-idx.so) was looked
# at: a junk kiln-loaders.so, where the sources live, gave "no source
# plugin named 'idx' (available: none; run `kiln plugins`)" and no word of
# the file.
name=plugin_junk
. "$(dirname "$0")/lib.sh"

mkdir -p "$tmp/p"
echo junk > "$tmp/p/kiln-loaders.so"
KILN_PLUGIN_PATH="$tmp/p"
export KILN_PLUGIN_PATH KILN_PROBE_CACHE=none

kiln 0 plugins
grep -q "^  $tmp/p/kiln-loaders.so: NOT LOADED: dlopen failed: .*file too short" "$out" ||
	fail "kiln plugins does not list the junk kiln-loaders.so as NOT LOADED"
why=$(sed -n "s|^  $tmp/p/kiln-loaders.so: NOT LOADED: ||p" "$out")

kiln 2 train "$srcdir/tests/data/tr_cnn.ini" "data.path=$srcdir/tests/data" run.out_dir=
stderr_has "[data] source: no source plugin named 'idx' (available: none; run \`kiln plugins\`); it may be in a file that failed to load: $tmp/p/kiln-loaders.so: $why"
echo "ok: the lookup names the junk kiln-loaders.so and its dlopen error"

# a plugin file whose initial-exec TLS does not fit the static TLS block:
# glibc's "cannot allocate memory in static TLS block" is not memory
# running out (session 37's first version made every failed lookup "out
# of memory", exit 1, with such a file on the path)
if command -v "${CC:-cc}" >/dev/null; then
	mkdir -p "$tmp/t"
	printf '__thread char big[1 << 22] __attribute__((tls_model("initial-exec")));\nchar *kiln_tls_touch(void) { return big; }\n' >"$tmp/tls.c"
	if "${CC:-cc}" -shared -fPIC -o "$tmp/t/kiln-tls.so" "$tmp/tls.c" 2>/dev/null; then
		KILN_PLUGIN_PATH="$tmp/t"
		kiln 2 train "$srcdir/tests/data/tr_cnn.ini" "data.path=$srcdir/tests/data" run.out_dir= \
			data.source=idxx
		stderr_has "[data] source: no source plugin named 'idxx'"
		stderr_has "static TLS block"
		echo "ok: a static TLS failure is not out of memory"
	fi
fi
