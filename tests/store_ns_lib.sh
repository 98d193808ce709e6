# tests/store_ns_lib.sh - what tests/store_netns.sh and tests/store_blip.sh
# share, sourced after dist_common.sh with $ns (the namespaces' prefix) and
# $rank_timeout (the ranks' [dist] timeout) set: the skips (77) without
# root, iproute2, unshare, python3 or permission for `ip netns add`; the
# three hosts of tests/netns_lib.sh; the MLP of the dist tests; and
#   now          the time in seconds
#   key KEY      the store's value of KEY, asked from host 0
#   rank NAME H R  rank R of 3 on host H (host name kiln-hH) in the
#                background ($rank_pid), 4 steps
#   claimed R    until the store holds rank R's claim (kiln/joined/R), at
#                most 30 s, else the test fails
#   released R TENTHS
#                until the store holds it no more, at most TENTHS tenths of
#                a second (the caller checks): $t0, now at the start, and
#                $d, the seconds it took (one decimal)
[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null && command -v unshare > /dev/null || { echo "SKIP: no iproute2 or unshare"; exit 77; }
need_python3
ip netns add "$ns-probe" 2> /dev/null || { echo "SKIP: ip netns add is not permitted here"; exit 77; }
ip netns del "$ns-probe"
. "$srcdir/tests/netns_lib.sh"
trap 'net_down; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}"
client="$srcdir/tests/store_client.py"
ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo

now() { date +%s.%N; }
key() { ip netns exec "$ns-h0" timeout 20 "$py" "$client" check 10.77.0.1 29611 "$1" 2> /dev/null || echo "(no store)"; }
rank() {
	ip netns exec "$ns-h$2" unshare --uts sh -c 'hostname "$0" && exec "$@"' "kiln-h$2" \
		env KILN_RANK="$3" KILN_WORLD_SIZE=3 KILN_MASTER_ADDR=10.77.0.1 KILN_MASTER_PORT=29611 \
		timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/$1" train.max_steps=4 \
		plugin.gloo.iface=eth0 dist.timeout="$rank_timeout" > "$tmp/$1.log" 2>&1 &
	rank_pid=$!
}
claimed() {
	_ci=0
	while [ "$(key kiln/joined/$1)" = "(absent)" ] || [ "$(key kiln/joined/$1)" = "(no store)" ]; do
		_ci=$((_ci + 1))
		[ $_ci -le 300 ] || { bad "rank $1 did not reach the rendezvous"; exit 1; }
		sleep 0.1
	done
}
released() {
	t0=$(now)
	_ri=0
	while [ "$(key kiln/joined/$1)" != "(absent)" ] && [ $_ri -lt "$2" ]; do sleep 0.1; _ri=$((_ri + 1)); done
	d=$(echo "$(now) $t0" | awk '{ printf "%.1f", $1 - $2 }')
}
