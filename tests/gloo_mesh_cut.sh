#!/bin/sh
# tests/gloo_mesh_cut.sh - the link between two hosts is cut while Gloo
# connects its TCP mesh (session 34; docs/distributed.md "Failures"), two
# hosts in network namespaces (tests/netns_lib.sh), one rank each, host
# 1's cable through tests/netns_wire.py (150 ms each way, so that the cut
# lands before the pairs connect), the MLP of the dist tests, Gloo's TCP
# collectives.  The cut: host 1's port taken off the bridge (nothing passes
# either way, no reset) as soon as host 1 has a listening socket (rank 1's
# pairs, made once the rendezvous is over: the store listens on host 0),
# or a connection's handshake on no port of the store's (a pair's connect).
#  1. at the listener, [dist] timeout = 6 s, heartbeat 0 (no watchdog):
#     both ranks exit non-zero within 20 s of the cut (the mesh's deadline,
#     6 s, and leaving: rank 0 waits up to the timeout for the others to
#     leave, rank 1 up to 5 s to tell them it failed), rank 0 naming rank 1
#     and its host (kiln-h1), rank 1 the store (before: as soon, naming
#     only the store key rank 0 waited for);
#  2. the same at a pair's connect: rank 0 names rank 1 (host kiln-h1),
#     rank 1 rank 0 (host kiln-h0), each "did not connect within [dist]
#     timeout".  Before, rank 1 exited 36 s after the cut and rank 0 79 s
#     after (a pair's connect bounded by 5 timeouts, Gloo's, then the
#     outcome's wait by 6 and 10 s), neither naming a host;
#  3. at the listener, [dist] timeout = 60 s, heartbeat = 4 s: the watchdog
#     runs from the rendezvous on, so both exit within 13 s of the cut,
#     rank 0 naming rank 1 (host kiln-h1) as silent, rank 1 the store on
#     rank 0 (host kiln-h0).  Before, the watchdog started only once the
#     communicator had opened: both ranks failed at the timeout (60 s).
# ONLY=NAME (timeout, connect, heartbeat) runs one case.
# Skips (77) without root or where `ip netns add` is not permitted.
name=gloo_mesh_cut needs=gloo
. "$(dirname "$0")/dist_common.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null && command -v unshare > /dev/null || { echo "SKIP: no iproute2 or unshare"; exit 77; }
need_python3 "for tests/netns_wire.py"
ns=kc$$
ip netns add "$ns-probe" 2> /dev/null || { echo "SKIP: ip netns add is not permitted here"; exit 77; }
ip netns del "$ns-probe"
. "$srcdir/tests/netns_lib.sh"
trap 'net_down; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}"
ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo

# rank NAME R [overrides]: rank R of 2 on host R in the background
# ($rank_pid), output $tmp/NAME-rR.log, its exit status and time in
# $tmp/NAME-rR.end
rank() {
	_n=$1 _r=$2
	shift 2
	{
		ip netns exec "$ns-h$_r" unshare --uts sh -c 'hostname "$0" && exec "$@"' "kiln-h$_r" \
			env KILN_RANK="$_r" KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=10.77.0.1 KILN_MASTER_PORT=29611 \
			timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/$_n-r$_r" train.max_steps=4 \
			plugin.gloo.iface=eth0 plugin.gloo.shm=0 "$@" > "$tmp/$_n-r$_r.log" 2>&1
		echo "$? $(date +%s.%N)" > "$tmp/$_n-r$_r.end"
	} &
	rank_pid=$!
}

# cut_link STATES READY: in host 1, create the file READY once watching,
# then wait for a TCP socket in one of STATES (/proc/net/tcp's: 0A
# listening, 02 and 03 a connection's handshake) on no port of the
# store's (29611), then take host 1's port off the bridge; prints the time
# of the cut, or "none" after 60 s or where a connection on no port of the
# store's is already established (01: the mesh connected before a look of
# a loaded machine's, and a listener stays listening after it)
cut_link() {
	ip netns exec "$ns-h1" nice -n -10 "$py" -c '
import subprocess, sys, time
open(sys.argv[4], "w").close()
end = time.time() + 60
while time.time() < end:
    socks = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        ports = [int(x.split(":")[1], 16) for x in f[1:3]]
        if 29611 not in ports:
            socks.append(f[3])
    if "01" in socks:
        break
    if any(st in sys.argv[3].split(",") for st in socks):
        subprocess.run(["ip", "-n", sys.argv[1], "link", "set", sys.argv[2], "nomaster"], check=True)
        print("%.3f" % time.time(), flush=True)
        sys.exit(0)
    time.sleep(0.001)
print("none")' "$ns-sw" p1 "$1" "$2"
}

# case NAME STATES LIMIT MSG0 MSG1 [overrides]: both ranks started, the
# link cut (cut_link STATES); each must exit non-zero within LIMIT s of the
# cut, rank 0's log matching MSG0 and rank 1's MSG1 (grep -E)
case_() {
	_c=$1 _st=$2 _lim=$3 _m0=$4 _m1=$5
	shift 5
	for _try in 1 2; do
		net_up 2 1 150
		rm -f "$tmp/cut.ready" "$tmp/cut.t"
		# the watcher first, so that a loaded machine's slow start of it
		# cannot let the mesh connect before its first look
		cut_link "$_st" "$tmp/cut.ready" > "$tmp/cut.t" & _pc=$!
		_w=0
		while [ ! -e "$tmp/cut.ready" ] && [ $_w -lt 300 ]; do sleep 0.1; _w=$((_w + 1)); done
		rank "$_c" 0 "$@"; _p0=$rank_pid
		rank "$_c" 1 "$@"; _p1=$rank_pid
		wait $_pc
		_t=$(cat "$tmp/cut.t"); [ -n "$_t" ] || _t=none
		[ "$_t" = none ] || break
		# (the mesh connected between two looks of a loaded machine's)
		wait $_p0 $_p1
		echo "$_c: the cut came too late (try $_try)"
	done
	[ "$_t" != none ] || { bad "$_c: the link was not cut while the mesh connected"; return; }
	wait $_p0 $_p1
	for _r in 0 1; do
		read -r _rc _end < "$tmp/$_c-r$_r.end"
		_d=$(echo "$_end" | awk -v t="$_t" '{ printf "%.1f", $1 - t }')
		echo "$_c: rank $_r exited $_rc $_d s after the cut"
		[ $_rc != 0 ] || bad "$_c: rank $_r exited 0"
		awk -v d="$_d" -v s="$_lim" 'BEGIN { exit !(d < s) }' ||
			bad "$_c: rank $_r exited $_d s after the cut (at most $_lim)"
		eval "_m=\$_m$_r"
		grep -qE "$_m" "$tmp/$_c-r$_r.log" ||
			{ bad "$_c: rank $_r did not say '$_m'"; grep -i "error\|fatal" "$tmp/$_c-r$_r.log" | tail -3; }
		grep -i "error\|fatal" "$tmp/$_c-r$_r.log" | tail -1 | cut -c1-400
	done
	net_down
}

[ -n "${ONLY:-}" ] && [ "$ONLY" != timeout ] || case_ timeout 0A 20 \
	"rank 0 of 2: connecting the TCP mesh: rank 1 \(host kiln-h1\) did not (post its pairs. addresses|connect) within \[dist\] timeout = 6.0 s" \
	"rank 1 of 2: connecting the TCP mesh: store 10.77.0.1:29611: no answer" \
	dist.timeout=6 dist.heartbeat=0
[ -n "${ONLY:-}" ] && [ "$ONLY" != connect ] || case_ connect 02,03 20 \
	"rank 0 of 2: connecting the TCP mesh: rank 1 \(host kiln-h1\) did not connect within \[dist\] timeout = 6.0 s" \
	"rank 1 of 2: connecting the TCP mesh: rank 0 \(host kiln-h0\) did not connect within \[dist\] timeout = 6.0 s" \
	dist.timeout=6 dist.heartbeat=0
[ -n "${ONLY:-}" ] && [ "$ONLY" != heartbeat ] || case_ heartbeat 0A 13 \
	"watchdog: rank 1 \(host kiln-h1\) sent no heartbeat" \
	"watchdog: the store on rank 0 \(host kiln-h0" \
	dist.timeout=60 dist.heartbeat=4
exit $fail
