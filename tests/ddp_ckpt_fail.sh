#!/bin/sh
# tests/ddp_ckpt_fail.sh - a failed checkpoint write of ranks holding the
# whole model (plain DDP and ZeRO-1: rank 0 writes the gathered state,
# core/train_ckpt.c ckpt_write), session 13 (docs/checkpoints.md "A
# failed write"; tests/pipeline_ckpt.sh has stages on ranks).  Rank 0's
# write of ckpt-4.kiln fails mid-file (its temporary file a link to
# /dev/full: a full disk; tests run as root, so an unwritable directory
# would not do): every rank exits non-zero within 30 s of step 4's log
# point, the line before the write ([dist] timeout and heartbeat 60, `kiln
# launch --grace 60`: ranks left waiting end 60 s after it), rank 0
# naming the file and the cause, rank 1 rank 0, the file and the cause;
# ckpt-2.kiln stays byte for byte, neither ckpt-4.kiln nor its temporary
# remains.  Before session 13 rank 1 said
# only "rank 0 was lost" (gloo) or waited for the heartbeat watchdog
# (mpirun).  Gloo plain and ZeRO-1, mpirun where available.
# Every process runs under `timeout`.
name=ddpckpt needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/mlp.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=2 eval=0 checkpoint_every=2 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$ini"

# fail_run NAME FROM CMD...: train from a copy of FROM's step 2 to step 6,
# the write of ckpt-4.kiln failing on rank 0 (ENOSPC), timed
fail_run() {
	_fn=$1 _ff=$2
	shift 2
	ckpt_fail_run "$_fn" "$_ff" "rank 0" "rank 1" "$@"
}
gloo() { # gloo NAME OVERRIDES...
	_n=$1
	shift
	timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$ini" run.out_dir="$tmp/$_n" \
		train.batch=32 "$@"
}

# ---- plain DDP and ZeRO-1 under gloo ----------------------------------------------
run da 2 32 train.max_steps=2
fail_run df da gloo df train.resume=1
run za 2 32 dist.zero=1 train.max_steps=2
fail_run zf za gloo zf dist.zero=1 train.resume=1
grep -q "ZeRO-1\|zero" "$tmp/zf.log" || bad "zf: no sign of ZeRO-1 in the log"

# ---- plain DDP under mpirun -------------------------------------------------------
if [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null; then
	mpi() { # mpi NAME OVERRIDES...
		_n=$1
		shift
		timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
			-x KILN_MASTER_PORT="$(free_port 3)" -x OMP_NUM_THREADS=1 "$kiln" train "$ini" \
			run.out_dir="$tmp/$_n" train.batch=32 plugin.mpi.thread_level=multiple "$@"
	}
	mpi ma train.max_steps=2 > "$tmp/ma.log" 2>&1 || { bad "ma: exit $?"; tail -5 "$tmp/ma.log"; }
	fail_run mf ma mpi mf train.resume=1
	grep -q "comm mpi" "$tmp/mf.log" || bad "mf did not run on mpi"
else
	echo "mpi: not built or no mpirun: skipped"
fi
[ "$fail" = 0 ] && echo "ok: rank 0's failed write of the gathered state ends every rank at once, naming rank 0, the file and the cause; the old checkpoint intact"
exit $fail
