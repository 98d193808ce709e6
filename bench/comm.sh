#!/bin/sh
# bench/comm.sh [NPROC] [MAX_BYTES] [RUNS] [kiln bench comm options...] -
# allreduce latency and bus bandwidth (busbw = algbw x 2(n-1)/n) of every
# available kiln communicator beside the raw libraries (bench/mpi_raw,
# bench/gloo_raw) and torch.distributed's gloo: `kiln bench comm`
# (cli/cmd_bench_comm.c), which holds the rank code and the driver.  From
# the build directory:
#   sh bench/comm.sh 2
#   sh bench/comm.sh 2 67108864 7 --tools kiln-mpi,raw-mpi
set -u
b=$(cd "$(dirname "$0")/.." && pwd)
np=${1:-2} max=${2:-268435456} runs=${3:-1}
[ $# -gt 3 ] && shift 3 || shift $#
exec "$b/kiln" bench comm --nproc "$np" --max "$max" --runs "$runs" "$@"
