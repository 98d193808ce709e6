#!/bin/sh
# tests/launch_nodes.sh - a two-node run's launchers (docs/distributed.md,
# "Multi-node" and "Stopping"), both on this machine: `kiln launch -n 1
# --nnodes 2 --node-rank K --master 127.0.0.1:PORT`, one rank each.
#
#  1. node 1's launcher killed (SIGKILL: its ssh session or node agent
#     lost): its rank stops through its parent-death signal, the run stops
#     with rank 0's checkpoint, but not as a user's stop: node 0's launcher
#     and both ranks exit non-zero naming rank 1 (node 1) and its vanished
#     launcher, the launcher in its own last line (before session 30 the stop was a clean one: node 0 exited 0
#     with "stopped": true, naming nobody);
#  2. SIGHUP to node 1's launcher (its terminal closed): the same graceful
#     stop, named as a hangup of rank 1 (node 1), both launchers non-zero;
#  3. SIGTERM to node 1's launcher (the user's stop): a clean stop, both
#     launchers exit 0;
#  4. a torchrun-style rank of LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2 is
#     refused, exit 2, naming both (before session 30 it was taken);
#  5. --master [::1]:PORT (IPv6 in brackets; where this machine has ::1):
#     the run trains (before session 30 the store could not resolve
#     '[::1]'); a bracket left open is refused, exit 2.
# Cases 1-3 have a deadline of 240 s each: a watchdog kills launchers
# that outlive it and the case fails (before session 32 a hung launcher
# hung the test, and CI with it).
name=launch_nodes
needs=gloo
. "$(dirname "$0")/dist_common.sh"

mlp_ini "$tmp/mlp.ini" 3 60
# long enough that the signal lands in training (the stop is agreed at a
# log point: the end of a 128-step epoch)
long="train.epochs=100000 train.log_every=1000 train.checkpoint_every=0 data.limit=8192 layer.fc1.out=512"
export KILN_STORE_TOKEN=kiln-test-token-0123456789abcdef

# nodes NAME K: start node 0 and node 1 (launchers $l0, $l1; logs
# $tmp/NAME0.log, NAME1.log) and wait (up to 60 s) until rank 0 trains
nodes() {
	port=$(free_port "$2")
	for k in 0 1; do
		# (SIGHUP at its default: under nohup, as CI may run, the
		# launchers would ignore case 2's hangup)
		sig_default SIGHUP "$kiln" launch -n 1 --nnodes 2 --node-rank $k --master 127.0.0.1:$port -- "$kiln" train \
			"$tmp/mlp.ini" run.out_dir="$tmp/$1$k" $long > "$tmp/$1$k.log" 2>&1 &
		eval l$k=\$!
	done
	# the case's deadline: launchers that outlive it are killed (their
	# ranks follow: case 1's rule), so a hang fails the test, not CI
	( exec > /dev/null 2>&1; sleep 240; touch "$tmp/$1.overdue"; kill -KILL $l0 $l1 ) &
	wd=$!
	_i=0
	until grep -q '"event":"train"' "$tmp/${1}0/metrics.jsonl" 2>/dev/null; do
		_i=$((_i + 1))
		[ $_i -le 600 ] || { kill -KILL $l0 $l1; overdue "$1"; bad "$1: training did not start"; return 1; }
		sleep 0.1
	done
}

# overdue NAME: the case's deadline passed (the watchdog killed its
# launchers); the watchdog itself ends here
overdue() {
	# (the subshell first: its sleep killed first would let it go on)
	_s=$(pgrep -P "$wd" sleep)
	kill -KILL "$wd" $_s 2> /dev/null
	wait "$wd" 2> /dev/null
	if [ -e "$tmp/$1.overdue" ]; then bad "$1: the launchers outlived the case's 240 s: killed"; fi
}

# settled NAME: wait (up to 60 s) until rank 1 (orphaned in case 1) said
# how it ended
settled() {
	_i=0
	until grep -q '^kiln: .*stopped at step\|^{"epochs"' "$tmp/${1}1.log" || [ $_i -ge 600 ]; do
		sleep 0.1
		_i=$((_i + 1))
	done
}

# named NAME CAUSE: the stop's checkpoint written, node 0's launcher
# exited non-zero ($rc0), and both ranks named rank 1 (node 1) and CAUSE
named() {
	[ "$rc0" != 0 ] || bad "$1: node 0's launcher exited 0 (a clean stop) after $2"
	ls "$tmp/${1}0"/checkpoints/ckpt-*.kiln > /dev/null 2>&1 || bad "$1: no stop checkpoint"
	tail -1 "$tmp/${1}0/metrics.jsonl" | grep -q '"event": *"stopped".*"cause": *"rank 1 of 2 (node 1, ' ||
		bad "$1: metrics.jsonl's stopped event names no cause: $(tail -1 "$tmp/${1}0/metrics.jsonl")"
	for k in 0 1; do
		grep -q "^kiln: error: stopped at step [0-9]*, not at the user's request: rank 1 of 2 (node 1, host [^)]*): $2" "$tmp/$1$k.log" ||
			{ bad "$1: rank $k does not name rank 1 (node 1) and $2"; tail -5 "$tmp/$1$k.log"; }
	done
	grep -q '"stop_cause": "rank 1 of 2 (node 1, ' "$tmp/${1}0.log" || bad "$1: rank 0's result has no stop_cause"
	grep -q "^kiln launch: error: rank 0 stopped (exit status 1), not at the user's request: rank 1 of 2 (node 1, host [^)]*): $2" "$tmp/${1}0.log" ||
		bad "$1: node 0's launcher does not name rank 1 (node 1) and $2"
}

# ---- 1. node 1's launcher killed ---------------------------------------
if nodes kill 1; then
	kill -KILL "$l1"
	wait "$l0"
	rc0=$?
	settled kill
	overdue kill
	echo "kill: node 0's launcher exited $rc0"
	named kill "its launcher (kiln launch, process $l1) went away"
fi

# ---- 2. SIGHUP to node 1's launcher --------------------------------------
if nodes hup 2; then
	kill -HUP "$l1"
	wait "$l1"
	rc1=$?
	wait "$l0"
	rc0=$?
	overdue hup
	echo "hup: node 0's launcher exited $rc0, node 1's $rc1"
	[ "$rc1" != 0 ] || bad "hup: node 1's launcher exited 0 after a hangup"
	grep -q "^kiln launch: error: rank 1 stopped (exit status 1), not at the user's request: rank 1 of 2 (node 1, host [^)]*): a hangup (SIGHUP" "$tmp/hup1.log" ||
		bad "hup: node 1's launcher does not name the hangup of rank 1"
	grep -q "kiln launch: passing Hangup to every rank" "$tmp/hup1.log" ||
		bad "hup: node 1's launcher did not pass the hangup on"
	named hup "a hangup (SIGHUP"
fi

# ---- 3. SIGTERM to node 1's launcher: the user's stop --------------------
if nodes term 3; then
	kill -TERM "$l1"
	wait "$l1"
	rc1=$?
	wait "$l0"
	rc0=$?
	overdue term
	echo "term: node 0's launcher exited $rc0, node 1's $rc1"
	[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || bad "term: the launchers exited $rc0 and $rc1, expected 0 (a clean stop)"
	tail -1 "$tmp/term0/metrics.jsonl" | grep -q '"event": *"stopped"' || bad "term: no stopped event"
	tail -1 "$tmp/term0/metrics.jsonl" | grep -q '"cause"' && bad "term: the user's stop has a cause"
	grep -q "not at the user's request" "$tmp/term0.log" "$tmp/term1.log" && bad "term: a rank called it not the user's"
fi
# ---- 4. a local rank beyond the node's ranks -------------------------------
RANK=1 WORLD_SIZE=2 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 MASTER_PORT=$(free_port 4) timeout 60 "$kiln" train \
	"$tmp/mlp.ini" run.out_dir="$tmp/local" > "$tmp/local.log" 2>&1
rc=$?
[ "$rc" = 2 ] || bad "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2: exit $rc, expected 2"
grep -q "^kiln: error: LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2: the local rank must be below the local world size" "$tmp/local.log" ||
	bad "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2: the error does not name both: $(tail -1 "$tmp/local.log")"
# ---- 5. an IPv6 master address ---------------------------------------------
"$kiln" launch -n 1 --master '[::1:29500' -- true > "$tmp/v6bad.log" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "expected HOST:PORT (an IPv6 address in brackets" "$tmp/v6bad.log" ||
	bad "--master '[::1:29500': exit $rc: $(cat "$tmp/v6bad.log")"
if /usr/bin/python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2> /dev/null; then
	port=$(free_port 5)
	timeout 120 "$kiln" launch -n 2 --master "[::1]:$port" -- "$kiln" train "$tmp/mlp.ini" \
		run.out_dir="$tmp/v6" train.max_steps=4 > "$tmp/v6.log" 2>&1
	rc=$?
	[ "$rc" = 0 ] || { bad "--master [::1]:$port: exit $rc"; grep error "$tmp/v6.log"; }
	grep -q "kiln launch: ranks 0..1 of 2, store \[::1\]:$port," "$tmp/v6.log" ||
		bad "--master [::1]:$port: the launch line does not name the store"
	# torchrun's way: MASTER_ADDR in brackets (once passed to getaddrinfo
	# as it was: no rank could reach the store)
	port=$(free_port 6)
	for r in 1 0; do
		RANK=$r WORLD_SIZE=2 MASTER_ADDR='[::1]' MASTER_PORT=$port KILN_STORE_TOKEN=0123456789abcdef0123456789abcdef \
			timeout 120 "$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/v6env" train.max_steps=2 > "$tmp/v6env$r.log" 2>&1 &
	done
	wait
	for r in 0 1; do
		grep -q "^\[dist\] rank $r of 2 .*store \[::1\]:$port$" "$tmp/v6env$r.log" ||
			bad "MASTER_ADDR='[::1]': rank $r: no 'store [::1]:$port' line"
	done
	tail -1 "$tmp/v6env0.log" | grep -q '"steps": 2,' || bad "MASTER_ADDR='[::1]': rank 0 did not finish its 2 steps"
else
	echo "no IPv6 loopback (::1): --master [::1]:PORT not tested"
fi
[ "$fail" = 0 ] || { for f in "$tmp"/*.log; do echo "== $f"; tail -8 "$f"; done; }
exit $fail
