#!/bin/sh
# tests/dist_blame_own.sh - a rank that survives a peer's failure does not
# take it for its own (session 40; docs/distributed.md "Failures"): it
# names the peer, and writes no "kiln-failed" line to kiln launch's pipe
# (KILN_LAUNCH_WHY_FD, cli/launch.h LAUNCH_FAILED_LINE: kiln_train_failed_own),
# nor posts itself as kiln/failed_rank.  The ranks run without kiln launch,
# their pipe a FIFO this script reads.
#  1. rank 0 out of memory for the store's answer to its AUTH or HELLO
#     (tests/shim_fault.c: its 1st or 2nd allocation of 1 byte from
#     libkiln on its main thread) connects again and trains; rank 1 killed
#     (SIGKILL) mid-run: rank 0 says rank 1 was lost, not an error of its
#     own (before, the out of memory its connect recovered from stayed set,
#     kiln_store_oom, and rank 0 told rank 1's loss as its own failure:
#     "kiln-failed 0 rank 0 of 2: gloo: ...");
#  2. rank 1 fails after the last collective (its profile report,
#     KILN_TEST_PROFILE_FAIL=1): rank 0 names it ("rank 1 failed after the
#     last collective; rank 1 said: ...") and writes no kiln-failed line,
#     rank 1 one (before, kiln_dist_explain cleared the peer's blame
#     kiln_dist_finish had set: "kiln-failed 0 rank 0 of 2: waiting for
#     every rank to finish: rank 1 failed ...");
#  3. as 2, rank 0 out of memory reading rank 1's words (kiln/failed_why:
#     its 1st allocation of their length + 1 bytes from libkiln on its main
#     thread): rank 0 names rank 1 without quoting it, not out of memory,
#     and writes no kiln-failed line (before: "out of memory" as rank 0's
#     own, kiln_dist_failed_said's read counted as its failure).
name=dist-blame-own needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
shim_build || { bad "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"; exit 1; }
{
	ini run threads=1 comm=gloo
	ini data source=synthetic image_size="1 1" classes=2 samples=64 workers=0
	ini_layers flat:flatten fc:linear:out=2 loss:softmax_xent
	ini train epochs=1 batch=4 max_steps=2
	ini dist timeout=20
} >"$tmp/s.ini"

# ranks NAME RANK0_ENV [overrides...]: ranks 0 and 1 of 2 training s.ini
# in the background (rank 0 under `env RANK0_ENV`, "-": none), each
# rank's output in $tmp/NAME.R, what both wrote to the launcher's pipe
# in $tmp/NAME.why once ranks_end has run; $pid0, $pid1: their timeouts
ranks() {
	_n=$1 _e=$2
	shift 2
	rm -f "$tmp/$_n.fifo"
	mkfifo "$tmp/$_n.fifo"
	cat "$tmp/$_n.fifo" >"$tmp/$_n.why" &
	_cat=$!
	exec 7>"$tmp/$_n.fifo"
	_port=$(free_port 0)
	[ "$_e" = - ] && _e=
	KILN_LAUNCH_WHY_FD=7 KILN_RANK=0 KILN_WORLD_SIZE=2 KILN_MASTER_PORT=$_port \
		timeout 120 env $_e "$kiln" train "$tmp/s.ini" run.out_dir="$tmp/$_n.o0" "$@" >"$tmp/$_n.0" 2>&1 &
	pid0=$!
	KILN_LAUNCH_WHY_FD=7 KILN_RANK=1 KILN_WORLD_SIZE=2 KILN_MASTER_PORT=$_port \
		timeout 120 "$kiln" train "$tmp/s.ini" run.out_dir="$tmp/$_n.o1" "$@" >"$tmp/$_n.1" 2>&1 &
	pid1=$!
	exec 7>&-
}
# ranks_end: wait for both ranks (rc0, rc1: their exits) and the pipe
ranks_end() {
	wait "$pid0"
	rc0=$?
	wait "$pid1"
	rc1=$?
	wait "$_cat"
}
# not_own NAME: rank 0 wrote no kiln-failed line
not_own() {
	! grep "^kiln-failed 0 " "$tmp/$1.why" || bad "$1: rank 0 told kiln launch the failure was its own (above)"
}
err0() { grep "^kiln: error: " "$tmp/$1.0"; }

# ---- 1. an out of memory its connect recovered from, then a peer lost ---------
n=1 good=0
while [ $n -le 4 ] && [ $good -lt 2 ]; do
	rm -f "$tmp/hit"
	ranks c$n "LD_PRELOAD=$shim SHIM_ALLOC_NTH=$n SHIM_ALLOC_BYTES=1 SHIM_ALLOC_FROM=libkiln SHIM_ALLOC_MAIN=1 SHIM_ALLOC_HIT=$tmp/hit" \
		train.epochs=100000 train.max_steps=0 train.log_every=1
	i=0
	while [ $i -lt 300 ] && ! grep -q "step " "$tmp/c$n.0" && kill -0 "$pid0" 2>/dev/null; do
		sleep 0.1
		i=$((i + 1))
	done
	rank_kill "$pid1"
	ranks_end
	# (the fault elsewhere, its connect not tried again: another case)
	if [ -e "$tmp/hit" ] && grep -q "store .*: connecting again until" "$tmp/c$n.0" &&
		grep -q "step " "$tmp/c$n.0"; then
		good=$((good + 1))
		echo "allocation $n of rank 0 failing in its connect, which connected again; rank 1 killed: rank 0 exited $rc0: $(err0 c$n | cut -c1-160)"
		[ "$rc0" != 0 ] && [ "$rc0" != 124 ] || bad "c$n: rank 0 exited $rc0 after rank 1 was killed"
		err0 c$n | grep -q "rank 0 of 2: .*rank 1 .*\(was lost\|is gone\|sent no heartbeat\)" ||
			bad "c$n: rank 0 does not name rank 1, killed: $(err0 c$n)"
		err0 c$n | grep -q "out of memory" && bad "c$n: rank 0 calls rank 1's loss its own out of memory"
		not_own c$n
	fi
	n=$((n + 1))
done
[ $good -ge 1 ] || bad "no allocation of 1 byte of rank 0's failed in its connect and was recovered from (allocations 1 to $((n - 1)))"

# ---- 2. a peer failed after the last collective ---------------------------------
KILN_TEST_PROFILE_FAIL=1
export KILN_TEST_PROFILE_FAIL
ranks late - run.profile=1
ranks_end
said="rank 1 of 2: $tmp/late.o1/profile.rank1.txt: cannot write the profile: the tests' fault (KILN_TEST_PROFILE_FAIL=1)"
echo "rank 1 failing after the last collective: rank 0 exited $rc0, rank 1 $rc1"
[ "$rc0" = 1 ] && [ "$rc1" = 1 ] || bad "late: ranks exited $rc0 and $rc1, not 1 and 1"
err0 late | grep -qF "kiln: error: rank 0 of 2: waiting for every rank to finish: rank 1 failed after the last collective; rank 1 said: $said" ||
	bad "late: rank 0 does not name rank 1's failure and quote it: $(err0 late)"
not_own late
grep -qxF "kiln-failed 1 $said" "$tmp/late.why" || bad "late: rank 1 did not tell kiln launch its own failure: $(cat "$tmp/late.why")"

# ---- 3. ... and rank 0 out of memory reading what rank 1 said -----------------
said="rank 1 of 2: $tmp/quote.o1/profile.rank1.txt: cannot write the profile: the tests' fault (KILN_TEST_PROFILE_FAIL=1)"
rm -f "$tmp/hit"
ranks quote "LD_PRELOAD=$shim SHIM_ALLOC_NTH=1 SHIM_ALLOC_BYTES=$((${#said} + 1)) SHIM_ALLOC_FROM=libkiln SHIM_ALLOC_MAIN=1 SHIM_ALLOC_HIT=$tmp/hit" \
	run.profile=1
ranks_end
echo "rank 1 failing after the last collective, rank 0 out of memory for its words: rank 0 exited $rc0: $(err0 quote | cut -c1-160)"
if [ ! -e "$tmp/hit" ] || err0 quote | grep -q "rank 1 said"; then
	bad "quote: no allocation of ${#said} + 1 bytes failed reading rank 1's words (the fault missed)"
else
	[ "$rc0" = 1 ] || bad "quote: rank 0 exited $rc0, not 1"
	err0 quote | grep -qx "kiln: error: rank 0 of 2: waiting for every rank to finish: rank 1 failed after the last collective" ||
		bad "quote: rank 0 does not name rank 1's failure alone: $(err0 quote)"
	not_own quote
fi
exit $fail
