#!/bin/sh
# tests/dist_suspend.sh - a whole job suspended longer than [dist] timeout
# (session 33, docs/distributed.md "Failures"): `scontrol suspend`, gang
# scheduling, or SIGSTOP of every process, stops the launcher and each
# rank.  Two ranks on Gloo's shared memory, the MLP of tests/dist.sh,
# [dist] timeout = 3 s, heartbeat = 4 s: every process of `kiln launch
# -n 2` is stopped (SIGSTOP) mid-run for 8 s (more than twice the
# timeout), then continued: the run finishes with exit 0 and the same
# weights as an uninterrupted run, bit for bit.  Before, every rank's
# collective, resumed past its deadline, failed with "a peer is stuck":
# the deadlines counted time in which the process itself did not run.
# A single stuck peer is still named within the timeout
# (tests/dist_blame.sh).  The same on Gloo's TCP collectives (shm = 0),
# whose waits are Gloo's own: such a job may fail, and a rank that does
# says it stood still itself, not that a peer is stuck.
name=dist_suspend needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 3 gloo
set -- train.epochs=400 train.log_every=1 train.checkpoint_every=100000 dist.heartbeat=4

run plain 2 16 "$@"

# every process of the job: the launcher and its ranks (scontrol suspend)
job_pids() {
	echo "$1"
	for _c in $(pgrep -P "$1"); do job_pids "$_c"; done
}
# suspended NAME OVERRIDES...: `kiln launch -n 2` into $tmp/NAME, the whole
# job stopped for 8 s once its log has 200 step lines, continued; $rc its exit
suspended() {
	_n=$1
	shift
	timeout 120 "$kiln" launch -n 2 -- "$kiln" train "$ini" run.out_dir="$tmp/$_n" \
		train.batch=16 "$@" > "$tmp/$_n.log" 2>&1 &
	_pid=$!
	_i=0
	while [ $_i -lt 600 ] && [ "$(cat "$tmp/$_n.log" 2>/dev/null | grep -c "step ")" -lt 200 ]; do
		sleep 0.1
		_i=$((_i + 1))
	done
	_pids=$(job_pids "$_pid")
	# shellcheck disable=SC2086
	kill -STOP $_pids 2>/dev/null
	sleep 8
	# shellcheck disable=SC2086
	kill -CONT $_pids 2>/dev/null
	wait "$_pid"
	rc=$?
}
suspended susp "$@"
echo "the job suspended for 8 s ([dist] timeout = 3 s) exited $rc"
[ "$rc" = 0 ] || { bad "the suspended job exited $rc"; grep -v '^\[' "$tmp/susp.log" | tail -5; }
grep -q "stuck" "$tmp/susp.log" && bad "the suspended job called a peer stuck"
"$tool" same "$(newest_ck plain)" "$(newest_ck susp)" params optim.momentum ||
	bad "the suspended job's weights differ from the uninterrupted run's"

# ---- Gloo's TCP collectives (shm = 0): their waits are Gloo's, on its own
# clock, and count the suspension: the job fails, but each failed rank says
# that it stood still itself, not that a peer is stuck (nor names one)
suspended tcp plugin.gloo.shm=0 "$@"
echo "the job on Gloo's TCP suspended for 8 s exited $rc"
if [ "$rc" != 0 ]; then
	grep "kiln: error: " "$tmp/tcp.log" | grep -q "a collective timed out (\[dist\] timeout = 3 s) [0-9.]* s after this process itself stood still for [0-9.]* s (a suspended job?" ||
		{ bad "no failed rank on Gloo's TCP says it stood still itself"; grep "error: " "$tmp/tcp.log" | cut -c1-400; }
	grep "kiln: error: " "$tmp/tcp.log" | grep -q "a peer is stuck" &&
		bad "a rank on Gloo's TCP calls a peer stuck after the job's suspension"
fi
exit $fail
