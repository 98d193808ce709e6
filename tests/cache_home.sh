#!/bin/sh
# tests/cache_home.sh - where kiln's caches go when HOME names no folder
# (plugins/common/cache_file.h; session 35).  kiln made every folder up to
# $HOME/.cache/kiln, HOME itself included: as root with Debian's HOME of
# system users, /nonexistent (absent on purpose), it made /nonexistent.
# Now it makes at most the cache folder and kiln/ in it:
#  1. HOME a missing folder, XDG_CACHE_HOME unset: the run works, makes
#     nothing, and says once per cache that none is kept (the unzip
#     cache only where a gzip file big enough to be kept is read: session
#     36, it was said for plain files too);
#  2. HOME an existing folder: .cache/kiln made under it, the probe's
#     answers kept there;
#  3. XDG_CACHE_HOME whose parent is missing: nothing made, a note;
#     XDG_CACHE_HOME whose parent exists: made, the answers kept there;
#  4. XDG_CACHE_HOME relative (the XDG spec: ignored): HOME's cache.
name=cache_home
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
data="$(cd "$srcdir/tests/data" && pwd)" # absolute: case 4 runs elsewhere
need_source idx
unset KILN_PROBE_CACHE
ini="$tmp/mlp.ini"
{
	ini run threads=1
	ini_tr_cnn_mlp "$data"
	ini train batch=8 epochs=1 max_steps=1 checkpoint_every=0
} >"$ini"

# 1
(
	unset XDG_CACHE_HOME
	export HOME="$tmp/missing/home"
	kiln 0 train "$ini" "run.out_dir=$tmp/r1"
	[ ! -e "$tmp/missing" ] || fail "kiln made $(find "$tmp/missing" | tr '\n' ' ')"
	stderr_has "plugin probe cache: HOME=$tmp/missing/home is not a directory: no cache file is kept (set XDG_CACHE_HOME to keep them)"
	stderr_has "tune cache: HOME=$tmp/missing/home is not a directory: no cache file is kept"
	[ "$(grep -c 'is not a directory: no cache file' "$err")" = 2 ] ||
		fail "expected 2 notes (probe, cpu tune; the IDX files are plain), got: $(grep 'no cache file' "$err")"
	# a gzip file of more than IDX_CACHE_MIN (1 MiB): 1,500 random 28x28 images
	{ printf '\000\000\010\003\000\000\005\334\000\000\000\034\000\000\000\034'
	  head -c 1176000 /dev/urandom; } | gzip -1 >"$tmp/big-images.gz"
	{ printf '\000\000\010\001\000\000\005\334'; head -c 1500 /dev/zero; } >"$tmp/big-labels"
	kiln 0 train "$ini" "run.out_dir=$tmp/r1b" "data.images=$tmp/big-images.gz" \
		"data.labels=$tmp/big-labels" "data.eval.images=$tmp/big-images.gz" \
		"data.eval.labels=$tmp/big-labels"
	stderr_has "unzip cache: HOME=$tmp/missing/home is not a directory: no cache file is kept"
	[ ! -e "$tmp/missing" ] || fail "kiln made $(find "$tmp/missing" | tr '\n' ' ')"
) || exit 1

# 2
mkdir "$tmp/home"
(
	unset XDG_CACHE_HOME
	export HOME="$tmp/home"
	kiln 0 train "$ini" "run.out_dir=$tmp/r2"
	grep -q "kiln-loaders.so" "$tmp/home/.cache/kiln/plugin_probe" ||
		fail "no probe answers in $tmp/home/.cache/kiln/plugin_probe"
	! grep -q "no cache file" "$err" || fail "a note with HOME present: $(grep 'no cache file' "$err")"
) || exit 1

# 3
(
	export XDG_CACHE_HOME="$tmp/gone/cache"
	kiln 0 train "$ini" "run.out_dir=$tmp/r3"
	stderr_has "plugin probe cache: XDG_CACHE_HOME=$tmp/gone/cache: the folder above it does not exist: no cache file is kept"
	[ ! -e "$tmp/gone" ] || fail "kiln made $tmp/gone"
	export XDG_CACHE_HOME="$tmp/home/xdg"
	kiln 0 train "$ini" "run.out_dir=$tmp/r4"
	grep -q "kiln-loaders.so" "$tmp/home/xdg/kiln/plugin_probe" ||
		fail "no probe answers in $tmp/home/xdg/kiln/plugin_probe"
) || exit 1

# 4
mkdir "$tmp/home4"
(
	kiln="$abs_top_builddir/kiln" # from another folder: a relative path's
	cd "$tmp" || exit 1
	export XDG_CACHE_HOME=rel HOME="$tmp/home4"
	kiln 0 train "$ini" "run.out_dir=$tmp/r5"
	[ ! -e "$tmp/rel" ] || fail "a relative XDG_CACHE_HOME was used: $tmp/rel"
	[ -f "$tmp/home4/.cache/kiln/plugin_probe" ] || fail "no $tmp/home4/.cache/kiln/plugin_probe"
) || exit 1
echo "PASS: 6 runs"
