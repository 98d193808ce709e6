#!/bin/sh
# tests/dist_netns.sh - multi-node data-parallel training across real
# network hosts: network namespaces (iproute2) joined through a bridge by
# veth pairs, each host with its own host name (a UTS namespace), its own
# `kiln launch --nnodes N --node-rank R --master 10.77.0.1:PORT` and
# Gloo's pairs on its eth0 ([plugin.gloo] iface).  Ranks on one host share
# memory; across hosts they talk TCP.  The MLP of tests/dist_common.sh.
# Asserts:
#  1. 2 hosts x 2 ranks and 4 hosts x 1 rank end with the parameters and
#     momentum of one process on the same global batch (1e-5); the ranks
#     saw several nodes (their comm line says so); 2 x 2 runs the
#     hierarchical allreduce (shared memory within a host, Gloo between
#     hosts) and, with [plugin.gloo] hierarchical = 0, the flat one: both
#     equal one process; so do 2 x 2 and 4 x 1 ranks of mpi under `mpirun`
#     (tests/netns_rsh.sh enters the hosts; skipped without mpirun);
#     without [plugin.gloo] iface, 2 hosts train (Gloo's pairs on the
#     address the store connection leaves from, not 127.0.0.1);
#  1c. a master address that drops SYNs: the rank exits within [dist]
#     timeout naming it;
#  2. with host 1's link through a wire that delays every frame by 20 ms
#     each way (tests/netns_wire.py: no netem here), 2 hosts end equal to
#     one process too, the wire's round trip measured > 40 ms;
#  3. host 1's link cut (`ip link set eth0 down`) mid-run: every rank
#     exits non-zero within [dist] timeout, rank 0 naming host 1's rank and
#     host, rank 1 naming the store's host (kiln-h0);
#  4. rank 1 frozen with SIGSTOP: rank 0 names it and its host within
#     [dist] heartbeat (plus a beat); thawed, rank 1 finds rank 0 gone and
#     exits non-zero too;
#  5. host 1 killed (every process in its namespace, SIGKILL): rank 0 exits
#     non-zero within [dist] timeout naming rank 1 and host kiln-h1;
#  6. 4 hosts x 1 rank, [dist] timeout (8 s) below [dist] heartbeat (12 s),
#     host 3's link cut: ranks 0, 1 and 2 exit non-zero naming rank 3 and
#     kiln-h3 as the rank whose heartbeat stopped, and none names a healthy
#     rank (before session 32 each named only the address of the peer
#     Gloo's halving-doubling waited for: rank 0 rank 2's, 10.77.0.3).
# Skips (77) without root or where `ip netns add` is not permitted.
name=dist_netns needs=gloo
. "$(dirname "$0")/dist_common.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null && command -v unshare > /dev/null || { echo "SKIP: no iproute2 or unshare"; exit 77; }
need_python3 "for tests/netns_wire.py"
ns=kn$$
ip netns add "$ns-probe" 2> /dev/null || { echo "SKIP: ip netns add is not permitted here"; exit 77; }
ip netns del "$ns-probe"
. "$srcdir/tests/netns_lib.sh"
trap 'net_down; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

close() {
	"$tool" close "$1" "$2" 1e-5 params optim.momentum || bad "$3: parameters differ"
}

now() { date +%s.%N; }
# within T0 SECONDS WHAT: fail unless now - T0 < SECONDS
within() {
	_d=$(echo "$(now) $1" | awk '{ printf "%.1f", $1 - $2 }')
	echo "$3: $_d s"
	awk -v d="$_d" -v s="$2" 'BEGIN { exit !(d < s) }' || bad "$3 took $_d s (at most $2)"
}

# steps NAME H: how many train lines host H's rank 0 logged so far
steps() { cat "$tmp/$1-h$2/metrics.jsonl" 2> /dev/null | grep -c '"event":"train"'; }
wait_steps() {
	for _ in $(seq 1200); do [ "$(steps "$1" 0)" -ge "$2" ] && return 0; sleep 0.1; done
	bad "$1: fewer than $2 steps logged"; return 1
}

# the rank's pid: the launcher's child whose environment says KILN_RANK=R
rank_pid() {
	_l=$(ps -o pid= --ppid "$1" | head -1)
	for c in $(ps -o pid= --ppid $_l); do
		tr '\0' '\n' < "/proc/$c/environ" 2> /dev/null | grep -qx "KILN_RANK=$2" && { echo "$c"; return; }
	done
}

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo

# ---- 1. 2 hosts x 2 ranks, 4 hosts x 1 rank: equal to one process -----
run one 0 64
run one32 0 64 train.epochs=1
net_up 4
job four1 4 1 16
close "$(ck one 64)" "$(ck four1-h0 64)" "4 hosts x 1 rank vs 1 process"
grep -q "rank 3 on 'kiln-h3'\|span several nodes" "$tmp/four1-h0.log" || bad "4 hosts: rank 0 did not see several nodes"
net_up 2
job two2 2 2 16
close "$(ck one 64)" "$(ck two2-h0 64)" "2 hosts x 2 ranks vs 1 process"
[ "$(grep -c "hierarchical allreduce: kiln's shared memory within node [01] of 2 (2 ranks)" "$tmp/two2-h0.log" "$tmp/two2-h1.log" | awk -F: '{ n += $2 } END { print n }')" = 4 ] ||
	bad "2 hosts x 2: not every rank runs the hierarchical allreduce"
[ ! -d "$tmp/two2-h1/checkpoints" ] || bad "host 1 (ranks 2, 3) wrote checkpoints"
job flat2 2 2 16 plugin.gloo.hierarchical=0
close "$(ck one 64)" "$(ck flat2-h0 64)" "2 hosts x 2 ranks, flat allreduce, vs 1 process"
! grep -q "hierarchical allreduce:" "$tmp/flat2-h0.log" || bad "hierarchical = 0: the comm line names the hierarchical allreduce"
# neither [plugin.gloo] iface nor hostname: the pairs listen on the
# address each rank's store connection leaves from (127.0.0.1 until
# session 31: the ranks retried their connects for minutes)
job noif 2 1 16 train.epochs=1 plugin.gloo.iface=
grep -q "addr=\[10.77.0.2\]" "$tmp/noif-h1.log" || bad "no iface: host 1's pairs not on 10.77.0.2"

# ---- 1c. a master address that drops SYNs -----------------------------
# 10.88.0.1 routed via host 0, which does not forward (a host behind a
# router that is down): rank 1 ends within [dist] timeout = 5 s naming the
# address and its error (connect() waited ~130 s of SYN retries before
# session 31)
ip -n "$ns-h1" route add 10.88.0.0/24 via 10.77.0.1
t0=$(now)
ip netns exec "$ns-h1" env KILN_RANK=1 KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=10.88.0.1 KILN_MASTER_PORT=29611 \
	timeout 60 "$kiln" train "$ini" run.out_dir="$tmp/bh" dist.timeout=5 > "$tmp/bh.log" 2>&1
rc=$?
within "$t0" 7 "a master address that drops SYNs, [dist] timeout = 5 s"
[ $rc = 1 ] || bad "a master address that drops SYNs: exit $rc"
grep -q "cannot reach the rendezvous store at 10.88.0.1:29611 within 5.0 s (10.88.0.1:29611: Connection timed out)" "$tmp/bh.log" ||
	{ bad "a master address that drops SYNs: not named"; tail -2 "$tmp/bh.log"; }

# ---- 1b. mpi: mpirun on host 0, its rsh agent entering the others -------
if command -v mpirun > /dev/null && [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ]; then
	net_up 2
	# 8 steps: Open MPI's TCP progress is slow on 4 ranks sharing 2 cores
	run one8 0 64 train.epochs=1 data.limit=512
	mpi_job mpi2 2 2 16 train.epochs=1 data.limit=512
	close "$(ck one8 8)" "$(ck mpi2 8)" "mpi, 2 hosts x 2 ranks vs 1 process"
	[ "$(grep -c "of 4 (local [01]; from Open MPI), comm mpi: .*the ranks span several nodes" "$tmp/mpi2.log")" = 4 ] ||
		bad "mpi, 2 hosts x 2: the ranks did not see several nodes"
	net_up 4
	mpi_job mpi4 4 1 16 train.epochs=1 data.limit=512
	close "$(ck one8 8)" "$(ck mpi4 8)" "mpi, 4 hosts x 1 rank vs 1 process"
else
	echo "mpi: skipped (no mpirun or no kiln-mpi)"
fi

# ---- 2. 20 ms each way on host 1's link ---------------------------------
net_up 2 1
# the round trip: a TCP connect to a closed port (SYN, then RST: one round
# trip), the median of 5 after one that resolves the address (no ping here)
rtt=$(ip netns exec "$ns-h0" "$py" -c '
import socket, time
ts = []
for i in range(6):
    t = time.monotonic()
    try:
        socket.create_connection(("10.77.0.2", 9), timeout=3).close()
    except OSError:
        pass
    ts.append((time.monotonic() - t) * 1000)
print("%.1f" % sorted(ts[1:])[2])')
echo "round trip across the wire: $rtt ms"
awk -v r="${rtt:-0}" 'BEGIN { exit !(r > 40) }' || bad "the wire's round trip is $rtt ms (more than 40 expected)"
job slow 2 1 32 train.epochs=1 dist.bucket_mb=25
close "$(ck one32 32)" "$(ck slow-h0 32)" "2 hosts, 20 ms each way, vs 1 process"

# the faults: 2 hosts x 1 rank, a long run, heartbeat 2 s, timeout 8 s
fault_opts="train.epochs=500 train.log_every=1 dist.heartbeat=2 dist.timeout=8"

# ---- 3. a cut link -------------------------------------------------------
net_up 2
node cut 0 1 2 32 $fault_opts; p0=$node_pid
node cut 1 1 2 32 $fault_opts; p1=$node_pid
if wait_steps cut 3; then
	ip -n "$ns-h1" link set eth0 down
	t0=$(now)
	wait $p0 && bad "host 0 exited 0 after the cut"
	wait $p1 && bad "host 1 exited 0 after the cut"
	within "$t0" 8 "the cut link: both hosts exited"
	grep -q "rank 1 (host kiln-h1)" "$tmp/cut-h0.log" || { bad "rank 0 does not name rank 1 on kiln-h1"; tail -3 "$tmp/cut-h0.log"; }
	grep -q "rank 0 (host kiln-h0" "$tmp/cut-h1.log" || { bad "rank 1 does not name rank 0's host kiln-h0"; tail -3 "$tmp/cut-h1.log"; }
fi

# ---- 4. a frozen rank ----------------------------------------------------
net_up 2
node stop 0 1 2 32 $fault_opts; p0=$node_pid
node stop 1 1 2 32 $fault_opts; p1=$node_pid
if wait_steps stop 3; then
	r1=$(rank_pid "$p1" 1)
	kill -STOP "$r1"
	t0=$(now)
	wait $p0 && bad "host 0 exited 0 with rank 1 stopped"
	within "$t0" 3.5 "rank 1 stopped: rank 0 exited"
	grep -q "watchdog: rank 1 (host kiln-h1) sent no heartbeat" "$tmp/stop-h0.log" ||
		{ bad "rank 0 does not name the stopped rank"; tail -3 "$tmp/stop-h0.log"; }
	kill -CONT "$r1"
	wait $p1 && bad "host 1 exited 0 after thawing without rank 0"
	grep -q "rank 1 of 2: watchdog: the store on rank 0 (host kiln-h0" "$tmp/stop-h1.log" ||
		{ bad "thawed rank 1 does not name rank 0"; tail -3 "$tmp/stop-h1.log"; }
fi

# ---- 5. a host killed ----------------------------------------------------
net_up 2
node dead 0 1 2 32 $fault_opts; p0=$node_pid
node dead 1 1 2 32 $fault_opts; p1=$node_pid
if wait_steps dead 3; then
	for p in $(ip netns pids "$ns-h1"); do kill -9 "$p"; done
	t0=$(now)
	wait $p0 && bad "host 0 exited 0 after host 1 died"
	within "$t0" 8 "host 1 killed: rank 0 exited"
	grep -q "rank 1 .*kiln-h1" "$tmp/dead-h0.log" || { bad "rank 0 does not name rank 1 on kiln-h1"; tail -3 "$tmp/dead-h0.log"; }
	wait $p1 2> /dev/null
fi

# ---- 6. a cut host behind a healthy one: who stopped ----------------------
net_up 4
for h in 0 1 2 3; do
	node behind "$h" 1 4 32 train.epochs=500 train.log_every=1 dist.heartbeat=12 dist.timeout=8
	eval "q$h=\$node_pid"
done
if wait_steps behind 3; then
	ip -n "$ns-h3" link set eth0 down
	for h in 0 1 2; do
		eval "wait \$q$h" && bad "host $h exited 0 after host 3's cut"
		e=$(grep "kiln: error: rank $h of 4" "$tmp/behind-h$h.log")
		# (rank 0, done first, exits and its store goes with it: a later
		# rank's watchdog may say so, true once rank 0 named rank 3)
		if [ "$h" != 0 ] && echo "$e" | grep -q "rank $h of 4: watchdog: the store on rank 0 (host kiln-h0"; then
			echo "host $h: ended by its watchdog after rank 0 (and its store) ended"
			continue
		fi
		# (the watchdog, at [dist] heartbeat, may come first, naming it too)
		echo "$e" | grep -q "rank 3 (host kiln-h3) sent no heartbeat" ||
			{ bad "rank $h does not name rank 3 on kiln-h3, cut off"; echo "$e" | tail -2; }
		echo "$e" | grep -q "rank [012] (host kiln-h" && bad "rank $h names a healthy rank: $e"
	done
	wait $q3 2> /dev/null
fi
exit $fail
