#!/bin/sh
# tests/launch_restart.sh - `kiln launch --max-restarts` (torchrun's
# elastic restarts at a fixed world size; docs/distributed.md).  The MLP of
# tests/dist_common.sh on 2 ranks (Gloo, kiln's shared memory), 64 steps,
# [run] deterministic = 1, a checkpoint every 8 steps.  Asserts:
#  1. rank 1 killed with SIGKILL once rank 0 has logged 10 steps: with
#     --max-restarts 1 the launcher starts both ranks again (KILN_RESTART=1),
#     `kiln train` resumes from the newest checkpoint, the job exits 0, and
#     its final state (parameters, momentum, step counters, trainer
#     position) equals the uninterrupted run's bit for bit;
#  2. without --max-restarts the same kill ends the job non-zero, naming
#     rank 1, and nothing is started again;
#  3. a job that fails every time stops after its restarts (--max-restarts 2:
#     three starts), exiting with the rank's status.
name=launch_restart needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo
# fc1 1024 wide: steps long enough (~10 ms) that the kill lands mid-run
opts="run.deterministic=1 train.checkpoint_every=8 train.keep_last=0 train.log_every=1 layer.fc1.out=1024"
STATE="params optim.momentum step optim.step trainer"

# killed NAME [launch options...]: 2 ranks, rank 1 SIGKILLed after rank 0
# logged 10 steps; the launcher's exit code in $rc
killed() {
	_n=$1
	shift
	timeout 120 "$kiln" launch -n 2 "$@" -- "$kiln" train "$ini" run.out_dir="$tmp/$_n" \
		train.batch=32 $opts ${extra:-} > "$tmp/$_n.log" 2>&1 &
	_lp=$!
	_r1=
	for _ in $(seq 600); do
		[ "$(grep -c '"event":"train"' "$tmp/$_n/metrics.jsonl" 2> /dev/null)" -ge 10 ] 2> /dev/null && break
		sleep 0.05
	done
	# rank 1: the launcher's child with KILN_RANK=1 in its environment
	_l=$(ps -o pid= --ppid $_lp | head -1)
	for c in $(ps -o pid= --ppid $_l); do
		tr '\0' '\n' < "/proc/$c/environ" 2> /dev/null | grep -qx KILN_RANK=1 && _r1=$c
	done
	[ -n "$_r1" ] && kill -9 "$_r1" || bad "$_n: rank 1 not found to kill"
	wait $_lp
	rc=$?
}

# ---- 1. a rank killed mid-run, one restart: bit-identical --------------
run whole 2 32 $opts
killed restart --max-restarts 1
[ $rc = 0 ] || { bad "restart: exited $rc"; tail -20 "$tmp/restart.log"; }
grep -q "kiln launch: restart 1 of 1" "$tmp/restart.log" || bad "restart: the launcher did not say it restarted"
grep -q '"resumed_step": [1-9]' "$tmp/restart.log" || bad "restart: the restarted ranks did not resume from a checkpoint"
"$tool" same "$(ck whole 64)" "$(ck restart 64)" $STATE ||
	bad "killed and restarted run differs from the uninterrupted one"

# ---- 2. no restarts: the job fails naming the rank ----------------------
# (a long run: on a quiet machine 64 steps can end before the kill)
extra="train.epochs=1000" killed norestart
[ $rc != 0 ] || bad "no restart: exited 0 after a rank was killed"
grep -q "rank 1 (pid [0-9]*) failed with signal 9" "$tmp/norestart.log" || bad "no restart: rank 1 not named"
! grep -q "restart 1" "$tmp/norestart.log" || bad "no restart: the job was started again"

# ---- 3. a job failing every time stops after its restarts ---------------
timeout 60 "$kiln" launch -n 2 --max-restarts 2 -- sh -c 'exit 3' > "$tmp/always.log" 2>&1
rc=$?
[ $rc = 3 ] || bad "always failing: exit $rc, expected 3"
[ "$(grep -c 'kiln launch: restart [0-9] of 2' "$tmp/always.log")" = 2 ] || bad "always failing: not exactly 2 restarts"
exit $fail
