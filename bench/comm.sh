#!/bin/sh
# bench/comm.sh [NPROC] [MAX_BYTES] - allreduce latency and bus bandwidth
# (busbw = algbw x 2(n-1)/n) of every available kiln communicator beside
# the raw library (MPI_Allreduce) and torch.distributed's gloo, one run,
# same sizes.  From the build directory: sh bench/comm.sh 2
set -u
n=${1:-2}
max=${2:-268435456}
b=$(cd "$(dirname "$0")/.." && pwd)
port=$(( 30000 + $$ % 20000 ))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -f "$b/plugins/.libs/kiln-gloo.so" ]; then
	"$b/kiln" launch -n "$n" -- "$b/bench/comm_bench" gloo "$max" > "$out/kiln-gloo" 2>/dev/null
fi
if [ -f "$b/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null; then
	mpirun --allow-run-as-root --oversubscribe -np "$n" -x KILN_MASTER_PORT=$((port + 1)) \
		"$b/bench/comm_bench" mpi "$max" > "$out/kiln-mpi" 2>/dev/null
	[ -x "$b/bench/mpi_raw" ] && mpirun --allow-run-as-root --oversubscribe -np "$n" \
		"$b/bench/mpi_raw" "$max" > "$out/raw-mpi" 2>/dev/null
fi
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
	for r in $(seq 0 $((n - 1))); do
		RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 2)) OMP_NUM_THREADS=1 \
			/usr/bin/python3 "$(cd "$(dirname "$0")" && pwd)/torch_comm.py" "$max" > "$out/torch-gloo.$r" 2>/dev/null &
	done
	wait
	mv "$out/torch-gloo.0" "$out/torch-gloo"
	rm -f "$out"/torch-gloo.[0-9]*
fi
printf "allreduce f32 sum, %d ranks on %s: time (us) / busbw (GB/s)\n" "$n" "$(hostname)"
printf "%10s" bytes
for f in kiln-gloo kiln-mpi raw-mpi torch-gloo; do [ -s "$out/$f" ] && printf " %22s" "$f"; done
echo
grep -v '^#' "$out/$(ls "$out" | head -1)" | awk '{print $1}' | while read -r bytes; do
	printf "%10s" "$bytes"
	for f in kiln-gloo kiln-mpi raw-mpi torch-gloo; do
		[ -s "$out/$f" ] || continue
		grep -v '^#' "$out/$f" | awk -v b="$bytes" '$1 == b { printf " %11.1f %10.3f", $2, $3 }'
	done
	echo
done
