#!/bin/sh
# tests/launch_orphan.sh - `kiln launch` with a rank command that wraps the
# trainer (docs/distributed.md, "Stopping"), 2 ranks (gloo):
#  1. a plain `sh -c '"$@"; exit $?'` wrapper (no exec: the shell dies of
#     SIGTERM) and SIGTERM to the launcher: each trainer stops with its
#     checkpoint, the launcher reports both ranks stopped (not "failed with
#     signal 15"), waits for the trainers and exits 0 (before session 34:
#     exit 1, "rank 0 (pid N) failed with signal 15", at once);
#  1b. the same with the next point where the ranks agree on the stop (an
#     epoch's end, ~2 s of training on) more than --grace 1 s away: the
#     launcher waits for the trainers as for direct ranks, exit 0 with the
#     checkpoint (before session 34's fix: their groups SIGKILLed 1 s after
#     the wrappers died, "failed with signal 9", exit 1, no checkpoint);
#  1c. 1b with a helper beside the trainer in each wrapper's process group
#     that exits 0 0.5 s after the SIGTERM (a profiler's child, a process
#     the wrapper started): the launcher still waits for the trainers, exit
#     0 with the checkpoint (before session 35 that exit 0 counted the
#     group clean, --grace 1 s ran from it and the trainers were killed:
#     "killing them", exit 1, no checkpoint);
#  1d. a helper in each wrapper's group that ignores SIGINT (a `&` job of
#     a non-interactive sh), SIGINT to the launcher and again 6 s later
#     (--grace 2; a repeat within 5 s is dropped, 1f): the trainers stop
#     with their checkpoint, the launcher says 2 s on that it waits and how
#     to end it, the helpers are killed 2 s after the second, and the ranks
#     count as stopped, exit 0, naming the killed helper (before session
#     35's fix: each SIGINT only passed on again, the launcher waiting for
#     the 120 s helpers; before session 36's: exit 1, "rank 0 failed
#     (signal 9 (Killed))", after trainers that had stopped cleanly);
#  1e. 1b with a helper that exits 1 on the SIGTERM (a cleanup trap): the
#     rank fails with the helper's status once its group is empty, exit 1,
#     but the trainers, not stopped by it, write their checkpoint (before
#     session 35's fix: the rank failed at once, the trainers still on
#     their way to the stop point were killed 1 s later, no checkpoint);
#  1f. 1b (--grace 1, the stop point an epoch of ~3 s away) with SIGTERM
#     again 1.2 s after the first: dropped, as the trainers would ignore
#     it (a repeat within 5 s of their stop), and the trainers stop with
#     their checkpoint, exit 0 (before session 36 it was passed on, past
#     --grace, and the groups, waited for with no deadline until then,
#     got 1 s: SIGKILLed on their way to the stop point, "signal 9", exit 1,
#     no checkpoint);
#  1g. a helper exiting 0 on the SIGTERM beside each trainer (1c), the
#     stop point far (an epoch of a 16384-wide MLP), SIGTERM again 6 s
#     later: the repeat ends the trainers at once, without a checkpoint,
#     and the ranks fail by it, exit 1 (before session 36 the trainer's
#     death by a signal passed on counted as nothing, the helper's exit 0
#     as the group's clean stop: "rank 0 stopped", exit 0);
#  2. the launcher killed (SIGKILL) under wrappers that survive their
#     SIGHUP: each trainer hears of it through KILN_LAUNCH_ALIVE_FD (the
#     parent-death signal reaches only the wrapper), stops at its next log
#     point with a checkpoint and exits 1 naming the launcher, within 30 s
#     (before: the trainers trained on to the end of their 100000 epochs);
#  3. the same with a wrapper that dies of its SIGHUP (the trainer
#     orphaned): both trainers end within 30 s, naming the launcher.
name=launch_orphan
needs=gloo
. "$(dirname "$0")/dist_common.sh"

mlp_ini "$tmp/mlp.ini" 3 30
# epochs of 16 steps (each a log point): a stop is taken within one
long="train.epochs=100000 train.log_every=1000 train.checkpoint_every=0 data.limit=2048"

# checkpointed NAME: a stop checkpoint written, metrics.jsonl ending with
# the stopped event
checkpointed() {
	grep -q 'checkpoint written to' "$tmp/$1.log" || bad "$1: no stop checkpoint written"
	tail -1 "$tmp/$1/metrics.jsonl" | grep -q '"event": *"stopped"' ||
		bad "$1: metrics.jsonl does not end with the stopped event"
}

# wrapped NAME GRACE WRAPPER [OVERRIDE...]: in the background, a 2-rank
# `kiln launch --grace GRACE` ("": launch's default) of `sh -c WRAPPER sh
# kiln train mlp.ini` with out_dir $tmp/NAME and the overrides, its output
# in $tmp/NAME.log; $lpid the launcher
wrapped() {
	_wn=$1 _wg=$2 _ww=$3
	shift 3
	"$kiln" launch -n 2 ${_wg:+--grace "$_wg"} -- sh -c "$_ww" sh "$kiln" train "$tmp/mlp.ini" \
		run.out_dir="$tmp/$_wn" "$@" > "$tmp/$_wn.log" 2>&1 &
	lpid=$!
}

# stopped NAME FAILED: the launch NAME (its exit $rc) stopped by the
# SIGTERM passed on: exit 0, no line of its log matching FAILED (grep -E:
# a rank's group killed or reported failed), both ranks reported stopped
# by it, the stop checkpoint written; the log's end shown on a failure
stopped() {
	[ $rc = 0 ] || bad "$1: kiln launch exited $rc, expected 0"
	grep -E "$2" "$tmp/$1.log" && bad "$1: a rank's group was killed or reported failed"
	[ "$(grep -c 'kiln launch: rank [01] stopped: its command ended by Terminated' "$tmp/$1.log")" = 2 ] ||
		bad "$1: not both ranks reported stopped"
	checkpointed "$1"
	[ "$fail" = 0 ] || tail -15 "$tmp/$1.log"
}

# ---- 1. a wrapper that dies of the SIGTERM passed on ----------------------
wrapped term "" '"$@"; exit $?' $long
await_train term "$lpid" && kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "term: SIGTERM to the launcher of 2 wrapped trainers: exit $rc"
[ $rc = 0 ] || bad "term: kiln launch exited $rc, expected 0"
grep 'failed with' "$tmp/term.log" && bad "term: a rank reported failed"
[ "$(grep -c 'kiln launch: rank [01] stopped: its command ended by Terminated, which this launcher passed on, and the processes below it exited 0' "$tmp/term.log")" = 2 ] ||
	bad "term: not both ranks reported stopped"
checkpointed term
[ "$fail" = 0 ] || tail -15 "$tmp/term.log"

# ---- 1b. the agreed stop point more than --grace away --------------------
# epochs of 128 steps of a 4096-wide MLP (~2 s), no log point within one:
# the stop sent after epoch 1's line is taken at epoch 2's end
slow="train.epochs=100000 train.log_every=100000 train.checkpoint_every=0 data.limit=16384 layer.fc1.out=4096"
wrapped far 1 '"$@"; exit $?' $slow
await_train far "$lpid" && kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "far: SIGTERM to the launcher of 2 wrapped trainers, the stop point ~2 s away, --grace 1: exit $rc"
stopped far 'failed with|killing them'

# ---- 1c. a process of the group exits 0 before the trainer stops ----------
# (the helper's trap runs after its 0.1 s sleep; the sleep itself dies of
# the SIGTERM, which the launcher passed on: no failure)
wrapped helper 1 \
	'(trap "sleep 0.5; echo helper: exit 0; exit 0" TERM; while :; do sleep 0.1; done) & "$@"; exit $?' $slow
await_train helper "$lpid" && kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "helper: SIGTERM to the launcher of 2 wrapped trainers with a helper exiting 0 first, --grace 1: exit $rc"
[ "$(grep -c 'helper: exit 0' "$tmp/helper.log")" = 2 ] || bad "helper: not both helpers exited 0"
stopped helper 'failed with|killing them'

# ---- 1d. a process of the group ignores the signal -------------------------
wrapped deaf 2 'sleep 120 & "$@"; exit $?' $long
await_train deaf "$lpid" && kill -INT "$lpid"
sleep 6
procs=$(below $lpid)
kill -INT "$lpid"
i=0
while kill -0 "$lpid" 2> /dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$lpid" 2> /dev/null; then
	bad "deaf: kiln launch still runs 15 s after the second SIGINT"
	kill -KILL "$lpid"
fi
wait "$lpid"
rc=$?
for p in $procs; do kill -KILL "$p" 2> /dev/null; done
echo "deaf: SIGINT twice to the launcher of 2 wrapped trainers beside a helper ignoring it, --grace 2: exit $rc after $((i / 10)) s"
[ $rc = 0 ] || bad "deaf: kiln launch exited $rc, expected 0 (the trainers stopped)"
[ "$(grep -c "kiln launch: rank [01]'s process group still runs 2 s after its command ended: waiting for it to stop (a signal again gives it 2 s, then SIGKILL)" "$tmp/deaf.log")" = 2 ] ||
	bad "deaf: the wait for the helpers not said before the second SIGINT"
[ "$(grep -c "kiln launch: Interrupt again: what is left of rank [01]'s process group (its command ended by the first) gets 2 s, then SIGKILL" "$tmp/deaf.log")" = 2 ] ||
	bad "deaf: the second SIGINT's deadline not announced for both ranks"
grep -q "kiln launch: 2 rank(s)' process groups, waited for since their commands ended by the stop, still ran 2 s after a repeated signal or a rank's failure: killing them" "$tmp/deaf.log" ||
	bad "deaf: the groups' kill not said"
# (the helpers killed had ignored both signals: no failure; the trainers'
# exit 0 stands)
grep -E 'failed|signal 9' "$tmp/deaf.log" && bad "deaf: a rank reported failed by the helpers' kill"
[ "$(grep -c "kiln launch: rank [01] stopped: its trainer stopped with its checkpoint at the signal this launcher passed on; what was left of its process group, ignoring the signal, was killed" "$tmp/deaf.log")" = 2 ] ||
	bad "deaf: not both ranks reported stopped, naming the helper killed"
checkpointed deaf
[ "$fail" = 0 ] || tail -15 "$tmp/deaf.log"

# ---- 1e. a process of the group exits 1 on the stop ------------------------
# (half a second after it: a helper that exited before its wrapper died was
# reaped by the wrapper's sh, its status never the launcher's to see, and
# its rank then reported stopped; 1 run in 3 at session 35's merge)
wrapped hfail 1 \
	'(trap "sleep 0.5; echo helper: exit 1; exit 1" TERM; while :; do sleep 0.1; done) & "$@"; exit $?' $slow
await_train hfail "$lpid" && kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "hfail: SIGTERM to the launcher of 2 wrapped trainers with a helper exiting 1 on it, --grace 1: exit $rc"
[ "$(grep -c 'helper: exit 1' "$tmp/hfail.log")" = 2 ] || bad "hfail: not both helpers exited 1"
[ $rc = 1 ] || bad "hfail: kiln launch exited $rc, expected 1"
[ "$(grep -c "kiln launch: rank [01]: pid [0-9]* of its process group ended with exit status 1 after the stop passed on: judged once the group is empty" "$tmp/hfail.log")" = 2 ] ||
	bad "hfail: the helpers' exits not noted for both ranks"
grep -q "kiln launch: rank [01] (its process group's pid [0-9]*) failed with exit status 1\$" "$tmp/hfail.log" ||
	bad "hfail: the rank's failure not named (or it stopped the others)"
grep -q "kiln launch: error: rank [01] failed (exit status 1)" "$tmp/hfail.log" || bad "hfail: no verdict"
grep -E 'killing them|stopping the other ranks|signal 9' "$tmp/hfail.log" && bad "hfail: the trainers were stopped or killed"
checkpointed hfail
[ "$fail" = 0 ] || tail -15 "$tmp/hfail.log"

# ---- 1f. a repeat within the trainers' 5 s, --grace 1 ----------------------
# (epochs of ~3 s: the stop after epoch 1's line is taken at epoch 2's end,
# seconds after the repeat plus --grace)
wrapped again 1 '"$@"; exit $?' $slow data.limit=24000
await_train again "$lpid" && kill -TERM "$lpid"
sleep 1.2
kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "again: SIGTERM twice, 1.2 s apart, to the launcher of 2 wrapped trainers, --grace 1: exit $rc"
grep -q "kiln launch: Terminated again within 5 s: already passed on, ignored" "$tmp/again.log" ||
	bad "again: the repeat not dropped"
stopped again 'failed with|killing them|signal 9'

# ---- 1g. the repeat cuts the trainers short beside a helper's exit 0 -------
# (the first SIGTERM 2 s after the epoch's size is logged, just before the
# first step: the trainers have stepped, so they stop at the epoch's end,
# far off, not by the signal 5 s on)
wrapped cut 1 '(trap "echo helper: exit 0; exit 0" TERM; while :; do sleep 0.1; done) & "$@"; exit $?' \
	$slow data.limit=60000 layer.fc1.out=16384
i=0
until grep -q "\[train\] an epoch is" "$tmp/cut.log" || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
sleep 2
kill -TERM "$lpid"
sleep 6
kill -TERM "$lpid"
wait "$lpid"
rc=$?
echo "cut: SIGTERM twice, 6 s apart, to the launcher of 2 wrapped trainers far from their stop point, a helper exiting 0: exit $rc"
[ $rc = 1 ] || bad "cut: kiln launch exited $rc, expected 1"
grep -q "kiln launch: rank [01]: pid [0-9]* of its process group ended with signal 15 (Terminated) after the repeated signal passed on (it had not stopped by then: no checkpoint of its own)" "$tmp/cut.log" ||
	bad "cut: the trainers' end by the repeat not noted"
grep -q "kiln launch: error: rank [01] failed (signal 15 (Terminated))" "$tmp/cut.log" || bad "cut: no verdict naming the repeat"
grep -q 'kiln launch: rank [01] stopped' "$tmp/cut.log" && bad "cut: a rank whose trainer the repeat ended reported stopped"
[ "$fail" = 0 ] || tail -15 "$tmp/cut.log"

# ---- 2, 3. the launcher killed ------------------------------------------
# killed NAME WRAPPER: a 2-rank launch of `sh -c WRAPPER sh kiln train`,
# SIGKILL to the launcher once it trains; both trainers end within 30 s,
# naming the launcher
killed() {
	wrapped "$1" "" "$2" $long
	_l=$lpid
	await_train "$1" "$_l" || return
	_procs=$(below $_l)
	# (the trainers: `kiln train`, $kiln or the binary its libtool
	# wrapper runs; the wrappers' own arguments say it too)
	_trainers=$(for _p in $_procs; do
		tr '\0' '\n' < "/proc/$_p/cmdline" 2> /dev/null | head -2 | tr '\n' ' ' |
			grep -q '^[^ ]*kiln train $' && echo "$_p"; done)
	[ "$(echo $_trainers | wc -w)" = 2 ] || bad "$1: expected 2 trainers below the launcher, found '$_trainers'"
	kill -KILL $_l
	wait $_l 2> /dev/null
	_t0=$(date +%s)
	_i=0
	while [ $_i -lt 300 ]; do
		_live=0
		for _p in $_procs; do kill -0 "$_p" 2> /dev/null && _live=$((_live + 1)); done
		[ $_live = 0 ] && break
		sleep 0.1
		_i=$((_i + 1))
	done
	echo "$1: the launcher killed: its ranks' processes ended after $(( $(date +%s) - _t0 )) s"
	for _p in $_procs; do
		kill -0 "$_p" 2> /dev/null && { bad "$1: process $_p below the killed launcher still runs 30 s on"; kill -KILL "$_p"; }
	done
	[ "$(grep -c "not at the user's request: .*its launcher (kiln launch, process $_l) went away" "$tmp/$1.log")" -ge 2 ] ||
		{ bad "$1: not both trainers named their launcher gone"; tail -5 "$tmp/$1.log"; }
	checkpointed "$1"
}

killed hup 'trap "echo wrapper: SIGHUP" HUP; "$@"; echo "wrapper: trainer exited $?"'
[ "$(grep -c 'wrapper: trainer exited 1' "$tmp/hup.log")" = 2 ] || bad "hup: not both trainers exited 1"
killed orphan '"$@"; exit $?'
exit $fail
