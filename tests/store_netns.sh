#!/bin/sh
# tests/store_netns.sh - a rank's host goes down while the others wait at
# the rendezvous (session 32's review; docs/distributed.md, "A rank that
# leaves before every rank has joined gives its claim back"), three hosts
# in network namespaces (tests/netns_lib.sh), Gloo, the MLP of the dist
# tests, [dist] timeout = 30 s:
#   rank 0 on host 0 and rank 1 on host 1 wait for rank 2; host 1's link
#   is cut and its processes killed (nothing reaches rank 0: no FIN, no
#   RST); the store gives rank 1's claim back within
#   kiln_store_dead_after_ms (a quarter of the timeout: 7.5 s; TCP
#   keepalive and TCP_USER_TIMEOUT on its connection), so rank 1 started
#   again on host 2, and rank 2 there, join rank 0 and all three train to
#   the end, exit 0.  Before, the store neither set keepalive nor wrote to
#   a waiting rank: the dead connection stayed, kiln/joined/1 with it, the
#   new rank 1 was refused "rank 1 joined twice" and rank 0 timed out.
# Skips (77) without root or where `ip netns add` is not permitted.
name=store_netns needs=gloo
. "$(dirname "$0")/dist_common.sh"

ns=ks$$ rank_timeout=30
. "$srcdir/tests/store_ns_lib.sh"

net_up 3
rank r0 0 0; p0=$rank_pid
rank r1 1 1
claimed 1
# host 1 goes down
ip -n "$ns-h1" link set eth0 down
for p in $(ip netns pids "$ns-h1"); do kill -9 "$p" 2> /dev/null; done
released 1 200
echo "host 1 down: kiln/joined/1 is '$(key kiln/joined/1)' after $d s"
[ "$(key kiln/joined/1)" = "(absent)" ] || bad "the claim of rank 1, whose host went down, was not released within 20 s"
awk -v d="$d" 'BEGIN { exit !(d < 12) }' || bad "releasing the claim took $d s (7.5 s and probes expected)"
rank r1b 2 1; p1=$rank_pid
rank r2 2 2; p2=$rank_pid
for r in 0 1 2; do
	eval "wait \$p$r"
	rc=$?
	l=$tmp/r$r.log
	[ $r = 1 ] && l=$tmp/r1b.log
	[ $rc = 0 ] || { bad "rank $r exited $rc"; grep "error" "$l" | tail -3; }
done
grep -q "rank 1 left before every rank had joined: its claim is released" "$tmp/r0.log" ||
	bad "rank 0 did not log the released claim"
exit $fail
