#!/bin/sh
# tests/store_claims.sh - who is rank r at the rendezvous (session 32;
# docs/distributed.md, "The rendezvous checks who joins"), real ranks
# (Gloo, the MLP of the dist tests) on 127.0.0.1 at a port we choose:
#
#  1. a second rank 1 with another host name (unshare -u) pointed at a
#     running 2-rank run is refused ("rank 1 joined twice", naming both
#     hosts), and kiln/host/1, which the watchdog's and a loss's messages
#     name, still holds the real rank 1's host (before: the intruder's,
#     posted before its claim was decided); the run then stops on SIGTERM,
#     exit 0;
#  2. rank 1 of 3 killed (SIGKILL) while ranks 0 and 1 wait for rank 2 at
#     the rendezvous and started again, then rank 2: all three train to
#     the end, exit 0 (before: the new rank 1 was "rank 1 joined twice" and
#     every waiting rank failed with it, as its claim was never released).
# Every process runs under `timeout`; the waits poll the store's keys.
name=store_claims needs=gloo
. "$(dirname "$0")/dist_common.sh"
need_python3
client="$srcdir/tests/store_client.py"
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}"
ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60

# key PORT KEY: the store's value of KEY ("(absent)")
key() { timeout 20 "$py" "$client" check 127.0.0.1 "$1" "$2" 2>/dev/null || echo "(no store)"; }
# until_set PORT KEY: wait (60 s at most) until KEY is set
until_set() {
	_i=0
	while [ "$(key "$1" "$2")" = "(absent)" ] || [ "$(key "$1" "$2")" = "(no store)" ]; do
		_i=$((_i + 1))
		[ $_i -le 300 ] || return 1
		sleep 0.2
	done
}

# ---- 1. a second rank 1 from another host ------------------------------------
if unshare -u true 2> /dev/null; then
	port=$(free_port 3)
	timeout 120 "$kiln" launch -n 2 --master "127.0.0.1:$port" -- "$kiln" train "$ini" \
		run.out_dir="$tmp/run" train.epochs=100000 > "$tmp/run.log" 2>&1 &
	tpid=$!
	until_set "$port" kiln/all_joined || bad "the 2-rank run did not rendezvous"
	h1=$(key "$port" kiln/host/1)
	KILN_RANK=1 KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$port timeout 60 \
		unshare -u sh -c 'hostname kiln-intruder && exec "$@"' sh "$kiln" train "$ini" \
		run.out_dir="$tmp/intruder" > "$tmp/intruder.log" 2>&1
	rc=$?
	[ $rc != 0 ] && [ $rc != 124 ] || bad "a second rank 1 exited $rc"
	grep -q "rank 1 joined twice: this process (host kiln-intruder, pid [0-9]*) and one before it (host $h1, pid" "$tmp/intruder.log" ||
		{ bad "a second rank 1 was not refused naming both hosts"; tail -3 "$tmp/intruder.log"; }
	h1after=$(key "$port" kiln/host/1)
	echo "kiln/host/1: '$h1' before the intruder, '$h1after' after"
	[ "$h1after" = "$h1" ] && [ "$h1" != kiln-intruder ] ||
		bad "the refused rank 1 replaced kiln/host/1 ('$h1' -> '$h1after')"
	[ "$(key "$port" kiln/lost)" = "(absent)" ] || bad "the refused rank 1 was recorded lost"
	lpid=$(cut -d" " -f1 "/proc/$tpid/task/$tpid/children")
	kill -TERM "$lpid"
	wait "$tpid"
	rc=$?
	[ $rc = 0 ] || { bad "the run beside the intruder exited $rc"; tail -5 "$tmp/run.log"; }
else
	echo "part 1 skipped: unshare -u is not permitted here"
fi

# ---- 2. rank 1 started again while the others wait at the rendezvous ----------
port=$(free_port 4)
start() { # start NAME RANK: rank RANK of 3 in the background, its pid in pid_NAME
	KILN_RANK=$2 KILN_WORLD_SIZE=3 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$port timeout 120 \
		"$kiln" train "$ini" run.out_dir="$tmp/r$1" train.max_steps=4 > "$tmp/r$1.log" 2>&1 &
	eval "pid_$1=\$!"
}
start 0 0
start 1 1
until_set "$port" kiln/joined/1 || bad "rank 1 did not reach the rendezvous"
pkill -KILL -P "$pid_1"
wait "$pid_1" 2> /dev/null
start 1b 1
start 2 2
for r in 0 1b 2; do
	eval "wait \$pid_$r"
	rc=$?
	[ $rc = 0 ] || { bad "rank $r (of the rendezvous rank 1 rejoined) exited $rc"; grep "error" "$tmp/r$r.log" | tail -3; }
done
exit $fail
