#!/bin/sh
# tests/cpu_team_hint.sh - a fixed CPU team ([run] threads set) never
# adapts, so the CPU device says once, at info level, when its threads
# keep waiting for a CPU where the adaptive team would have stepped down
# (plugins/cpu/cpu.c team_news_log, threads.h struct cpu_team_live): "the
# fixed team of 2 threads ([run] threads is set) waits for a CPU ...",
# naming the key to change.  The condition is made certain: kiln and a
# shell busy loop both under `taskset -c 0`, so kiln's thread that runs
# the steps has the one CPU for at most half of the time whatever else the
# machine runs (0.5 threads waiting or more, the step-down threshold is
# 0.30).  A team of one has no partner to wait for and says nothing.
name=cpu-team-hint
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
command -v taskset >/dev/null 2>&1 || { echo "SKIP: no taskset"; exit 77; }
[ -r /proc/self/schedstat ] || { echo "SKIP: the kernel reports no schedstat (nothing to steer by)"; exit 77; }
ini="$tmp/mlp.ini"
{
	ini run seed=3 threads=2
	ini_synthetic 4096 16 10 workers=0
	ini_layers flat:flatten fc1:linear:out=256 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=4 max_steps=250 batch=128 eval=0 checkpoint_every=0
} > "$ini"

loop=
stop_loop() { [ -z "$loop" ] || { kill "$loop" 2>/dev/null; wait "$loop" 2>/dev/null; loop=; }; }
trap 'stop_loop; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
# a simple command in the background: $! is the loop itself
taskset -c 0 sh -c 'while :; do :; done' &
loop=$!

hint="the fixed team of 2 threads ([run] threads is set) waits for a CPU"
# trains THREADS: the run's stderr in $tmp/log
train() {
	rm -rf "$tmp/o"
	timeout 300 taskset -c 0 "$kiln" train "$ini" run.out_dir="$tmp/o" run.threads="$1" \
		> "$tmp/out" 2> "$tmp/log"
	_rc=$?
	[ $_rc = 0 ] || { tail -20 "$tmp/log"; fail "run.threads=$1 under taskset -c 0: exit $_rc"; }
	checks=$((checks + 1))
}

train 2
n=$(grep -cF "$hint" "$tmp/log")
if [ "$n" != 1 ]; then
	cat "$tmp/log"
	fail "a fixed team of 2 on one busy CPU: $n hint lines, want 1"
fi
grep -F "$hint" "$tmp/log" | grep -q "Leave \[run\] threads unset (0)" ||
	fail "the hint does not name the key to change: $(grep -F "$hint" "$tmp/log")"
echo "ok: $(grep -F "$hint" "$tmp/log")"

train 1
n=$(grep -c "the fixed team of" "$tmp/log")
[ "$n" = 0 ] || fail "a team of one: $n hint lines, want 0"
echo "ok: a team of one says nothing"

stop_loop
echo "PASS: $checks checks"
