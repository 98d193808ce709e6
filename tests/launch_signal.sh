#!/bin/sh
# tests/launch_signal.sh - one graceful stop per rank under `kiln launch`
# (docs/distributed.md, "Stopping"): Slurm at its time limit and systemd
# signal the launcher and every rank; `timeout` signals the launcher and
# then its process group, so each rank used to get SIGTERM twice, the
# second meaning "exit now" (no checkpoint, launch exited 1).
#
#  1. 2 ranks (gloo) training: SIGTERM to the launcher and to both ranks at
#     once: `kiln launch` exits 0, the run stopped with its checkpoint
#     (metrics.jsonl ends with the "stopped" event), no rank was killed;
#  2. `timeout --preserve-status 10 kiln launch ...`: the same, exit 0;
#  3. the rank's rule itself (one process): SIGTERM twice at once is one
#     stop, exit 0 with its checkpoint.
name=launch_signal
needs=gloo
. "$(dirname "$0")/dist_common.sh"

mlp_ini "$tmp/mlp.ini" 3 30
# long enough that every signal lands in training
long="train.epochs=1000 train.log_every=1 train.checkpoint_every=0"

# started NAME PID: wait (up to 60 s) until NAME's rank 0 trains
started() {
	_i=0
	until grep -q '"event":"train"' "$tmp/$1/metrics.jsonl" 2>/dev/null; do
		_i=$((_i + 1))
		[ $_i -le 600 ] || { kill -KILL "$2"; bad "$1: training did not start"; return 1; }
		sleep 0.1
	done
}

# stopped NAME RC: launch exited 0, a checkpoint written, no rank killed
stopped() {
	[ "$2" = 0 ] || bad "$1: kiln launch exited $2, expected 0"
	grep -q 'checkpoint written to' "$tmp/$1.log" || bad "$1: no stop checkpoint written"
	ls "$tmp/$1"/checkpoints/ckpt-*.kiln > /dev/null 2>&1 || bad "$1: no checkpoint file"
	tail -1 "$tmp/$1/metrics.jsonl" | grep -q '"event": *"stopped"' ||
		bad "$1: metrics.jsonl does not end with the stopped event"
	grep -q 'failed with' "$tmp/$1.log" && bad "$1: a rank failed: $(grep 'failed with' "$tmp/$1.log")"
	[ "$fail" = 0 ] || tail -15 "$tmp/$1.log"
	echo "$1: kiln launch exited $2, checkpoint $(ls "$tmp/$1"/checkpoints/)"
}

# ---- 1. the launcher and every rank signalled (Slurm, systemd) ----------
"$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/all" $long \
	> "$tmp/all.log" 2>&1 &
lpid=$!
if started all "$lpid"; then
	ranks=$(cat "/proc/$lpid/task/$lpid/children")
	[ "$(echo $ranks | wc -w)" = 2 ] || bad "expected 2 ranks under the launcher, found '$ranks'"
	kill -TERM "$lpid" $ranks
fi
wait "$lpid"
stopped all $?

# ---- 2. timeout(1): the launcher gets SIGTERM twice --------------------
timeout --preserve-status 10 "$kiln" launch -n 2 -- "$kiln" train "$tmp/mlp.ini" \
	run.out_dir="$tmp/timeout" $long > "$tmp/timeout.log" 2>&1
stopped timeout $?
grep -q 'again within 10 s: already passed on, ignored' "$tmp/timeout.log" ||
	echo "(timeout's two signals reached the launcher as one)"

# ---- 3. one process: a repeat within 5 s is ignored ----------------------
KILN_MASTER_PORT=$(free_port 3) "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/one" $long \
	> "$tmp/one.log" 2>&1 &
pid=$!
if started one "$pid"; then
	kill -TERM "$pid"
	kill -TERM "$pid"
	sleep 0.5
	grep -q 'stop already requested' "$tmp/one.log" || bad "one process: the repeat was not ignored"
fi
wait "$pid"
rc=$?
[ $rc = 0 ] || bad "one process, SIGTERM twice at once: exit $rc, expected 0"
grep -q 'checkpoint written to' "$tmp/one.log" || bad "one process: no stop checkpoint"
exit $fail
