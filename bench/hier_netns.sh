#!/bin/sh
# bench/hier_netns.sh [--runs N] [--hosts H] [--nproc P] [--steps S] [--delay MS]
#
# The hierarchical allreduce of kiln-gloo ([plugin.gloo] hierarchical = 1:
# kiln's shared memory within a host, Gloo between the hosts' first ranks)
# against the flat one (= 0: Gloo's allreduce over every rank), on H
# network-namespace hosts (default 2) of P ranks each (default 2) joined by
# veth pairs through a bridge (tests/netns_lib.sh), each its own host name.
# With --delay MS host 1's cable is tests/netns_wire.py adding MS ms each
# way (a slow link; the wire's Python copying also caps its bandwidth).
# The model: an MLP 784-1024-1024-10 (1.86 M gradient floats, 7.1 MiB) in
# 1 MiB buckets, Fashion-MNIST, 1 thread per rank, per-rank batch 64, one
# epoch of 64 x P x H x S samples (S steps, default 16), [dist] timing = 1.  Each
# variant runs N times (default 3), interleaved; the table gives medians of
# rank 0's allreduce ms per step ([dist] timing's comm event; overlap off,
# so every bucket runs after backward: the collective's own time) and of the
# step (rank 0's wall_s of the run's summary / S).
# Root only.  From the build directory:
#   sudo sh bench/hier_netns.sh --runs 5
set -u
# every node of a multi-node launch presents the same store secret
: "${KILN_STORE_TOKEN:=$(od -An -tx1 -N32 /dev/urandom | tr -d " \n")}"
export KILN_STORE_TOKEN
runs=3 hosts=2 nproc=2 delay= steps=16
while [ $# -gt 0 ]; do
	case $1 in
	--runs) runs=$2; shift 2 ;;
	--hosts) hosts=$2; shift 2 ;;
	--nproc) nproc=$2; shift 2 ;;
	--delay) delay=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	*) echo "usage: $0 [--runs N] [--hosts H] [--nproc P] [--steps S] [--delay MS]" >&2; exit 2 ;;
	esac
done
b=$(cd "$(dirname "$0")/.." && pwd)
kiln="$b/kiln"
srcdir=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "bench/hier_netns.sh: needs root (ip netns)" >&2; exit 1; }
# --delay's wire (tests/netns_lib.sh's $py, as tests/lib.sh's need_python3 sets it)
py=/usr/bin/python3
[ -z "$delay" ] || [ -x "$py" ] || { echo "bench/hier_netns.sh: --delay needs $py" >&2; exit 1; }
tmp=$(mktemp -d /tmp/kiln-hier.XXXXXX)
ns=kh$$
bad() { echo "bench/hier_netns.sh: $*" >&2; failed=1; }
failed=0
. "$srcdir/tests/netns_lib.sh"
trap 'net_down; rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$tmp/cache}" # not the user's (bench/common.sh)

world=$((hosts * nproc))
ini="$tmp/mlp.ini"
cat > "$ini" <<INI
[run]
seed = 1
threads = 1
comm = gloo
[data]
source = idx
limit = $((64 * world * steps))
mean = 0.286
std = 0.353
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 1024
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 1024
[layer.r2]
type = relu
[layer.fc3]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 1
batch = 64
lr = 0.01
log_every = 4
eval = 0
checkpoint_every = 0
checkpoint_last = 0
[plugin.cpu]
async = 1
[dist]
bucket_mb = 1
timing = 1
overlap = 0
timeout = 60
INI
net_up "$hosts" ${delay:+1 $delay}
echo "load: $(cat /proc/loadavg)"
echo "$hosts hosts x $nproc ranks, MLP 784-1024-1024-10, per-rank batch 64, $steps steps${delay:+, host 1's link +$delay ms each way}"
for r in $(seq "$runs"); do
	for v in hier flat; do
		h=1
		[ $v = flat ] && h=0
		job "$v$r" "$hosts" "$nproc" 64 plugin.gloo.hierarchical=$h
		ar=$(grep '"event":"comm"' "$tmp/$v$r-h0/metrics.jsonl" | tail -1 | sed -n 's/.*"allreduce_ms":\([0-9.e+-]*\).*/\1/p')
		wall=$(sed -n 's/.*"wall_s": \([0-9.]*\).*/\1/p' "$tmp/$v$r-h0.log" | head -1)
		step=$(awk -v s="${wall:-0}" -v n="$steps" 'BEGIN { printf "%.1f", s * 1000 / n }')
		grep -q "hierarchical allreduce" "$tmp/$v$r-h0.log" && got=hier || got=flat
		[ $got = $v ] || bad "run $r: asked for $v, the comm line says $got"
		echo "$v $ar $step" >> "$tmp/rows"
		rm -rf "$tmp/$v$r-h"*
	done
done
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
printf '| allreduce | allreduce ms/step | step ms |\n|---|---:|---:|\n'
for v in hier flat; do
	printf '| %s | %s | %s |\n' $v "$(awk -v v=$v '$1 == v { print $2 }' "$tmp/rows" | median)" \
		"$(awk -v v=$v '$1 == v { print $3 }' "$tmp/rows" | median)"
done
exit $failed
