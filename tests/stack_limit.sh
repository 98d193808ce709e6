#!/bin/sh
# tests/stack_limit.sh - kiln under a small stack limit (ulimit -s): a soft
# limit below 1 MiB is raised (to 8 MiB, or the hard limit) and kiln runs
# again with it; a hard limit below 1 MiB is a clear error.  Before, a
# 64 KiB stack overflowed opening the CPU device: SIGSEGV, nothing printed
# (cli/kiln.c, stack_limit_check).
name=stack_limit
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

# the binary itself, as the limit's process (libtool's wrapper is a shell)
bin="$abs_top_builddir/.libs/kiln"
[ -x "$bin" ] || bin="$abs_top_builddir/kiln"
LD_LIBRARY_PATH="$abs_top_builddir/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
cfg="$srcdir/examples/fashion_mnist_mlp.ini"
train="data.limit=256 train.batch=64 train.max_steps=2 train.eval=0 run.threads=2"

# limited SOFT HARD ARGS...: kiln ARGS under `ulimit -Ss SOFT -Hs HARD`
# (HARD "-": the hard limit left as it is); exit code in $rc
limited() {
	_s=$1 _h=$2
	shift 2
	last="$* (ulimit -Ss $_s, hard $_h)"
	if [ "$_h" = - ]; then
		sh -c 'ulimit -Ss "$0" && exec "$@"' "$_s" "$bin" "$@" >"$out" 2>"$err"
	else
		sh -c 'ulimit -Ss "$0" && ulimit -Hs "$1" && shift && exec "$@"' "$_s" "$_h" "$bin" "$@" \
			>"$out" 2>"$err"
	fi
	rc=$?
	[ $rc -lt 128 ] || fail "exit $rc: killed by a signal"
}

hard=$(ulimit -Hs)
if [ "$hard" = unlimited ] || [ "$hard" -ge 1024 ]; then
	for s in 64 128; do
		limited $s - summary "$cfg"
		[ $rc -eq 0 ] || fail "kiln summary under a soft stack limit of $s KiB: exit $rc"
		stdout_has "Total params"
		echo "ok: kiln summary, soft stack limit $s KiB: raised, runs"
	done
	limited 64 - train "$cfg" $train "run.out_dir=$tmp/run64"
	[ $rc -eq 0 ] || fail "kiln train under a soft stack limit of 64 KiB: exit $rc"
	echo "ok: kiln train, soft stack limit 64 KiB: raised, trains"
else
	echo "(the hard stack limit is $hard KiB: no raise to test)"
fi

limited 64 64 summary "$cfg"
[ $rc -eq 1 ] || fail "a hard stack limit of 64 KiB: exit $rc, expected 1"
stderr_has "kiln: error: the stack limit is 64 KiB (ulimit -s; hard limit 64 KiB): kiln needs at least 1024 KiB: raise it (ulimit -s 8192)"
echo "ok: a hard stack limit of 64 KiB: refused, naming it"
limited 2048 2048 summary "$cfg"
[ $rc -eq 0 ] || fail "a stack limit of 2048 KiB: exit $rc"
echo "ok: a stack limit of 2048 KiB: runs as it is"
