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
# (tests/dist_blame.sh).  The same on Gloo's TCP collectives (shm = 0,
# session 34): Gloo's pairs get a timeout that never ends a run and kiln
# times each Gloo wait on the run clock (plugins/gloo/deadline.h); before,
# Gloo's own clock counted the suspension and the job failed on resume
# ("a collective timed out ... after this process itself stood still").
# And on TCP, rank 1 of 2 stopped alone (SIGSTOP) mid-run: rank 0 still
# fails within the timeout (and 3 s), naming rank 1, never blaming a stall.
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

# ---- Gloo's TCP collectives (shm = 0): the same, against an uninterrupted
# run on TCP (session 34: before, Gloo's own clock counted the suspension)
run plaintcp 2 16 plugin.gloo.shm=0 "$@"
suspended tcp plugin.gloo.shm=0 "$@"
echo "the job on Gloo's TCP suspended for 8 s ([dist] timeout = 3 s) exited $rc"
[ "$rc" = 0 ] || { bad "the suspended job on Gloo's TCP exited $rc"; grep "error: " "$tmp/tcp.log" | cut -c1-400; }
grep -q "stuck\|stood still" "$tmp/tcp.log" && bad "the suspended job on Gloo's TCP blamed a peer or its stall"
"$tool" same "$(newest_ck plaintcp)" "$(newest_ck tcp)" params optim.momentum ||
	bad "the suspended job's weights on Gloo's TCP differ from the uninterrupted run's"

# ---- one rank alone stopped on Gloo's TCP: still named within the timeout
# (heartbeat 8 s here, past the timeout: at 4 s the watchdog, which ends a
# rank 4 s after its peer's last beat, raced the 3 s collective deadline
# and at load 10 won it, its message not the collective's, session 35's CI)
port=$(free_port 3)
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}" # (as kiln launch's)
hand_ranks one 2 60 "$ini" train.batch=16 plugin.gloo.shm=0 "$@" dist.heartbeat=8
i=0
while [ $i -lt 600 ] && [ "$(cat "$tmp/one1.log" 2>/dev/null | grep -c "step ")" -lt 100 ]; do
	sleep 0.1
	i=$((i + 1))
done
t0=$(date +%s%N)
pkill -STOP -P "$pid1" 2>/dev/null
wait "$pid0"
rc0=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
rank_kill "$pid1"
wait "$pid1" 2>/dev/null
e=$(grep "kiln: error: " "$tmp/one0.log")
echo "rank 1 alone stopped on Gloo's TCP: rank 0 exited $rc0 after $ms ms"
[ "$rc0" != 0 ] && [ "$rc0" != 124 ] || bad "rank 0 exited $rc0 after rank 1 stopped"
[ "$ms" -le 6000 ] || bad "rank 0 took $ms ms after rank 1 stopped ([dist] timeout = 3 s)"
echo "$e" | grep -q "rank 0 of 2: .*rank 1 did not answer within \[dist\] timeout = 3.0 s" ||
	{ bad "rank 0 does not say that rank 1 did not answer within the timeout"; echo "$e" | cut -c1-600; }
echo "$e" | grep -q "rank 1 (host [^)]*) sent no heartbeat\|a peer is stuck" ||
	{ bad "rank 0 does not call rank 1 stuck"; echo "$e" | cut -c1-600; }
echo "$e" | grep -q "stood still for" && bad "rank 0 blames its own stall: $e"
exit $fail
