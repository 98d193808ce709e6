#!/bin/sh
# tests/dist_explain_ab.sh BUILDDIR... - not a test (not in TESTS): the A/B
# of docs/PERFORMANCE.md "Session 14: a rank's own failure to its exit".
# For each built tree (its kiln and plugins/.libs), tests/dist.sh 2c's
# timed case: `kiln launch -n 2`, rank 1's profile report unwritable, the
# milliseconds from its profile table's last line to its exit (before
# session 14: 3000 ms and more, the store's lost-rank wait). Run from the
# source tree: sh tests/dist_explain_ab.sh /work/main /work/wt/explain
srcdir=$(cd "$(dirname "$0")" && pwd)
export KILN_STORE_TOKEN=kiln-tests-0123456789abcdef
for b in "$@"; do
	b=$(cd "$b" && pwd)
	(
		abs_top_builddir=$b top_builddir=$b name=explainab needs=gloo
		. "$srcdir/lib.sh"
		. "$srcdir/config_lib.sh"
		bad() { echo "FAIL: $*"; }
		free_port() { echo 0; }
		kiln="$b/kiln"
		export KILN_PLUGIN_PATH="$b/plugins/.libs"
		sed -n '/^mlp_ini() {/,/^}/p' "$srcdir/dist_common.sh" > "$tmp/mlp_ini.sh"
		. "$tmp/mlp_ini.sh"
		mlp_ini "$tmp/mlp.ini" 5 20 gloo
		sed -n '/^mkdir -p "$tmp\/late0b"/,/before session 14: 3000 ms/p' "$srcdir/dist.sh" > "$tmp/blk.sh"
		. "$tmp/blk.sh" | sed "s|^|$b: |"
	)
done
