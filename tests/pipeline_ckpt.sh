#!/bin/sh
# tests/pipeline_ckpt.sh - checkpoints of pipeline stages on ranks, session
# 13 (docs/checkpoints.md "Stages on ranks"; tests/pipeline_dist.sh section
# 13 has the periodic ones); tests/pipeline_dist.sh section 11's MLP, whose
# stage 1 holds 99% of the weights, 2 stages on 2 ranks:
#  1. keep_best's checkpoint is streamed per stage as the periodic ones
#     (one write path, core/train_ckpt.c ckpt_write): with evaluations
#     every 2 steps, keep_best = 1 and no other checkpoint, rank 0's peak
#     device bytes over the run stay below the whole model's parameters
#     (before session 13 keep_best gathered the whole state at rank 0:
#     about 2.4 MB), and the best checkpoint holds one process's bytes;
#  2. rank 0's write fails mid-file (its temporary file a link to
#     /dev/full: a full disk): every rank exits non-zero within 30 s of
#     step 4's log point, the line before the write ([dist] timeout and
#     heartbeat 60, `kiln launch --grace 60`: ranks left waiting end 60 s
#     after it; start-up and training, which a loaded machine stretches,
#     left out), each naming rank 0, the file and the cause; the previous
#     checkpoint stays byte for byte, no ckpt-4.kiln appears (before:
#     under gloo stage 1's rank said only "rank 0 was lost", under mpirun
#     it waited in its sends until the heartbeat watchdog ended it); under mpirun where available; and
#     rank 0 unable to create keep_best's file ends both ranks too;
#  3. the run directory renamed away between log points (session 34): seen
#     at the next checkpoint's write on rank 0, which goes into the
#     recreated directory (with config.ini and the lock), and every rank
#     stops there, rank 0 exit 4.  Before, the streamed write recreated
#     checkpoints/ alone and the run went on to the next log point.
# Every process runs under `timeout`.
name=pipeckpt needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/wide.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 256 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu fc2:linear:out=512:stage=1 r2:relu \
		fc3:linear:out=512 r3:relu fc4:linear:out=16 loss:softmax_xent
	ini_sgd_steps 4 log_every=2 eval=1 eval_every=2 checkpoint_every=0 checkpoint_last=0 keep_best=1
	ini pipeline micro_batches=4
	ini dist timeout=60 heartbeat=60
} > "$ini"

# ---- 1. keep_best streamed per stage ----------------------------------------------
run bo 0 32
run br 2 32 dist.pipeline=2
ls "$tmp/bo/checkpoints/best/" > "$tmp/bo.best" 2>&1
ls "$tmp/br/checkpoints/best/" > "$tmp/br.best" 2>&1
[ "$(cat "$tmp/bo.best")" = "$(cat "$tmp/br.best")" ] && [ "$(wc -l < "$tmp/br.best")" = 1 ] ||
	{ bad "br: best checkpoints '$(cat "$tmp/br.best")', one process's '$(cat "$tmp/bo.best")'"; }
b=$(cat "$tmp/bo.best")
"$tool" same "$tmp/bo/checkpoints/best/$b" "$tmp/br/checkpoints/best/$b" params optim.momentum step ||
	bad "br: keep_best's checkpoint on 2 stages on 2 ranks differs from one process's"
[ "$(grep -c "checkpoint written in pieces of 256 KiB, nothing gathered whole\|checkpoint sent to rank 0 in pieces of 256 KiB" "$tmp/br.log")" -ge 2 ] ||
	{ bad "br: keep_best's checkpoint was not streamed per stage"; grep "pieces" "$tmp/br.log"; }
# the whole model's parameters alone: 289840 floats, 1159360 bytes
pk=$(sed -n 's/.*rank 0 (pipeline stage 0): memory at the end of training: device peak \([0-9]*\) bytes over the run.*/\1/p' "$tmp/br.log")
echo "keep_best on 2 stages on 2 ranks: rank 0's device peak over the run $pk bytes"
[ -n "$pk" ] && [ "$pk" -lt 1159360 ] ||
	{ bad "br: rank 0 peaks at '$pk' device bytes with keep_best, not below the whole model's parameters (1159360)"; grep "memory at the end" "$tmp/br.log"; }
echo "ok: keep_best's checkpoint streamed per stage, one process's bytes"

# ---- 2. rank 0's write fails: every rank ends at once ------------------------------
nb="train.eval=0 train.keep_best=0 train.checkpoint_every=2"
run fa 2 32 dist.pipeline=2 $nb train.max_steps=2
# fail_run NAME FROM CMD...: train from a copy of FROM's step 2 to step 6,
# the write of ckpt-4.kiln failing on rank 0 (ENOSPC), timed
fail_run() {
	_fn=$1 _ff=$2
	shift 2
	ckpt_fail_run "$_fn" "$_ff" "rank 0 (pipeline stage 0)" "rank 1 (pipeline stage 1)" "$@"
}
fail_run ff fa timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$ini" \
	run.out_dir="$tmp/ff" train.batch=32 dist.pipeline=2 $nb train.max_steps=6 train.resume=1
# keep_best's directory blocked on rank 0 (a plain file named best where
# it goes): refused before the first step, naming it, and the launch ends
# at once (session 33; before, the first best write failed at step 2: a
# write failing mid-run is ckpt_fail_run's case above)
mkdir -p "$tmp/fb/checkpoints"
: > "$tmp/fb/checkpoints/best"
_t0=$(date +%s)
timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$ini" \
	run.out_dir="$tmp/fb" train.batch=32 dist.pipeline=2 train.max_steps=2 > "$tmp/fb.log" 2>&1 && bad "fb: ran"
_s=$(($(date +%s) - _t0))
echo "fb: keep_best's directory blocked on rank 0: the launch ended after $_s s"
[ "$_s" -le 30 ] || bad "fb: the launch ended after $_s s ([dist] timeout and heartbeat 60 s)"
grep -q "^kiln: error: rank 0 .*$tmp/fb/checkpoints/best: \[train\] keep_best cannot create its checkpoint directory there: a file of that name is in the way" "$tmp/fb.log" ||
	{ bad "fb: rank 0 does not name the path in the way"; grep -i "error" "$tmp/fb.log"; }
grep -q " step 1/" "$tmp/fb.log" && bad "fb: trained before refusing"
if [ -f "$abs_top_builddir/plugins/.libs/kiln-mpi.so" ] && command -v mpirun > /dev/null; then
	mpi() { # mpi NAME OVERRIDES...
		_n=$1
		shift
		timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
			-x KILN_MASTER_PORT="$(free_port 3)" -x OMP_NUM_THREADS=1 \
			-x KILN_STORE_TOKEN=kiln-tests-0123456789abcdef "$kiln" train "$ini" \
			run.out_dir="$tmp/$_n" train.batch=32 dist.pipeline=2 \
			plugin.mpi.thread_level=multiple $nb "$@"
	}
	mpi ma train.max_steps=2 > "$tmp/ma.log" 2>&1 || { bad "ma: exit $?"; tail -5 "$tmp/ma.log"; }
	fail_run fm ma mpi fm train.max_steps=6 train.resume=1
	grep -q "comm mpi" "$tmp/fm.log" || bad "fm did not run on mpi"
else
	echo "mpi: not built or no mpirun: skipped"
fi
echo "ok: rank 0's failed write ends every rank at once, naming it and the file; the old checkpoint intact"
# ---- 3. the run directory lost between log points -------------------------------
# renamed away (atomic, unlike rm -rf, which races with the run's writes)
# after step 400's checkpoint, with no log point before the epoch's end
# at step 2048
r="$tmp/lost"
timeout 120 "$kiln" launch -n 2 --grace 60 -- "$kiln" train "$ini" run.out_dir="$r" train.batch=32 \
	dist.pipeline=2 data.samples=65536 train.eval=0 train.keep_best=0 train.epochs=1000 \
	train.max_steps=0 train.log_every=100000 train.checkpoint_every=400 > "$tmp/lost.log" 2>&1 &
pid=$!
n=0
until grep -q '"event":"checkpoint","step":400,' "$r/metrics.jsonl" 2>/dev/null; do
	n=$((n + 1))
	[ $n -le 600 ] || { kill $pid; bad "lost: no checkpoint of step 400 in 60 s"; break; }
	sleep 0.1
done
mv "$r" "$r.gone"
wait $pid
rc=$?
[ $rc = 4 ] || { bad "lost: the launch exited $rc, expected 4 (rank 0's)"; tail -5 "$tmp/lost.log"; }
step=$(sed -n 's/.*"event":"out_dir_lost","step":\([0-9]*\),.*/\1/p' "$r/metrics.jsonl" 2>/dev/null)
echo "lost: the run directory renamed after step 400's checkpoint, the loss seen at step '$step'"
# seen at the next checkpoint, a multiple of 400 (the first epoch's end,
# its log point, is step 2048), and the run stopped there
if [ -z "$step" ]; then
	bad "lost: no out_dir_lost event in the recreated $r/metrics.jsonl"
	step=0
elif [ $((step % 400)) != 0 ] || [ "$step" -ge 2048 ]; then
	bad "lost: the loss seen at step $step, not at a checkpoint before step 2048 (the epoch's log point)"
fi
[ -f "$r/config.ini" ] && [ -f "$r/.kiln.lock" ] || bad "lost: config.ini or the lock not recreated: $(ls -a "$r")"
[ "$(ls "$r/checkpoints")" = "ckpt-$step.kiln" ] || bad "lost: the recreated checkpoints/ holds '$(ls "$r/checkpoints")', not ckpt-$step.kiln"
grep -q "^kiln: error: stopped at step $step, not at the user's request: rank 0 of 2 (node 0, host [^)]*): the run directory $r was removed or replaced mid-run (recreated); checkpoint written to $r/checkpoints/ckpt-$step.kiln; resume with --resume" "$tmp/lost.log" ||
	{ bad "lost: rank 0 does not say it stopped at step $step"; grep "error" "$tmp/lost.log"; }
grep -q "^kiln: error: stopped at step $step, not at the user's request: rank 0 of 2 .*the run directory $r was removed or replaced mid-run (recreated); rank 0 writes the checkpoint" "$tmp/lost.log" ||
	{ bad "lost: rank 1 does not say it stopped at step $step"; grep "error" "$tmp/lost.log"; }
echo "ok: the run directory lost between log points: stages on ranks stop at the checkpoint"
exit $fail
