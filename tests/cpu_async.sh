#!/bin/sh
# tests/cpu_async.sh - [plugin.cpu] async's default, `auto`: off for one
# process, on for each rank of a data-parallel run (the allreduce overlaps
# the backward); 0 and 1 as set, either way.  The CPU device logs its
# choice when it opens ("opened ordinal 0: ...; async streams" / "sync
# streams", KILN_LOG_LEVEL=debug); the test counts those lines.
name=cpu-async
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
[ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ] || { echo "SKIP: the gloo plugin is not built"; exit 77; }
kiln="$abs_top_builddir/kiln"
ini="$tmp/mlp.ini"
{
	ini run seed=3 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini train epochs=1 max_steps=2 batch=32 eval=0 checkpoint_every=0
} > "$ini"

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
	echo $(( 20000 + $$ % 20000 )))

# opened NPROC WANT [overrides...]: trains with NPROC processes (1: a plain
# `kiln train`) and wants each one's CPU device to have opened WANT
# (async or sync) streams
opened() {
	_n=$1 _want=$2
	shift 2
	rm -rf "$tmp/o"
	if [ "$_n" = 1 ]; then
		KILN_LOG_LEVEL=debug timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/o" "$@" \
			> "$tmp/log" 2>&1
	else
		KILN_MASTER_PORT=$port KILN_LOG_LEVEL=debug timeout 120 "$kiln" launch -n "$_n" -- \
			"$kiln" train "$ini" run.out_dir="$tmp/o" "$@" > "$tmp/log" 2>&1
	fi
	_rc=$?
	[ $_rc = 0 ] || { tail -20 "$tmp/log"; fail "$_n process(es) $*: exit $_rc"; }
	_got=$(grep -c "opened ordinal .* $_want streams" "$tmp/log")
	_other=$(grep -c "opened ordinal .* streams" "$tmp/log")
	if [ "$_got" != "$_n" ] || [ "$_other" != "$_n" ]; then
		grep "opened ordinal" "$tmp/log"
		fail "$_n process(es) ${*:-(default)}: $_got of $_other devices opened $_want streams, want $_n of $_n"
	fi
	checks=$((checks + 1))
}

opened 1 sync
opened 1 sync plugin.cpu.async=auto
opened 1 async plugin.cpu.async=1
opened 2 async
opened 2 async plugin.cpu.async=auto
opened 2 sync plugin.cpu.async=0
opened 2 sync plugin.cpu.async=off
# a word that is neither a boolean nor auto is an error naming the key
if "$kiln" train "$ini" run.out_dir="$tmp/o" plugin.cpu.async=sometimes > "$tmp/log" 2>&1; then
	fail "plugin.cpu.async=sometimes was accepted"
fi
grep -q "async" "$tmp/log" || { cat "$tmp/log"; fail "the error does not name async"; }
echo "PASS: $checks async choices"
