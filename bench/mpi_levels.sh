#!/bin/sh
# bench/mpi_levels.sh [RUNS] [MAX_BYTES] - where kiln-mpi's small-message
# latency goes: kiln-mpi (MPI_THREAD_SERIALIZED, `kiln bench comm --rank
# mpi`) beside raw MPI initialised with MPI_Init (single) and with
# MPI_Init_thread(FUNNELED) and (SERIALIZED) (bench/mpi_raw ... LEVEL), 2 ranks,
# interleaved RUNS times (default 9); per size the median over the runs
# of each run's median latency (us).  From the build directory:
#   sh bench/mpi_levels.sh 9 65536
set -u
runs=${1:-9}
max=${2:-65536}
b=$(cd "$(dirname "$0")/.." && pwd)
root=; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$(( 30000 + $$ % 20000 ))
# the rendezvous store's secret, shared by the ranks mpirun starts
export KILN_STORE_TOKEN=${KILN_STORE_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
for r in $(seq "$runs"); do
	mpirun $root --oversubscribe -np 2 -x KILN_MASTER_PORT=$port -x OMP_NUM_THREADS=1 \
		"$b/kiln" bench comm --rank mpi "$max" 2>/dev/null | grep -v '^#' >> "$tmp/kiln"
	mpirun $root --oversubscribe -np 2 "$b/bench/mpi_raw" "$max" 2>/dev/null | grep -v '^#' >> "$tmp/single"
	for l in funneled serialized; do
		mpirun $root --oversubscribe -np 2 "$b/bench/mpi_raw" "$max" $l 2>/dev/null |
			grep -v '^#' >> "$tmp/$l"
	done
done
med() { # FILE BYTES: the median latency over the runs
	awk -v b="$2" '$1 == b { print $2 }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
echo "allreduce f32 sum, 2 ranks, median of $runs interleaved runs, latency us; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%10s %10s %14s %14s %14s\n' bytes kiln-mpi raw-single raw-funneled raw-serialized
for bytes in $(awk '{ print $1 }' "$tmp/kiln" | sort -gu); do
	printf '%10s %10s %14s %14s %14s\n' "$bytes" "$(med "$tmp/kiln" "$bytes")" "$(med "$tmp/single" "$bytes")" \
		"$(med "$tmp/funneled" "$bytes")" "$(med "$tmp/serialized" "$bytes")"
done
