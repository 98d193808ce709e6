#!/bin/sh
# tests/cpu_team_hint.sh - a fixed CPU team ([run] threads set) never
# adapts, so the CPU device says once, at info level, when its threads
# keep waiting for a CPU where the adaptive team would have stepped down
# (plugins/cpu/cpu.c team_news_log, threads.c cpu_team_feed): "the fixed
# team of 2 threads ([run] threads is set) waits for a CPU ...", naming
# the key to change.  The condition is made certain: kiln and a shell busy
# loop both pinned to one CPU of this process's mask, so kiln's thread
# that runs the steps has that CPU for at most half of the time whatever
# else the machine runs (0.5 threads waiting or more, the step-down
# threshold is 0.30).  The run lasts well over 2 s (20+ intervals of
# 100 ms), so the waiting-alone rule (after the start-up and two busy
# intervals in a row) fires whatever the other processes' CPU time reads,
# and "once" is tested over many intervals.  With [run] deterministic = 1
# the advice is a smaller count, never "unset" (deterministic needs a
# fixed team).  A team of one has no partner to wait for and says nothing.
name=cpu-team-hint
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
command -v taskset >/dev/null 2>&1 || { echo "SKIP: no taskset"; exit 77; }
[ -r /proc/self/schedstat ] || { echo "SKIP: the kernel reports no schedstat (nothing to steer by)"; exit 77; }
# the first CPU of this shell's affinity mask ("pid N's current affinity
# list: 2-5,7")
cpu=$(taskset -pc $$ 2>/dev/null | sed -n 's/.*: *\([0-9][0-9]*\).*/\1/p')
[ -n "$cpu" ] && taskset -c "$cpu" true 2>/dev/null ||
	{ echo "SKIP: taskset cannot pin to a CPU of the mask (${cpu:-none read})"; exit 77; }
ini="$tmp/mlp.ini"
{
	ini run seed=3 threads=2
	ini_synthetic 16384 16 10 workers=0
	ini_layers flat:flatten fc1:linear:out=256 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=4 batch=128 eval=0 checkpoint_every=0
} > "$ini"

loop=
stop_loop() { [ -z "$loop" ] || { kill "$loop" 2>/dev/null; wait "$loop" 2>/dev/null; loop=; }; }
trap 'stop_loop; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
# a simple command in the background: $! is the loop itself
taskset -c "$cpu" sh -c 'while :; do :; done' &
loop=$!

hint="the fixed team of 2 threads ([run] threads is set) waits for a CPU"
# trains with ARGS: the run's stderr in $tmp/log, its wall seconds in $secs
train() {
	rm -rf "$tmp/o"
	_t0=$(date +%s%N)
	timeout 300 taskset -c "$cpu" "$kiln" train "$ini" run.out_dir="$tmp/o" "$@" \
		> "$tmp/out" 2> "$tmp/log"
	_rc=$?
	secs=$(( ($(date +%s%N) - _t0) / 1000000 ))
	[ $_rc = 0 ] || { tail -20 "$tmp/log"; fail "$* on CPU $cpu: exit $_rc"; }
	checks=$((checks + 1))
}
# exactly one hint line, with the advice $1
one_hint() {
	n=$(grep -cF "$hint" "$tmp/log")
	if [ "$n" != 1 ]; then
		cat "$tmp/log"
		fail "a fixed team of 2 on one busy CPU ($secs ms): $n hint lines, want 1"
	fi
	grep -F "$hint" "$tmp/log" | grep -qF "$1" ||
		fail "the hint does not say \"$1\": $(grep -F "$hint" "$tmp/log")"
	echo "ok ($secs ms): $(grep -F "$hint" "$tmp/log")"
}

# 2 s or more: on a machine fast enough to train 24 epochs sooner, twice
# as many (up to 192)
epochs=24
train run.threads=2 train.epochs=$epochs
while [ "$secs" -lt 2000 ] && [ $epochs -lt 192 ]; do
	echo "($secs ms for $epochs epochs: twice as many)"
	epochs=$((epochs * 2))
	train run.threads=2 train.epochs=$epochs
done
[ "$secs" -ge 2000 ] || fail "$epochs epochs took $secs ms: too short to test the hint (want >= 2 s)"
one_hint "Leave [run] threads unset (0)"

train run.threads=2 run.deterministic=1 train.epochs=6
one_hint "Set [run] threads to fewer threads"
grep -F "$hint" "$tmp/log" | grep -q "unset" && fail "deterministic: the hint says unset"

train run.threads=1 train.epochs=4
n=$(grep -c "the fixed team of" "$tmp/log")
[ "$n" = 0 ] || fail "a team of one: $n hint lines, want 0"
echo "ok: a team of one says nothing"

stop_loop
echo "PASS: $checks checks"
