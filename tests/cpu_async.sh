#!/bin/sh
# tests/cpu_async.sh - [plugin.cpu] async's default, `auto`: off for one
# process; on a rank of a data-parallel run, the rule of async_auto.c's
# cpu_async_rule once `kiln train` has told the device the step's
# workload (KILN_PROC_WORKLOAD): async where the gradients are >= 4 MiB and
# the forward >= 256 MFLOP a step (bench/'s fp32 CNN), sync where not
# (bench/'s MLP), async whatever the model where the rank's issuing thread
# waits for a CPU now (over 0.25 s a second in a 40 ms spin at the plan;
# KILN_CPU_PROBEWAIT stands for it here, and a real busy loop beside 2
# ranks on one CPU gives it), not where only the load average is high
# (main's KILN_CPU_LOADAVG hook, ignored now); 0 and 1 as set,
# either way.  The CPU device logs its choice when it opens ("opened
# ordinal 0: ...; async streams" / "sync streams", KILN_LOG_LEVEL=debug)
# and the rule's ("async = auto: sync streams (...)"); the test counts
# those lines.
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

# decided NPROC WANT INI [overrides...]: NPROC ranks train INI and each
# one's rule chose WANT (async or sync) streams ($pin: a command the
# launch runs under, e.g. taskset)
pin=
decided() {
	_n=$1 _want=$2 _ini=$3
	shift 3
	rm -rf "$tmp/o"
	KILN_MASTER_PORT=$port KILN_LOG_LEVEL=info timeout 300 $pin "$kiln" launch -n "$_n" -- \
		"$kiln" train "$_ini" run.out_dir="$tmp/o" "$@" > "$tmp/log" 2>&1
	_rc=$?
	[ $_rc = 0 ] || { tail -20 "$tmp/log"; fail "$_ini $*: exit $_rc"; }
	# the rule's lines, not a later switch's ("sync -> async streams", below)
	_got=$(grep -c "async = auto: $_want streams (" "$tmp/log")
	_other=$(grep -c "async = auto: [a-z]* streams (" "$tmp/log")
	if [ "$_got" != "$_n" ] || [ "$_other" != "$_n" ]; then
		grep "async = auto" "$tmp/log"
		fail "$_ini ${*:-(default)}: $_got of $_other ranks chose $_want streams, want $_n of $_n"
	fi
	checks=$((checks + 1))
}

# the rule's input is the machine's contention too: a quiet one unless a
# check says otherwise
KILN_CPU_PROBEWAIT=0
export KILN_CPU_PROBEWAIT

opened 1 sync
opened 1 sync plugin.cpu.async=auto
opened 1 async plugin.cpu.async=1
opened 2 async
opened 2 async plugin.cpu.async=auto
opened 2 sync plugin.cpu.async=0
opened 2 sync plugin.cpu.async=off
# bench/'s models at their DDP batch (64 a rank), on synthetic data of
# Fashion-MNIST's shape: the MLP (784-512-256-10: 0.54 M gradients, 2.0
# MiB, 69 MFLOP forward a step) sync, the fp32 CNN (conv 5x5 32 and 64,
# fc 1024: 3.3 M, 12.5 MiB, 1.8 GFLOP) async
mlp="$tmp/mlp_sized.ini"
{
	ini run seed=3 threads=1
	ini_synthetic 256 28 10 workers=0
	ini_layers flat:flatten fc1:linear:out=512 r1:relu fc2:linear:out=256 r2:relu \
		fc3:linear:out=10 loss:softmax_xent
	ini train epochs=1 max_steps=1 batch=64 eval=0 checkpoint_every=0
} > "$mlp"
cnn="$tmp/cnn_sized.ini"
{
	ini run seed=3 threads=1
	ini_synthetic 256 28 10 workers=0
	ini_layers c1:conv:out=32:kernel=5:padding=2 r1:relu p1:maxpool:kernel=2 \
		c2:conv:out=64:kernel=5:padding=2 r2:relu p2:maxpool:kernel=2 flat:flatten \
		fc1:linear:out=1024 r3:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=1 max_steps=1 batch=64 eval=0 checkpoint_every=0
} > "$cnn"
decided 2 sync "$mlp"
decided 2 async "$cnn"
decided 2 sync "$cnn" train.batch=8        # 223 MFLOP a step: below 256
# busy now: the issuing thread waited 0.3 s a second for a CPU in the
# probe (the threshold is 0.25)
KILN_CPU_PROBEWAIT=0.3 decided 2 async "$mlp"
# a high load average alone (runs gone by; main's hook, 1000) is quiet
KILN_CPU_LOADAVG=1000 decided 2 sync "$mlp"
# the probe for real: both ranks on one CPU beside a busy loop pinned there
# wait for it (about 2/3 of the time); main's hook for the load average
# says quiet (main: sync)
if command -v taskset > /dev/null 2>&1 && taskset -c 0 true 2> /dev/null; then
	taskset -c 0 sh -c 'while :; do :; done' &
	spin=$!
	trap 'kill $spin 2> /dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
	sleep 0.2
	pin="taskset -c 0" KILN_CPU_PROBEWAIT= KILN_CPU_LOADAVG=0 decided 2 async "$mlp"
	kill $spin
	wait $spin 2> /dev/null
	trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
	pin=
else
	echo "note: no taskset: the real busy loop is not checked"
fi
# set, the rule is not asked
opened 2 async plugin.cpu.async=1
grep -q "async = auto" "$tmp/log" && { grep "async = auto" "$tmp/log"; fail "async=1 ran the auto rule"; }
checks=$((checks + 1))
# a word that is neither a boolean nor auto is an error naming the key
if "$kiln" train "$ini" run.out_dir="$tmp/o" plugin.cpu.async=sometimes > "$tmp/log" 2>&1; then
	fail "plugin.cpu.async=sometimes was accepted"
fi
grep -q "async" "$tmp/log" || { cat "$tmp/log"; fail "the error does not name async"; }
# a rank the rule made sync watches its issuing thread's run-queue wait
# (cpu_async_watch; KILN_CPU_RUNWAIT stands for it here, in seconds a
# second): above 0.25 for 2 intervals of 250 ms in a row, its streams turn
# async in place for the rest of the run; at 0.2 they stay sync.  The
# switch changes when work runs, not what it computes: the final
# checkpoint is the sync run's, byte for byte.  1000 steps of the MLP
# (>= 1 s on 2 CPUs) give the watch its intervals.
long="$tmp/mlp_long.ini"
sed 's/^samples = .*/samples = 16384/; s/^epochs = .*/epochs = 8/; s/^max_steps = .*/max_steps = 1000/' \
	"$mlp" > "$long"
grep -q "^max_steps = 1000" "$long" && grep -q "^samples = 16384" "$long" ||
	{ cat "$long"; fail "the long MLP's config was not written"; }
# watched WAIT SWITCHES: KILN_CPU_RUNWAIT=WAIT, and SWITCHES ranks logged
# the switch; the final checkpoint's checksum in $sum
watched() {
	rm -rf "$tmp/o"
	KILN_CPU_RUNWAIT=$1 KILN_MASTER_PORT=$port KILN_LOG_LEVEL=info timeout 300 "$kiln" launch -n 2 -- \
		"$kiln" train "$long" run.out_dir="$tmp/o" train.checkpoint_every=0 > "$tmp/log" 2>&1
	_rc=$?
	[ $_rc = 0 ] || { tail -20 "$tmp/log"; fail "KILN_CPU_RUNWAIT=$1: exit $_rc"; }
	_sw=$(grep -c "async = auto: sync -> async streams" "$tmp/log")
	[ "$_sw" = "$2" ] || { grep "async = auto" "$tmp/log"; fail "KILN_CPU_RUNWAIT=$1: $_sw ranks switched to async, want $2"; }
	set -- "$tmp"/o/checkpoints/ckpt-1000.kiln
	[ -f "$1" ] || { ls -R "$tmp/o"; fail "no final checkpoint"; }
	sum=$(cksum < "$1")
	checks=$((checks + 1))
}
watched 0.2 0
quiet=$sum
watched 0.3 2
[ "$sum" = "$quiet" ] || fail "the run that turned async mid-way ends with other weights ($sum, sync: $quiet)"
checks=$((checks + 1))
echo "PASS: $checks async choices"
