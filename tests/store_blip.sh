#!/bin/sh
# tests/store_blip.sh - a live rank's link blips while it waits at the
# rendezvous (session 33; docs/distributed.md, "A live rank whose link
# blips at the rendezvous joins again"), three hosts in network namespaces
# (tests/netns_lib.sh), Gloo, the MLP of the dist tests, [dist] timeout =
# 20 s (the store's dead_after: 5 s):
#   rank 0 on host 0 and rank 1 on host 1 wait for rank 2; host 1's link
#   goes down (`ip link set eth0 down`, rank 1 alive) until the store has
#   released rank 1's claim (keepalive, about 5 s), stays down 2 s more,
#   and comes back; rank 1 notices its connection was dropped, connects
#   again and claims rank 1 again ("[dist] rank 1 of 3: ... joining again"),
#   rank 2 starts on host 2, and all three train to the end, exit 0.
#   Before, rank 1 failed ("connection lost") or waited on a connection
#   the store had closed, and ranks 0 and 2 timed out: "rank 1 never
#   arrived".
# Skips (77) without root or where `ip netns add` is not permitted.
name=store_blip needs=gloo
. "$(dirname "$0")/dist_common.sh"

ns=kb$$ rank_timeout=20
. "$srcdir/tests/store_ns_lib.sh"

net_up 3
rank r0 0 0; p0=$rank_pid
rank r1 1 1; p1=$rank_pid
claimed 1
# host 1's link goes down, rank 1 alive
ip -n "$ns-h1" link set eth0 down
released 1 150
echo "host 1's link down: kiln/joined/1 is '$(key kiln/joined/1)' after $d s"
[ "$(key kiln/joined/1)" = "(absent)" ] || bad "the claim of rank 1, whose link is down, was not released within 15 s"
sleep 2
ip -n "$ns-h1" link set eth0 up
echo "host 1's link up after $(echo "$(now) $t0" | awk '{ printf "%.1f", $1 - $2 }') s"
rank r2 2 2; p2=$rank_pid
for r in 0 1 2; do
	eval "wait \$p$r"
	rc=$?
	[ $rc = 0 ] || { bad "rank $r exited $rc"; grep "error" "$tmp/r$r.log" | tail -3; }
done
grep -q "rank 1 left before every rank had joined: its claim is released" "$tmp/r0.log" ||
	bad "rank 0 did not log the released claim"
grep -q "rank 1 of 3: the connection to the rendezvous store .* joining again" "$tmp/r1.log" ||
	{ bad "rank 1 did not say it joined again"; grep "dist\|store" "$tmp/r1.log" | tail -3; }
exit $fail
