#!/bin/sh
# tests/ckpt_fault.sh - a checkpoint's failure on rank 0 anywhere in the
# write, not only in the file, ends every rank at once (session 14;
# docs/checkpoints.md "A failed write"; tests/pipeline_ckpt.sh and
# tests/ddp_ckpt_fail.sh have a full disk).  KILN_TEST_CKPT_FAIL, the
# tests' fault injection (core/dist_impl.h), fails one step on rank 0:
#  1. stages on ranks (2 stages, 2 ranks, streamed per stage): "event"
#     (the comm stream's event before the exchange; before session 14 rank
#     0 returned before the outcome and rank 1 waited for a go token),
#     "buffers" (rank 0's receives of the layer buffers: the same),
#     "alloc" (rank 0's piece buffer; its token needs no allocation now:
#     before, a failed 1 KiB token left the senders waiting);
#  2. ZeRO-1 "gather" (an allgather of an optimizer slot into the
#     gradient buffer while rank 0 writes the file, session 29; before,
#     rank 0's buffer of the whole optimizer state, and before session
#     14 rank 0 returned and rank 1 waited in the gather; failing on
#     rank 1, rank 0's file must not stand);
#  each: every rank exits non-zero within 30 s of step 4's log point (the
#  line before the write; [dist] timeout and heartbeat 60, `kiln launch
#  --grace 60`: ranks left waiting end 60 s after it; start-up and
#  training, which a loaded machine stretches, left out of the bound:
#  tests/dist_common.sh ckpt_fault_run), rank 0 naming the file and the
#  cause once (before: "rank 0 of 2: rank 0: ..."), rank 1 rank 0, the
#  file and the cause; ckpt-2.kiln byte for byte, no ckpt-4.kiln nor its
#  temporary;
#  and the same steps failing on rank 1 ("event@1", "gather@1"): rank 1
#  names the file and its cause, rank 0 the file and a failed rank;
#  3. rank 0 killed outright (SIGKILL) in the middle of a streamed write
#     (its temporary file a link to a fifo nobody reads: it blocks in the
#     write): rank 1 exits non-zero within 30 s of the kill naming rank 0,
#     ckpt-2.kiln stays byte for byte and the run resumes from it;
#  4. the parameters' non-finite check failing on one rank ("params@R",
#     at a log point and before a checkpoint): both ranks end at once, the
#     failed one naming its cause, the other the failed rank;
#  5. the read of the device's metric sums for a checkpoint failing on one
#     rank ("sums@R", the log interval open there): the same;
#  6. a checkpoint's sync of the device's queued steps failing on one rank
#     ("sync@R"), or its read of the clip op's counts ("clip@1"): the same.
# Every process runs under `timeout`.
name=ckptfault needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/wide.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=512:stage=1 r2:relu \
		fc3:linear:out=512 r3:relu fc4:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=0 checkpoint_every=2 checkpoint_last=0
	ini pipeline micro_batches=4
	ini dist timeout=60 heartbeat=60
} > "$ini"
mlp="$tmp/mlp.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=0 checkpoint_every=2 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$mlp"
gloo() { # gloo NAME OVERRIDES...
	_n=$1
	shift
	timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$ini" run.out_dir="$tmp/$_n" \
		train.batch=32 train.resume=1 "$@"
}
# fault NAME FROM STEP WHO0 WHO1 WHY OVERRIDES...: the write of ckpt-4.kiln
# failing at STEP on rank 0
fault() {
	_fn=$1 _ff=$2 _fs=$3 _f0=$4 _f1=$5 _fw=$6
	shift 6
	KILN_TEST_CKPT_FAIL=$_fs ckpt_fault_run "$_fn" "$_ff" "$_f0" "$_f1" - "$_fw" gloo "$_fn" "$@"
}
inj="failed (the tests' fault: KILN_TEST_CKPT_FAIL"
# other NAME FROM STEP@1 WHO0 WHO1 WHY OVERRIDES...: the step failing on
# rank 1 before the exchange: every rank ends at once, rank 1 naming the
# file and its cause, rank 0 the file and that a rank failed
other() {
	_on=$1 _of=$2 _os=$3 _o0=$4 _o1=$5 _ow=$6
	shift 6
	rm -rf "$tmp/$_on"
	cp -r "$tmp/$_of" "$tmp/$_on"
	cp "$tmp/$_on/checkpoints/ckpt-2.kiln" "$tmp/$_on.copy"
	KILN_TEST_CKPT_FAIL=$_os stamped "$_on" "*step 4/*" gloo "$_on" "$@"
	ended_soon "$_on" $? " step 4/" "step 4's log point" "rank 1's preparation failed"
	_f=$tmp/$_on/checkpoints/ckpt-4.kiln
	grep -q "^kiln: error: $_o1: checkpoint $_f: $_ow" "$tmp/$_on.log" ||
		{ bad "$_on: rank 1 does not name the file and its cause (once)"; grep -i "error" "$tmp/$_on.log"; }
	grep -q "^kiln: error: $_o0: checkpoint $_f: not written: 1 other rank(s) failed" "$tmp/$_on.log" ||
		{ bad "$_on: rank 0 does not name the file and a failed rank (once)"; grep -i "error" "$tmp/$_on.log"; }
	cmp -s "$tmp/$_on.copy" "$tmp/$_on/checkpoints/ckpt-2.kiln" || bad "$_on: ckpt-2.kiln changed"
	[ ! -e "$_f" ] && [ ! -e "$_f.tmp" ] || bad "$_on: ckpt-4.kiln or its temporary left behind"
}

# ---- 1. stages on ranks ------------------------------------------------------------
run pa 2 32 dist.pipeline=2 train.max_steps=2
p0="rank 0 (pipeline stage 0)" p1="rank 1 (pipeline stage 1)"
fault pe pa event "$p0" "$p1" "checkpoint: ordering the exchange after the comm stream: the comm stream's event: $inj=event)" dist.pipeline=2
fault pb pa buffers "$p0" "$p1" "checkpoint: receiving the stages' layer buffers: $inj=buffers)" dist.pipeline=2
fault pl pa alloc "$p0" "$p1" "a receive buffer of a piece: $inj=alloc)" dist.pipeline=2
other pe1 pa event@1 "$p0" "$p1" "checkpoint: ordering the exchange after the comm stream: the comm stream's event: $inj=event@1)" dist.pipeline=2
grep -q "checkpoint sent to rank 0 in pieces" "$tmp/pa.log" || bad "pa: the checkpoint was not streamed per stage"

# ---- 2. ZeRO-1 ---------------------------------------------------------------------
ini=$mlp
run za 2 32 dist.zero=1 train.max_steps=2
fault zg za gather "rank 0" "rank 1" "ZeRO-1: allgathering the optimizer state's 'optim.momentum' for a checkpoint: $inj=gather)" dist.zero=1
other zg1 za gather@1 "rank 0" "rank 1" "ZeRO-1: allgathering the optimizer state's 'optim.momentum' for a checkpoint: $inj=gather@1)" dist.zero=1
grep -q "ZeRO-1\|zero" "$tmp/zg.log" || bad "zg: no sign of ZeRO-1 in the log"

# ---- 3. rank 0 killed in the middle of a streamed write --------------------------
ini="$tmp/wide.ini"
rm -rf "$tmp/pk"
cp -r "$tmp/pa" "$tmp/pk"
cp "$tmp/pk/checkpoints/ckpt-2.kiln" "$tmp/pk.copy"
mkfifo "$tmp/pk.fifo"
ln -s "$tmp/pk.fifo" "$tmp/pk/checkpoints/ckpt-4.kiln.tmp"
# the reader holds the fifo open and reads nothing: rank 0's write blocks
timeout 120 sh -c 'exec 3< "$1"; sleep 100' sh "$tmp/pk.fifo" &
reader=$!
gloo pk dist.pipeline=2 > "$tmp/pk.log" 2>&1 &
job=$!
pid=
for _i in $(seq 1 300); do
	for _p in /proc/[0-9]*; do
		case "$(cat "$_p/comm" 2> /dev/null)" in *kiln*) ;; *) continue ;; esac
		for _fd in "$_p"/fd/*; do
			# (rank 0: the kiln process with the fifo open)
			[ "$(readlink "$_fd" 2>/dev/null)" = "$tmp/pk.fifo" ] && pid=${_p#/proc/} && break 2
		done
	done
	[ -n "$pid" ] && break
	sleep 0.1
done
case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
*kiln*) ;;
*) bad "pk: rank 0 never opened the checkpoint's temporary file" ;;
esac
sleep 1 # (in the write: the pipe's 64 KiB are full long before a piece's 256)
[ -n "$pid" ] && kill -KILL "$pid"
_t0=$(date +%s)
wait "$job"
_rc=$?
_dt=$(($(date +%s) - _t0))
kill "$reader" 2> /dev/null
wait "$reader" 2> /dev/null
echo "pk: rank 0 killed in the middle of the write: exit $_rc, ${_dt}s after the kill"
[ "$_rc" != 0 ] && [ "$_rc" != 124 ] || bad "pk: exit $_rc"
[ "$_dt" -le 30 ] || bad "pk: rank 1 took ${_dt}s to end ([dist] timeout and heartbeat 60)"
# (rank 0 hosts the store: rank 1 says the store on rank 0 is gone; before
# session 15 "rank 0 was lost", as if the dead store had reported it)
grep -q "^kiln: error: rank 1 .*the store on rank 0 (stage 0 of pipe 0) at 127.0.0.1:[0-9]* is gone" "$tmp/pk.log" ||
	{ bad "pk: rank 1 does not name rank 0's store"; grep -i "error\|launch" "$tmp/pk.log"; }
cmp -s "$tmp/pk.copy" "$tmp/pk/checkpoints/ckpt-2.kiln" || bad "pk: ckpt-2.kiln changed"
[ ! -e "$tmp/pk/checkpoints/ckpt-4.kiln" ] || bad "pk: ckpt-4.kiln written"
# the run is not lost: it resumes from ckpt-2.kiln (the stale temporary
# left by the kill is a link to the fifo here: removed first)
rm -f "$tmp/pk/checkpoints/ckpt-4.kiln.tmp"
gloo pk dist.pipeline=2 > "$tmp/pk2.log" 2>&1 || { bad "pk2: exit $?"; tail -5 "$tmp/pk2.log"; }
grep -q "resum.*ckpt-2.kiln" "$tmp/pk2.log" || { bad "pk2: did not resume from ckpt-2.kiln"; grep -i resum "$tmp/pk2.log"; }
[ -f "$tmp/pk/checkpoints/ckpt-6.kiln" ] || bad "pk2: no ckpt-6.kiln"
# ---- 4. the parameters' check failing on one rank -------------------------------
# (session 30; before, the failing rank returned before the ranks' sum: its
# peer, left in the sum, learnt only from the failed process's exit that
# something went wrong, 0.3-7 s later: "a collective failed ...: rank 1 is
# gone (its process ended)" or "the store on rank 0 ... is gone"; a rank
# that did not exit would have kept it there until [dist] timeout)
# "params@R" fails the check on rank
# R at step 2's log point (log_every=2) or, with none there
# (log_every=3), before step 2's checkpoint: every rank ends within 30 s of
# the training state's broadcast, the failed rank naming its cause, the
# other the failed rank
# one_rank FAULT WHAT NAME LOG_EVERY RANK WHERE: KILN_TEST_CKPT_FAIL=FAULT@RANK
# (WHAT: its step's words) in a run of $mlp, at step 2's WHERE
more=
one_rank() { # (more: further overrides)
	_f=$1 _w=$2
	shift 2
	rm -rf "$tmp/$1"
	KILN_TEST_CKPT_FAIL=$_f@$3 stamped "$1" "*training state broadcast*" \
		timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$mlp" \
		run.out_dir="$tmp/$1" train.batch=32 train.log_every="$2" $more
	ended_soon "$1" $? "training state broadcast" "the state's broadcast" \
		"$_w failed on rank $3"
	_o=$((1 - $3))
	grep -q "^kiln: error: rank $3 of 2: step 2's $4: $_w: $inj=$_f@$3)" "$tmp/$1.log" ||
		{ bad "$1: rank $3 does not name its cause"; grep -i "error" "$tmp/$1.log"; }
	grep -q "^kiln: error: rank $_o of 2: step 2's $4: rank $3 failed (its message says why)$" "$tmp/$1.log" ||
		{ bad "$1: rank $_o does not name rank $3"; grep -i "error" "$tmp/$1.log"; }
}
params() { # params NAME LOG_EVERY RANK WHERE
	one_rank params "the parameters' check" "$@"
}
params cl1 2 1 "log point"
params cl0 2 0 "log point"
params cc1 3 1 checkpoint
params cc0 3 0 checkpoint
[ ! -e "$tmp/cc1/checkpoints/ckpt-2.kiln" ] || bad "cc1: ckpt-2.kiln written"
# ---- 5. the device's sums failing on one rank before a checkpoint -----------------
# (session 40) "sums@R" fails rank R's read of the device's metric sums for
# step 2's checkpoint (log_every 3: the log interval open there, whose
# entries the ranks then gather): every rank ends within 30 s of the
# state's broadcast, the failed one naming its cause, the other the failed
# rank; no ckpt-2.kiln.  Before, the failed rank returned before the ranks'
# sum of the epoch's sums (and a failed read or allocation of the
# interval's entries before their allgather): its peer learnt only from the
# failed process's exit ("rank 1 is gone (its process ended)", "the store
# on rank 0 ... is gone"), and one that did not exit (a program calling
# kiln_train) kept it in the collective until [dist] timeout
for _r in 1 0; do
	one_rank sums "reading the device's metric sums" cs$_r 3 $_r checkpoint
	[ ! -e "$tmp/cs$_r/checkpoints/ckpt-2.kiln" ] || bad "cs$_r: ckpt-2.kiln written"
done
# ---- 6. a checkpoint's sync of the queued steps failing on one rank --------------
# (session 40) "sync@R" fails rank R's sync of the steps queued on the
# device before step 2's checkpoint (the write's time starts after it):
# the same.  Before, the failed rank returned before the epoch's sums and
# left its peer in that sum
for _r in 1 0; do
	one_rank sync "the device's queued steps" cx$_r 3 $_r checkpoint
	[ ! -e "$tmp/cx$_r/checkpoints/ckpt-2.kiln" ] || bad "cx$_r: ckpt-2.kiln written"
done
# "clip@1" fails rank 1's read of the clip op's counts (train.clip_norm)
# for step 2's checkpoint: the same (before, it returned before the data's
# skipped count, a collective)
more=train.clip_norm=1
one_rank clip "reading the clip op's counts" cp1 3 1 checkpoint
more=
[ ! -e "$tmp/cp1/checkpoints/ckpt-2.kiln" ] || bad "cp1: ckpt-2.kiln written"

[ "$fail" = 0 ] && echo "ok: a failure of rank 0 anywhere in a checkpoint's write ends every rank at once, naming it; the old checkpoint intact"
exit $fail
