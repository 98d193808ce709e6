#!/bin/sh
# tests/stop_eval.sh - a stop (SIGTERM) during an evaluation ends it within
# a batch, not after the whole set (docs/checkpoints.md, "Signals").
#
# Before session 29 the stop was taken after the next step only: an
# evaluation of a large set ran to its end first (here about a minute or
# more; on a cluster, past the scheduler's grace period, so the second
# signal killed the run without a checkpoint).  A small MLP trains 4 steps
# an epoch on 64 synthetic samples and evaluates 1,000,000 (about 100 s a
# pass on a loaded core).  SIGTERM sent a second into an evaluation must
# end the run within 20 s with exit 0, the stop's checkpoint of the step
# before it, "stopped" in the JSON line and metrics.jsonl, and no eval
# record of the cut pass; the checkpoint resumes.  Twice: the evaluation
# point after step 2 ([train] eval_every = 2), and the epoch's evaluation
# after its 4 steps (eval_every = 0), whose resumed run gives epoch 1 its
# line.  Under `kiln launch -n 2` (with kiln-gloo) the ranks agree every 16
# evaluation batches: SIGTERM to the launcher stops both within 20 s too,
# and 1 process resumes rank 0's checkpoint; so do 2 pipeline stages on
# the 2 ranks evaluating the gathered model (session 45), and evaluating
# per stage (session 46), also when one rank's read of a stop's cause
# fails (both fail together).  A failed case kills its launcher and ranks
# too (job_kill).  A stop during a resumed
# run's owed evaluation (its first work) is one after work: a checkpoint,
# not "nothing to checkpoint; the process ends within 5 s".  A stop during the final test ([data.val] set: the test set once
# after training, 20,000 samples here, a few seconds) is not taken: the
# run finishes, the whole test set evaluated, the signal's line before
# the test's results (it came during the test, not after it).
name=stopeval
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
{
	ini run seed=3 threads=1
	ini_synthetic 64 64 4 workers=1
	ini data.eval samples=1000000 workers=1
	ini_layers flat:flatten fc1:linear:out=1024 r1:relu fc2:linear:out=4 loss:softmax_xent
	ini train epochs=2 batch=16 eval_batch=64 log_every=2 lr=0.01
} > "$tmp/run.ini"

# stop_in_eval CASE STEP [launch -n N --] OVERRIDE...: train (under kiln
# launch when the words up to -- say so) until the log point of step STEP
# is in metrics.jsonl (the evaluation follows it), SIGTERM a second later;
# the run must end within 20 s, stopped, its checkpoint ckpt-STEP
stop_in_eval() {
	c=$1 step=$2
	shift 2
	o="$tmp/$c"
	launch=
	if [ "${1:-}" = launch ]; then
		launch="$kiln launch $2 $3 --"
		shift 4
	fi
	timeout --preserve-status 600 $launch "$kiln" train "$tmp/run.ini" run.out_dir="$o" "$@" \
		> "$tmp/$c.out" 2> "$tmp/$c.err" &
	pid=$!
	wait_line "$pid" "$o/metrics.jsonl" "\"event\":\"train\",\"epoch\":1,\"step\":$step," "$c" "$tmp/$c.err"
	sleep 1
	kill -TERM "$pid"
	n=0
	while kill -0 "$pid" 2>/dev/null; do
		n=$((n + 1))
		if [ $n -gt 200 ]; then
			kill -TERM "$pid" # a repeat after 5 s ends the process at once
			sleep 1
			job_kill "$pid"
			fail "$c: still running 20 s after SIGTERM during the evaluation: $(tail -2 "$tmp/$c.err")"
		fi
		sleep 0.1
	done
	wait "$pid"
	rc=$?
	[ $rc -eq 0 ] || fail "$c: exit $rc after SIGTERM, expected 0: $(tail -3 "$tmp/$c.err")"
	grep -q "stop requested: the test evaluation after step $step ends after [0-9]* of its [0-9]* samples, not recorded" "$tmp/$c.err" ||
		fail "$c: no 'evaluation ... ends after' line: $(tail -4 "$tmp/$c.err")"
	grep -q "kiln: stopped at step $step: checkpoint written to $o/checkpoints/ckpt-$step.kiln" "$tmp/$c.err" ||
		fail "$c: not stopped at step $step with its checkpoint: $(tail -3 "$tmp/$c.err")"
	grep -q '"stopped": true' "$tmp/$c.out" || fail "$c: no \"stopped\" in the JSON line: $(cat "$tmp/$c.out")"
	tail -1 "$o/metrics.jsonl" | grep -q "^{\"event\":\"stopped\",\"step\":$step," ||
		fail "$c: metrics.jsonl does not end with the stop: $(tail -1 "$o/metrics.jsonl")"
	! grep -q '"event":"eval"' "$o/metrics.jsonl" || fail "$c: the cut evaluation was recorded"
	echo "$c: SIGTERM during the evaluation after step $step: stopped within $((n / 10)) s"
}

# term_in NAME FILE PATTERN CMD...: CMD in the background (its output in
# $tmp/NAME.out and $tmp/NAME.err), SIGTERM a second after FILE has a line
# matching PATTERN; its exit status in $rc
term_in() {
	_tn=$1 _tf=$2 _tp=$3
	shift 3
	"$@" > "$tmp/$_tn.out" 2> "$tmp/$_tn.err" &
	pid=$!
	wait_line "$pid" "$_tf" "$_tp" "$_tn" "$tmp/$_tn.err"
	sleep 1
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
}

# resume CASE STEPS OVERRIDE...: --resume from the stop's checkpoint
# (without evaluation) to step STEPS
resume() {
	c=$1 steps=$2
	shift 2
	last="train --resume $c"
	"$kiln" train "$tmp/run.ini" run.out_dir="$tmp/$c" train.resume=1 train.eval=0 \
		train.max_steps="$steps" "$@" > "$out" 2> "$err" || fail "$c: the resume failed"
	grep -q "resuming from $tmp/$c/checkpoints/ckpt-" "$err" || fail "$c: did not resume"
	grep -q "\"steps\": $steps," "$out" || fail "$c: the resumed run did not end at step $steps"
}

stop_in_eval point 2 train.eval_every=2
# no epoch finished: no train loss or accuracy to report (was 0.000000)
grep -q '"epochs": 0, "steps": 2, "train_loss": null, "train_acc": null,.* "train_samples_per_s": null,' "$tmp/point.out" ||
	fail "point: a stop within epoch 1 reports a train loss: $(cat "$tmp/point.out")"
# the resumed run's owed evaluation (its first work, before any step),
# stopped: a stop after work, with a checkpoint (of step 2 again), not
# "before the first step: nothing to checkpoint; the process ends within
# 5 s" with a checkpoint written anyway under that timer (session 32)
"$kiln" train "$tmp/run.ini" run.out_dir="$tmp/point" train.resume=1 train.eval_every=2 \
	> "$tmp/owed.out" 2> "$tmp/owed.err" &
pid=$!
wait_line "$pid" "$tmp/owed.err" "resume: the evaluation after step 2, which a stop cut short, first" owed "$tmp/owed.err"
sleep 1
kill -TERM "$pid"
wait "$pid"
rc=$?
[ $rc -eq 0 ] || fail "owed: exit $rc after SIGTERM, expected 0: $(tail -3 "$tmp/owed.err")"
! grep -q "nothing to checkpoint" "$tmp/owed.err" || fail "owed: $(grep "nothing to checkpoint" "$tmp/owed.err")"
grep -q "^kiln: stop requested: finishing the current step and writing a checkpoint" "$tmp/owed.err" ||
	fail "owed: no 'stop requested: ... writing a checkpoint': $(grep "stop requested" "$tmp/owed.err")"
grep -q "kiln: stopped at step 2: checkpoint written to $tmp/point/checkpoints/ckpt-2.kiln" "$tmp/owed.err" ||
	fail "owed: not stopped at step 2 with its checkpoint: $(tail -3 "$tmp/owed.err")"
echo "owed: SIGTERM during the resumed run's owed evaluation: a stop with its checkpoint"
resume point 3 train.eval_every=2
grep -q "resuming from $tmp/point/checkpoints/ckpt-2.kiln" "$err" || fail "point: resumed elsewhere"
echo "point: resumed from step 2 to step 3"

stop_in_eval epoch 4
resume epoch 5
grep -q "epoch 1/2: train loss" "$err" "$out" || fail "epoch: the resumed run gave epoch 1 no line"
echo "epoch: resumed from step 4 (epoch 1's line, then step 5)"

if [ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ]; then
	# 2 ranks of batch 16: 2 steps an epoch, the evaluation after step 2
	stop_in_eval ddp 2 launch -n 2 run.comm=gloo train.eval_every=2 data.eval.samples=400000
	[ "$(grep -c "stop requested: the test evaluation after step 2 ends after" "$tmp/ddp.err")" = 2 ] ||
		fail "ddp: not both ranks cut the evaluation: $(grep "ends after" "$tmp/ddp.err")"
	# only rank 0 writes checkpoints: rank 1 says so (it said "no checkpoint
	# written ([run] out_dir is empty)")
	grep -q "kiln: rank 1 stopped at step 2: rank 0 writes the checkpoint" "$tmp/ddp.err" ||
		fail "ddp: rank 1's stop line: $(grep "stopped at step" "$tmp/ddp.err")"
	! grep -q "out_dir is empty" "$tmp/ddp.err" || fail "ddp: a rank says out_dir is empty"
	resume ddp 3 train.eval_every=2 data.eval.samples=400000
	echo "ddp: resumed from 2 ranks' step 2 on 1 process to step 3"
	# the read of the metric sums after the cut failing on rank 1
	# (KILN_TEST_CKPT_FAIL=cut@1): agreed, every rank fails, rank 0 naming
	# rank 1, neither writing the stop's checkpoint (session 43; before,
	# rank 0 went on to it and learnt of rank 1 from its process's exit)
	o="$tmp/cut"
	term_in cut "$o/metrics.jsonl" '"event":"train","epoch":1,"step":2,' env KILN_TEST_CKPT_FAIL=cut@1 \
		timeout --preserve-status 600 "$kiln" launch -n 2 -- "$kiln" train "$tmp/run.ini" \
		run.out_dir="$o" run.comm=gloo train.eval_every=2 data.eval.samples=400000
	[ $rc -ne 0 ] || fail "cut: exit 0 with rank 1's read failing after the cut"
	grep -q "rank 1 of 2: step 2's evaluation: reading the metric sums after a stop cut the evaluation: failed (the tests' fault" "$tmp/cut.err" ||
		fail "cut: rank 1 did not name its failed read: $(grep -i "fail\|error" "$tmp/cut.err" | head -4)"
	grep -q "rank 0 of 2: step 2's evaluation: rank 1 failed (its message says why)" "$tmp/cut.err" ||
		fail "cut: rank 0 did not learn of rank 1's failed read in the agreement: $(grep -i "fail\|error\|stopped" "$tmp/cut.err" | head -6)"
	[ ! -f "$o/checkpoints/ckpt-2.kiln" ] || fail "cut: rank 0 wrote the stop's checkpoint"
	echo "cut: rank 1's failed read after the cut ends both ranks, agreed"
	# [dist] pipeline = 2 stages on the 2 ranks evaluating the gathered
	# model (fc1 frozen keeps it whole: docs/pipeline.md), each rank its
	# share of the set of 199,990 (1562 and 1563 of its 3125 batches of
	# 64, the last of 54 rows: shares of 99968 and 100022 samples, uneven):
	# the ranks agree every 16 batches as data-parallel ones do (session
	# 45; before, such an evaluation ran to its end, and the stop came
	# after it)
	stop_in_eval pipe 2 launch -n 2 run.comm=gloo train.eval_every=2 dist.pipeline=2 \
		layer.fc2.stage=1 pipeline.micro_batches=2 layer.fc1.trainable=0 data.eval.samples=199990
	for share in 99968 100022; do
		grep -q "stop requested: the test evaluation after step 2 ends after [0-9]* of its $share samples, not recorded (this rank's share of the set's)" "$tmp/pipe.err" ||
			fail "pipe: the rank of $share samples did not cut its share of the gathered evaluation: $(grep "ends after" "$tmp/pipe.err")"
	done
	# the same 2 stages evaluating per stage (every parameter trainable:
	# each rank holds its stage's alone, and both go through the whole
	# set's batches, stage 0 handing each to stage 1): cut at the same
	# batch on both ranks, agreed every 16 batches (session 46; before,
	# the evaluation ran to its end)
	stop_in_eval staged 2 launch -n 2 run.comm=gloo train.eval_every=2 dist.pipeline=2 \
		layer.fc2.stage=1 pipeline.micro_batches=2 data.eval.samples=199990
	grep -q "holds the stage's parameters and gradients alone" "$tmp/staged.err" ||
		fail "staged: the evaluation did not run per stage: $(grep -i "pipeline" "$tmp/staged.err" | head -3)"
	cut=$(sed -n 's/.*stop requested: the test evaluation after step 2 ends after \([0-9]*\) of its 199990 samples, not recorded$/\1/p' "$tmp/staged.err")
	[ "$(echo "$cut" | wc -l)" = 2 ] && [ "$(echo "$cut" | sort -u | wc -l)" = 1 ] ||
		fail "staged: not both stages cut the evaluation at the same batch: $(grep "ends after" "$tmp/staged.err")"
	# the same, SIGHUP to rank 0 alone (a stop not the user's: its cause
	# posted at the evaluation's next agreement, every 16 batches, for
	# the others to read) and rank 1's read of that cause failing
	# (KILN_TEST_CKPT_FAIL=cause@1): both ranks take the stop and fail
	# together in the cut's sum, rank 0 naming rank 1, within 20 s.
	# Before, rank 1 returned from the agreement without the stop and
	# went on to the batch's hand-offs while rank 0 waited in the cut's
	# sum: both held until [dist] timeout
	o="$tmp/cause"
	KILN_TEST_CKPT_FAIL=cause@1 timeout --preserve-status 600 "$kiln" launch -n 2 -- \
		sh -c 'echo $$ > "$0.pid$KILN_RANK"; exec "$@"' "$o" "$kiln" train "$tmp/run.ini" \
		run.out_dir="$o" run.comm=gloo train.eval_every=2 dist.pipeline=2 layer.fc2.stage=1 \
		pipeline.micro_batches=2 data.eval.samples=199990 dist.timeout=120 \
		> "$tmp/cause.out" 2> "$tmp/cause.err" &
	pid=$!
	wait_line "$pid" "$o/metrics.jsonl" '"event":"train","epoch":1,"step":2,' cause "$tmp/cause.err"
	sleep 1
	kill -HUP "$(cat "$o.pid0")"
	n=0
	while kill -0 "$pid" 2>/dev/null; do
		n=$((n + 1))
		if [ $n -gt 200 ]; then
			job_kill "$pid"
			fail "cause: still running 20 s after SIGHUP to rank 0 with rank 1's read of the cause failing: $(tail -3 "$tmp/cause.err")"
		fi
		sleep 0.1
	done
	wait "$pid"
	rc=$?
	[ $rc -ne 0 ] || fail "cause: exit 0 with rank 1's read of the stop's cause failing"
	grep -q "holds the stage's parameters and gradients alone" "$tmp/cause.err" ||
		fail "cause: the evaluation did not run per stage"
	grep -q "rank 1 of 2: step 2's evaluation: agreeing on a stop: reading the stop's cause: failed (the tests' fault" "$tmp/cause.err" ||
		fail "cause: rank 1 did not name its failed read: $(grep -i "fail\|error" "$tmp/cause.err" | head -4)"
	grep -q "rank 0 of 2: step 2's evaluation: rank 1 failed (its message says why)" "$tmp/cause.err" ||
		fail "cause: rank 0 did not learn of rank 1's failure in the cut's sum: $(grep -i "fail\|error" "$tmp/cause.err" | head -6)"
	[ ! -f "$o/checkpoints/ckpt-2.kiln" ] || fail "cause: rank 0 wrote the stop's checkpoint"
	echo "cause: rank 1's failed read of the stop's cause ends both stages within $((n / 10)) s"
else
	echo "(no kiln-gloo: the data-parallel case skipped)"
fi

# the final test: SIGTERM once the epoch's line (after its evaluation on
# [data.val]) is out, a second into the test of 20,000 samples (a few
# seconds): the signal's line must come before the test's results, or
# the test was over before it (the case would pass whatever a stop did)
o="$tmp/final"
term_in final "$tmp/final.err" "epoch 1/1: train loss" "$kiln" train "$tmp/run.ini" \
	run.out_dir="$o" train.epochs=1 data.val.samples=64 data.eval.samples=20000
[ $rc -eq 0 ] || fail "final: exit $rc after SIGTERM, expected 0: $(tail -3 "$tmp/final.err")"
sig=$(grep -n "^kiln: stop requested" "$tmp/final.err" | head -1 | cut -d: -f1)
res=$(grep -n "final test loss" "$tmp/final.err" | head -1 | cut -d: -f1)
[ -n "$sig" ] && [ -n "$res" ] && [ "$sig" -lt "$res" ] ||
	fail "final: the signal (line ${sig:-none}) did not come before the final test's results (line ${res:-none}): $(tail -4 "$tmp/final.err")"
! grep -q "ends after\|stopped at step" "$tmp/final.err" || fail "final: the stop cut the final test: $(tail -3 "$tmp/final.err")"
grep -q '"test_samples": 20000,' "$tmp/final.out" || fail "final: not the whole test set: $(cat "$tmp/final.out")"
! grep -q '"stopped"' "$tmp/final.out" || fail "final: the run says it stopped"
# [data.val]'s evaluation is in the JSON line too (docs/training.md)
grep -q '"val_loss": [0-9.]*, "val_acc": [0-9.]*' "$tmp/final.out" || fail "final: no val_loss/val_acc: $(cat "$tmp/final.out")"
echo "final: SIGTERM during the final test: the run finished it"
echo "PASS"
