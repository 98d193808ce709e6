#!/bin/sh
# tests/plugin_lazy.sh - plugins load only when a run needs them, and a
# config file cannot load code (docs/plugins.md, "Loading"):
#
#  1. a plugin file on the search path whose init crashes (SIGSEGV; built
#     here) is not one the run names: `kiln train` still trains (exit 0),
#     and `kiln plugins` lists it as crashed in a test process (exit 0);
#  2. a file whose first descriptor has another ABI and whose second is
#     malformed keeps the ABI message (it used to be overwritten);
#  3. `[run] plugin_path` in a config file is ignored with a warning (its
#     plugin's init, which writes a marker file, never runs); with
#     KILN_ALLOW_CONFIG_PLUGIN_PATH=1 or run.plugin_path=DIR on the
#     command line it is searched.
# Its compiler's ccache cache is the caller's (tests/lib.sh), not the tree's.
name=plugin_lazy
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
CC=${CC:-cc}
need_source synthetic
# a ccache compiler uses the caller's cache (tests/lib.sh), never a second
# one in the tree (tests/cache/ccache, which XDG_CACHE_HOME would give it)
case "$CC" in
*ccache*)
	if [ -z "${CCACHE_DISABLE:-}" ]; then
		d=$(ccache -k cache_dir 2>/dev/null)
		case "$d" in
		"$abs_top_builddir"/* | "$srcdir"/*) fail "ccache's cache is in the tree: $d" ;;
		esac
	fi
	;;
esac

mkdir -p "$tmp/crash" "$tmp/abi" "$tmp/evil" || exit 99
# plugin NAME DIR BODY: $DIR/kiln-NAME.so whose kiln_plugin_init is BODY
plugin() {
	cat > "$tmp/$1.c" <<EOF
#include <kiln/plugin.h>
#include <signal.h>
#include <stdio.h>
static const struct kiln_optim_ops ops = { .version = KILN_OPTIM_OPS_VERSION };
static const struct kiln_plugin other_abi = { .abi_major = KILN_ABI_MAJOR + 7,
	.kind = KILN_PLUGIN_OPTIM, .name = "other_abi", .ops = &ops };
static const struct kiln_plugin no_ops = { .abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR, .kind = KILN_PLUGIN_OPTIM, .name = "no_ops" };
static const struct kiln_plugin *const list[] = { &other_abi, &no_ops, NULL };
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *h);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *h)
{
	(void)h;
	$3
	return list;
}
EOF
	$CC -shared -fPIC -I"$srcdir/include" -o "$tmp/$2/kiln-$1.so" "$tmp/$1.c" ||
		fail "building kiln-$1.so failed"
}
plugin crash crash 'raise(SIGSEGV);'
plugin twobad abi ''
plugin evil evil "FILE *f = fopen(\"$tmp/evil-ran\", \"w\"); if (f) fclose(f);"

{
	ini run seed=1 threads=1
	ini_synthetic 64 4 4
	linear_layers 4
	ini train epochs=1 batch=16 lr=0.1 eval=0
} > "$tmp/run.ini"

# ---- 1. a crashing plugin nobody named -----------------------------------
export KILN_PLUGIN_PATH="$tmp/crash"
kiln 0 train "$tmp/run.ini" run.out_dir="$tmp/out"
grep -q '"train_loss"' "$out" || fail "kiln train with a crashing plugin on the path: no metrics"
kiln 0 plugins
grep -q "kiln-crash.so: NOT LOADED: loading it killed a test process with signal 11" "$out" ||
	fail "kiln plugins does not report the crashing plugin"
unset KILN_PLUGIN_PATH
echo "ok: a crashing plugin on the search path: kiln train and kiln plugins exit 0"

# ---- 2. the ABI message is kept ------------------------------------------
kiln 0 plugins --path "$tmp/abi"
grep -q "kiln-twobad.so: NOT LOADED: plugin 'other_abi' was built for ABI" "$out" ||
	fail "the ABI mismatch message was lost: $(grep twobad "$out")"
echo "ok: the ABI mismatch is the message, the malformed descriptor follows it"

# ---- 3. plugin_path from a config file -----------------------------------
# (a run of a synthetic source loads every file on its path, so the
# plugin's init runs, in a test process, once its directory is searched;
# the probe's kept answers would skip that on the later runs)
export KILN_PROBE_CACHE=none
sed "s|^threads = 1|threads = 1\nplugin_path = $tmp/evil|" "$tmp/run.ini" > "$tmp/evil.ini"
kiln 0 train "$tmp/evil.ini" run.out_dir="$tmp/out2"
[ ! -e "$tmp/evil-ran" ] || fail "a config file's plugin_path ran its plugin's code"
grep -q "plugin_path = $tmp/evil ignored" "$err" || fail "no warning about the ignored plugin_path"
export KILN_ALLOW_CONFIG_PLUGIN_PATH=1
kiln 0 train "$tmp/evil.ini" run.out_dir="$tmp/out3"
unset KILN_ALLOW_CONFIG_PLUGIN_PATH
[ -e "$tmp/evil-ran" ] || fail "KILN_ALLOW_CONFIG_PLUGIN_PATH=1: the config's plugin_path was not searched"
rm -f "$tmp/evil-ran"
kiln 0 train "$tmp/run.ini" run.out_dir="$tmp/out4" run.plugin_path="$tmp/evil"
[ -e "$tmp/evil-ran" ] || fail "run.plugin_path on the command line was not searched"
echo "ok: a config file's plugin_path is ignored unless KILN_ALLOW_CONFIG_PLUGIN_PATH=1; the command line's is taken"
