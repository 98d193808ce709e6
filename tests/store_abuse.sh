#!/bin/sh
# tests/store_abuse.sh - the rendezvous store under hostile clients, in a
# real 2-rank run (kiln launch, gloo, [dist] timeout = 20) whose store
# listens at a port we choose (docs/distributed.md, "The store"):
#
#  - a client without the token, and one with a wrong token, are refused
#    (the connection closed before any key is read or written);
#  - a stall client (authenticated: sets a 4 MiB value, then asks for it 16
#    times and never reads) does not stop the store's thread: the run,
#    stopped by SIGTERM, agrees on the stop and leaves through the store,
#    exit 0 with its checkpoint (the store used to block in send() on it,
#    and store calls then failed after a hard-coded 60 s);
#  - a hog client's eight 64 MiB sets are all refused and 7 MiB sets stop
#    at the 32 MiB limit: rank 0's resident memory grows by less than
#    80 MB over the run (it grew by ~520 MB);
#  - a second "rank 1" with the same token pointed at the running run is
#    refused ("rank 1 joined twice") and the run still ends with exit 0
#    (session 31: the refused process said "rank 1 failed" as it left,
#    and both real ranks exited 1 at their finish, "rank 1 failed after
#    the last collective");
#  - a rank whose master port is something that accepts and never greets
#    fails after [dist] timeout naming the missing greeting (before session
#    28 the goodbye's own 1 s timeout replaced it: "no answer for ''").
name=store_abuse
needs=gloo
. "$(dirname "$0")/dist_common.sh"
need_python3
client="$srcdir/tests/store_client.py"

mlp_ini "$tmp/mlp.ini" 5 20
port=$(free_port 5)
timeout 120 "$kiln" launch -n 2 --master "127.0.0.1:$port" -- "$kiln" train "$tmp/mlp.ini" \
	run.out_dir="$tmp/run" train.epochs=100000 > "$tmp/run.log" 2>&1 &
tpid=$!

# rank 0's resident memory (kB) once it trains
i=0
until grep -q '"event":"train"' "$tmp/run/metrics.jsonl" 2>/dev/null; do
	i=$((i + 1))
	[ $i -le 600 ] || { kill -KILL "$tpid"; bad "training did not start"; tail "$tmp/run.log"; exit 1; }
	sleep 0.1
done
lpid=$(cut -d" " -f1 "/proc/$tpid/task/$tpid/children")
rank0=$(cut -d' ' -f1 "/proc/$lpid/task/$lpid/children")
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$rank0/status" 2>/dev/null; }
rss0=$(rss)
[ -n "$rss0" ] || bad "no rank 0 (pid '$rank0') to measure"

for m in noauth badtoken; do
	r=$("$py" "$client" $m 127.0.0.1 "$port")
	[ "$r" = refused ] || bad "a client ($m) was $r, expected refused"
done
"$py" "$client" stall 127.0.0.1 "$port" > "$tmp/stall.out" 2>&1 &
spid=$!
"$py" "$client" hog 127.0.0.1 "$port" > "$tmp/hog.out" 2>&1 &
hpid=$!
# the most rank 0 holds while the hog works, and a second after
max=$rss0
n=0
while [ $n -lt 5 ]; do
	kill -0 "$hpid" 2>/dev/null || n=$((n + 1))
	r=$(rss)
	[ -z "$r" ] || [ "$r" -le "$max" ] || max=$r
	sleep 0.2
done
wait "$hpid"
# an intruder: a process claiming rank 1 of this run, refused at the door
KILN_RANK=1 KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$port timeout 60 \
	"$kiln" train "$tmp/mlp.ini" run.out_dir="$tmp/intruder" > "$tmp/intruder.log" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || bad "a second rank 1 exited $rc"
grep -q "rank 1 joined twice" "$tmp/intruder.log" ||
	{ bad "a second rank 1 was not refused as such"; tail -3 "$tmp/intruder.log"; }
# then the run is stopped (SIGTERM to the launcher): the stop is agreed
# on, and the ranks leave, through the store the stall client is on
kill -TERM "$lpid"
wait "$tpid"
rc=$?
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
cat "$tmp/hog.out"
[ $rc = 0 ] || { bad "the run with a stall, a hog and an intruder exited $rc"; tail -15 "$tmp/run.log"; }
grep -q 'checkpoint written to' "$tmp/run.log" || bad "the stopped run wrote no checkpoint"
grep -q stalling "$tmp/stall.out" || bad "the stall client did not get going: $(cat "$tmp/stall.out")"
grep -q '^big-accepted 0$' "$tmp/hog.out" || bad "64 MiB values were accepted"
n=$(sed -n 's/^filled //p' "$tmp/hog.out")
[ -n "$n" ] && [ "$n" -le 4 ] || bad "7 MiB values accepted: '$n' (the limit is 32 MiB in all)"
grow=$(( (max - rss0) / 1024 ))
echo "rank 0: ${rss0} kB resident when training began, at most ${max} kB (+${grow} MB); launch exited $rc"
[ "$grow" -lt 80 ] || bad "rank 0 grew by $grow MB under the hog client"

# ---- a listener that is not a store --------------------------------------
port=$(free_port 9)
$py -c "import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(5); time.sleep(30)" "$port" &
qpid=$!
sleep 0.5
KILN_RANK=1 KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$port \
	KILN_STORE_TOKEN=kiln-test-token-0123456789abcdef timeout 60 "$kiln" train "$tmp/mlp.ini" \
	run.out_dir="$tmp/mute" dist.timeout=3 > "$tmp/mute.log" 2>&1
rc=$?
kill "$qpid" 2>/dev/null
wait "$qpid" 2>/dev/null
[ $rc != 0 ] && [ $rc != 124 ] || bad "a silent listener as the store: exit $rc"
grep -q "no answer for '(greeting)'" "$tmp/mute.log" ||
	{ bad "a silent listener as the store: the error does not name the greeting"; tail -3 "$tmp/mute.log"; }
exit $fail
