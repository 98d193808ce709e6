# tests/netns_lib.sh - network namespaces as the hosts of a multi-node run,
# for tests/dist_netns.sh and bench/hier_netns.sh; sourced (not run) by a
# root shell after setting
#   ns     the namespaces' prefix, unique to the script (e.g. kn$$)
#   tmp    a scratch directory;  kiln: the CLI;  srcdir: the source tree
#   ini    the config `node` trains;  bad MESSAGE: how a failure is told
#   py     for net_up SLOW: the python3 that runs tests/netns_wire.py
#          (tests/lib.sh's need_python3 sets it)
# and gives:
#   net_up N [SLOW [MS]]  hosts $ns-h0 .. h(N-1), each with 10.77.0.(h+1)/24
#                         on its eth0, joined by the bridge of $ns-sw by veth
#                         pairs; host SLOW's cable is tests/netns_wire.py,
#                         delaying every frame MS ms (default 20) each way
#   net_down              end every process in those namespaces (ours) and
#                         the wire, delete the namespaces
#   node NAME H NPROC NNODES BATCH [overrides...]
#                         host H's `kiln launch -n NPROC --nnodes NNODES
#                         --node-rank H --master 10.77.0.1:29611` of
#                         `kiln train $ini` in the background ($node_pid),
#                         host name kiln-hH (a UTS namespace), Gloo on eth0,
#                         output in $tmp/NAME-hH.log, out_dir $tmp/NAME-hH
#   job NAME HOSTS NPROC BATCH [overrides...]
#                         `node` on every host, waited for; each must exit 0
#   mpi_job NAME HOSTS PER BATCH [overrides...]
#                         `mpirun` on host 0 starting PER ranks of `kiln
#                         train $ini` (comm mpi) on each host through
#                         tests/netns_rsh.sh, Open MPI's TCP on eth0; must
#                         exit 0; output $tmp/NAME.log, out_dir $tmp/NAME
wire=

net_down() {
	for n in $(ip netns list | sed -n "s/^\($ns-[a-z0-9]*\).*/\1/p"); do
		for p in $(ip netns pids "$n"); do kill -9 "$p" 2> /dev/null; done
		ip netns del "$n"
	done
	[ -z "$wire" ] || { kill "$wire" 2> /dev/null; wait "$wire" 2> /dev/null; }
	wire=
}

# wire_ready H: the wire of host H said so and both its ends are there
wire_ready() {
	grep -qs ready "$tmp/wire.out" && ip -n "$ns-sw" link show "p$1" > /dev/null 2>&1 &&
		ip -n "$ns-h$1" link show eth0 > /dev/null 2>&1
}

net_up() {
	net_down
	ip netns add "$ns-sw"
	ip -n "$ns-sw" link add br0 type bridge
	ip -n "$ns-sw" link set br0 up
	h=0
	while [ $h -lt "$1" ]; do
		ip netns add "$ns-h$h"
		ip -n "$ns-h$h" link set lo up
		if [ "$h" = "${2:-}" ]; then
			# (its own output file, gone first: a net_up after another's
			# read the last wire's "ready" before the new process, late
			# on a loaded machine, truncated the file, and went on with
			# its devices not made yet: "Cannot find device p1", session
			# 47; and its devices must be there too)
			: "${py:?net_up SLOW: no \$py (tests/lib.sh need_python3)}"
			rm -f "$tmp/wire.out"
			"$py" "$srcdir/tests/netns_wire.py" "$ns-h$h" eth0 "$ns-sw" "p$h" "${3:-20}" \
				> "$tmp/wire.out" 2>&1 &
			wire=$!
			# (up to 30 s: python3 starting on a loaded machine took over 5)
			for _ in $(seq 300); do
				wire_ready "$h" && break
				kill -0 "$wire" 2> /dev/null || break
				sleep 0.1
			done
			wire_ready "$h" || { bad "the delaying wire did not start"; cat "$tmp/wire.out"; }
		else
			ip -n "$ns-sw" link add "p$h" type veth peer name eth0 netns "$ns-h$h"
		fi
		ip -n "$ns-sw" link set "p$h" master br0 up
		ip -n "$ns-h$h" addr add "10.77.0.$((h + 1))/24" dev eth0
		ip -n "$ns-h$h" link set eth0 up
		h=$((h + 1))
	done
}

node() {
	_name=$1 _h=$2 _n=$3 _nn=$4 _b=$5
	shift 5
	ip netns exec "$ns-h$_h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "kiln-h$_h" \
		timeout 120 "$kiln" launch -n "$_n" --nnodes "$_nn" --node-rank "$_h" \
		--master 10.77.0.1:29611 --grace 2 -- "$kiln" train "$ini" \
		run.out_dir="$tmp/$_name-h$_h" train.batch="$_b" plugin.gloo.iface=eth0 "$@" \
		> "$tmp/$_name-h$_h.log" 2>&1 &
	node_pid=$!
}

# job NAME HOSTS NPROC BATCH [overrides...]: every host's launcher, waited
# for; each must exit 0
job() {
	_jn=$1 _hosts=$2 _np=$3 _jb=$4
	shift 4
	_pids= _h=0
	while [ $_h -lt "$_hosts" ]; do
		node "$_jn" $_h "$_np" "$_hosts" "$_jb" "$@"
		_pids="$_pids $node_pid"
		_h=$((_h + 1))
	done
	_h=0
	for p in $_pids; do
		wait "$p" || { bad "$_jn: host $_h exited $?"; tail -5 "$tmp/$_jn-h$_h.log"; }
		_h=$((_h + 1))
	done
}

mpi_job() {
	_mn=$1 _mh=$2 _mp=$3 _mb=$4
	shift 4
	_list= _h=0
	while [ $_h -lt "$_mh" ]; do
		_list="$_list${_list:+,}kiln-h$_h:$_mp"
		_h=$((_h + 1))
	done
	KILN_NS=$ns ip netns exec "$ns-h0" unshare --uts sh -c 'hostname kiln-h0 && exec "$@"' x \
		timeout 120 mpirun --allow-run-as-root --oversubscribe \
		--mca plm_rsh_agent "sh $srcdir/tests/netns_rsh.sh" --mca btl_tcp_if_include eth0 \
		--mca oob_tcp_if_include eth0 --host "$_list" -np $((_mh * _mp)) \
		-x KILN_MASTER_ADDR=10.77.0.1 -x KILN_MASTER_PORT=29611 \
		"$kiln" train "$ini" run.comm=mpi run.out_dir="$tmp/$_mn" train.batch="$_mb" "$@" \
		> "$tmp/$_mn.log" 2>&1 || { bad "$_mn: mpirun exited $?"; tail -5 "$tmp/$_mn.log"; }
}
