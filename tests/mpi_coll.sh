#!/bin/sh
# tests/mpi_coll.sh - tests/mpi_coll (the MPI communicator's collectives,
# element by element) under mpirun: 2 ranks with kiln's shared-memory
# collectives on (bit for bit against the sum in rank order; with and
# without the shared buffer of alloc_shared) and off (Open MPI's, to a few
# ulps), on an async stream (a stream worker runs the
# collectives) and a synchronous one (inline); 3 ranks; 4 ranks on 2 cores
# (oversubscribed: the shared-memory waits yield) with wait = yield and
# sleep; a rank waiting 0.5 s for its peer in a recv, a sendrecv and a
# broadcast on a stream worker (wait = yield, sleep; the recv and the
# sendrecv under the default wait too) on at most 30 ms of CPU time
# (tests/mpi_coll --wait, --wait-p2p); a stream failed with the job pool
# full: the wait for a slot ends at once and the slots come back
# (tests/mpi_coll --pool); `kiln bench comm --tools kiln-mpi` as a user
# runs it (no store secret in the environment: the driver makes one)
# measures both sizes (exit 0), and one made to fail (a short store token)
# shows the ranks' error and exits 1, naming the tool that has no figures.  Every run is under `timeout`.
set -u
: "${top_builddir:=.}"
: "${abs_top_builddir:=$(cd "$top_builddir" && pwd)}"
[ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] || { echo "SKIP: the mpi plugin is not built"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
prog="$abs_top_builddir/tests/mpi_coll"
fail=0
run() {
	np=$1
	shift
	echo "== $np ranks: $*"
	timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$np" "$prog" "$@" 2>&1 ||
		{ echo "FAIL: $np ranks, $*: exit $?"; fail=1; }
}
run 2 plugin.cpu.async=1
run 2 plugin.cpu.async=1 plugin.mpi.zero_copy=0
run 2 plugin.cpu.async=1 plugin.mpi.shm=0
run 2 plugin.cpu.async=0
run 3 plugin.cpu.async=1
run 3 plugin.cpu.async=1 plugin.mpi.shm=0
run 4 plugin.cpu.async=1 plugin.mpi.wait=yield
run 4 plugin.cpu.async=0 plugin.mpi.wait=sleep plugin.mpi.spin_us=0
# waits that sleep rather than test or yield for ever
run 2 --wait plugin.cpu.async=1 plugin.mpi.wait=yield
run 2 --wait plugin.cpu.async=1 plugin.mpi.wait=sleep
# point to point under the default wait (auto = block) too
run 2 --wait-p2p plugin.cpu.async=1
# a stream that fails with the job pool full: the wait for a slot ends at
# once, and the skipped jobs' slots come back (session 47)
run 2 --pool plugin.cpu.async=1
run 2 --pool plugin.cpu.async=1 plugin.mpi.shm=0
# the description says which path ran
timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$prog" 2>&1 |
	grep -q "kiln's shared-memory allreduce, reduce_scatter and allgather" ||
	{ echo "FAIL: shm = 1 (the default) is not described as kiln's shared memory"; fail=1; }
timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$prog" plugin.mpi.shm=0 2>&1 |
	grep -q "MPI's collectives (kiln's shared memory off: \[plugin.mpi\] shm = 0)" ||
	{ echo "FAIL: shm = 0 is not described as MPI's collectives"; fail=1; }
# zero_copy: alloc_shared gives memory by default, says no with 0 or shm = 0
out=$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$prog" 2>&1)
echo "$out" | grep -q "alloc_shared: given" || { echo "FAIL: alloc_shared gave no memory by default"; fail=1; }
# every allreduce of a slice of it (3 dtypes x 8 counts x sum, avg) took
# the copy-free path
echo "$out" | grep -q "rank 0 of 2: 48 allreduces of the shared gradients, copy-free" ||
	{ echo "FAIL: the slices of the shared buffer did not take the copy-free path"; echo "$out" | grep copy-free; fail=1; }
timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$prog" plugin.mpi.zero_copy=0 2>&1 |
	grep -q "alloc_shared: mpi: \[plugin.mpi\] zero_copy = 0" ||
	{ echo "FAIL: alloc_shared with zero_copy = 0 did not say KILN_ENOTSUP"; fail=1; }
# kiln bench comm's kiln-mpi: its ranks under mpirun meet at the store
bc=$(env -u KILN_STORE_TOKEN -u KILN_STORE_TOKEN_FILE timeout 120 \
	"$abs_top_builddir/kiln" bench comm --tools kiln-mpi --max 16384 --runs 1 2>&1)
bc_rc=$?
echo "$bc"
rows=$(echo "$bc" | awk '($1 == 4096 || $1 == 16384) && $2 + 0 > 0 && $3 == "/" && $4 + 0 > 0 { n++ } END { print n + 0 }')
[ "$rows" = 2 ] && ! echo "$bc" | grep -q "kiln-mpi: left out" ||
	{ echo "FAIL: kiln bench comm --tools kiln-mpi measured $rows of 2 sizes"; fail=1; }
[ "$bc_rc" = 0 ] || { echo "FAIL: kiln bench comm --tools kiln-mpi exited $bc_rc, not 0"; fail=1; }
# a failed run shows its ranks' last stderr lines (a store token too short:
# every rank refuses it)
bf=$(KILN_STORE_TOKEN=short timeout 60 "$abs_top_builddir/kiln" bench comm --tools kiln-mpi \
	--max 4096 --runs 1 2>&1 > /dev/null)
bf_rc=$?
[ "$bf_rc" = 1 ] || { echo "FAIL: kiln bench comm with its only tool failed exited $bf_rc, not 1"; fail=1; }
echo "$bf" | grep -q "kiln bench comm: error: kiln-mpi produced no figures (run 1 failed" ||
	{ echo "FAIL: kiln bench comm did not say kiln-mpi produced no figures"; echo "$bf"; fail=1; }
echo "$bf" | grep -q "kiln-mpi: run 1 failed or printed too little; the last lines its ranks wrote" &&
	echo "$bf" | grep -q "the store token has 5 characters" ||
	{ echo "FAIL: a failed kiln bench comm run did not show its ranks' error"; echo "$bf"; fail=1; }
exit $fail
