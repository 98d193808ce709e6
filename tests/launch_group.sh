#!/bin/sh
# tests/launch_group.sh - `kiln launch` passes a stop to each rank's whole
# process group (session 33; docs/distributed.md, "Stopping"): a rank
# command that wraps the trainer (`sh -c`, `timeout`, a profiler) passes a
# signal on, or not, as the wrapper does; before, only the wrapper's pid
# got it.  2 ranks (gloo), each `sh -c 'trap ... TERM; "$@"' sh kiln train`
# (a wrapper that passes nothing on and waits for its trainer):
#  1. SIGTERM to the launcher: each inner `kiln train` takes the stop
#     ("stop requested"), writes its checkpoint and exits 0, the wrappers
#     then exit 0 and `kiln launch` exits 0 within 60 s (before: the
#     trainers never heard of it and trained on; killed after 60 s here);
#  2. SIGINT (Ctrl-C) likewise.
name=launch_group
needs=gloo
. "$(dirname "$0")/dist_common.sh"

mlp_ini "$tmp/mlp.ini" 3 30
long="train.epochs=100000 train.log_every=1000 train.checkpoint_every=0 data.limit=8192 layer.fc1.out=512"

# wrapped NAME SIG: a 2-rank launch of wrapped trainers, SIG to the
# launcher once it trains; exit 0 within 60 s, each trainer stopped with
# its checkpoint
wrapped() {
	"$kiln" launch -n 2 -- sh -c 'trap "echo wrapper: $0" TERM INT HUP; "$@"; echo "wrapper: trainer exited $?"' \
		"$2 trapped" "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/$1" $long > "$tmp/$1.log" 2>&1 &
	_l=$!
	await_train "$1" $_l
	_procs=$(below $_l)
	kill -"$2" $_l
	_t0=$(date +%s)
	_i=0
	while kill -0 $_l 2> /dev/null && [ $_i -lt 600 ]; do sleep 0.1; _i=$((_i + 1)); done
	if kill -0 $_l 2> /dev/null; then
		bad "$1: kiln launch still running 60 s after SIG$2 (the trainers did not get it?)"
		kill -KILL $_l $_procs 2> /dev/null
	fi
	wait $_l
	_rc=$?
	echo "$1: SIG$2 to the launcher: exit $_rc after $(( $(date +%s) - _t0 )) s"
	[ $_rc = 0 ] || { bad "$1: kiln launch exited $_rc"; tail -5 "$tmp/$1.log"; }
	[ "$(grep -c 'stop requested' "$tmp/$1.log")" = 2 ] || bad "$1: not both trainers took the stop"
	[ "$(grep -c 'wrapper: trainer exited 0' "$tmp/$1.log")" = 2 ] || bad "$1: not both trainers exited 0"
	grep -q 'checkpoint written to' "$tmp/$1.log" || bad "$1: no stop checkpoint written"
	tail -1 "$tmp/$1/metrics.jsonl" | grep -q '"event": *"stopped"' ||
		bad "$1: metrics.jsonl does not end with the stopped event"
	for _p in $_procs; do
		kill -0 "$_p" 2> /dev/null && { bad "$1: process $_p below the launcher still runs"; kill -KILL "$_p"; }
	done
}

wrapped term TERM
wrapped int INT
exit $fail
