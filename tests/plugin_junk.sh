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
