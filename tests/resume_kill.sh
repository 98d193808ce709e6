#!/bin/sh
# tests/resume_kill.sh [REPEATS] - crash safety of checkpoints and resume.
#
# A small CNN on Fashion-MNIST (AdamW, batch 16 x accumulate 2, warmup +
# cosine, shuffle, random crop + flip, dropout,
# batchnorm, 2 loader workers) trains 60 steps with a checkpoint every 2
# steps.  Each repetition starts `kiln train --resume` and SIGKILLs it at a
# random moment (often inside a checkpoint write), again and again, until a
# run finishes; after every kill each ckpt-*.kiln left must verify (the
# write is atomic), and the finished run's final state (params, buffers,
# optimizer state, step counters, trainer position, the last epoch's
# training sums) must equal an uninterrupted run's byte for byte.  Then
# SIGTERM once: exit 0 with "checkpoint written to ...", and resuming that
# also ends identical.
#
# REPEATS (default 1, as in `make check`): kill/resume repetitions.
name=kill
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
tool="$top_builddir/tests/ckpt_tool"
reps=${1:-1}
data=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

if [ ! -r "$data" ]; then
	echo "SKIP: Fashion-MNIST missing (scripts/install-deps)"
	exit 77
fi

fail() {
	echo "FAIL: $*"
	for f in "$tmp"/*.log; do
		[ -f "$f" ] && { echo "--- $f (tail)"; tail -n 15 "$f"; }
	done
	exit 1
}

{
	ini run seed=11
	ini_fmnist limit=640 shuffle=1 crop=random pad=2 flip=1 workers=2
	ini data.eval limit=200
	ini_layers c1:conv:out=4:kernel=3:padding=1 bn:batchnorm r:relu p:maxpool:kernel=2 d:dropout:p=0.3 \
		f:flatten fc1:linear:out=512 r2:relu fc:linear:out=10 loss:softmax_xent
	ini train epochs=3 batch=16 accumulate=2 optimizer=adamw lr=0.003 weight_decay=0.01 \
		schedule=cosine warmup=4 log_every=5 eval_batch=128 checkpoint_every=2 keep_last=2
} > "$tmp/run.ini"
# (epoch: the last epoch's training sums, which a resume between two log
# points continues bit for bit: its "interval" section, session 39)
STATE="params buffers optim.exp_avg optim.exp_avg_sq step optim.step trainer epoch"

# a number in [0, $1) from /dev/urandom, scaled by 1000 (milliseconds)
rand_ms() {
	r=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
	echo $((r % $1))
}

# sleep $1 milliseconds
sleep_ms() {
	sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"
}

now_ms() {
	echo $(($(date +%s%N) / 1000000))
}

# every checkpoint left in $1 must verify
all_verify() {
	for f in "$1"/checkpoints/ckpt-*.kiln; do
		[ -e "$f" ] || continue
		"$tool" check "$f" || fail "after a kill, $f does not verify"
	done
}

# wait until the run $pid (log $1) has restored its state and trains:
# both "resuming from ..." and "resume: no checkpoint ..." mark that moment
wait_training() {
	until grep -q 'resum' "$1" 2>/dev/null; do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.01
	done
}

# the uninterrupted reference (with --resume on an empty directory: a
# fresh start), timing its training phase
"$kiln" train "$tmp/run.ini" run.out_dir="$tmp/ref" --resume > "$tmp/ref.log" 2>&1 &
pid=$!
t0=$(now_ms)
wait_training "$tmp/ref.log"
t1=$(now_ms)
wait "$pid" || fail "the uninterrupted run failed"
t2=$(now_ms)
start=$((t1 - t0))
span=$((t2 - t1))
ref="$tmp/ref/checkpoints/ckpt-60.kiln"
"$tool" check "$ref" || fail "no final checkpoint $ref"
echo "uninterrupted run: ${start} ms to start, ${span} ms of training"

kills_total=0
in_write=0
for rep in $(seq 1 "$reps"); do
	out="$tmp/rep$rep"
	kills=0
	runs=0
	while :; do
		runs=$((runs + 1))
		[ $runs -le 40 ] || fail "repetition $rep: no progress after 40 runs"
		"$kiln" train "$tmp/run.ini" run.out_dir="$out" --resume > "$tmp/run.log" 2>&1 &
		pid=$!
		# after 5 kills, let it finish.  One kill in 4 lands anywhere,
		# the others while it trains (checkpoints every 2 steps), in the
		# first 3/4 of what a whole run takes: later runs, which resume,
		# have less to do and end the repetition by finishing first.
		if [ $kills -lt 5 ]; then
			if [ "$(rand_ms 4)" -eq 0 ]; then
				sleep_ms "$(rand_ms $(((start + span) * 3 / 4 + 1)))"
			else
				wait_training "$tmp/run.log"
				sleep_ms "$(rand_ms $((span * 3 / 4 + 1)))"
			fi
			kill -9 "$pid" 2>/dev/null
		fi
		{ wait "$pid"; } 2>/dev/null
		rc=$?
		if [ $rc -eq 0 ] && [ $kills -eq 0 ]; then
			# it finished before the first kill: that tested nothing
			rm -rf "$out"
		elif [ $rc -eq 0 ]; then
			break
		elif [ $rc -eq 137 ]; then
			kills=$((kills + 1))
			ls "$out"/checkpoints/*.tmp > /dev/null 2>&1 && in_write=$((in_write + 1))
			all_verify "$out"
		else
			fail "repetition $rep: kiln train exited $rc"
		fi
	done
	"$tool" same "$ref" "$out/checkpoints/ckpt-60.kiln" $STATE ||
		fail "repetition $rep: final state differs after $kills kill(s)"
	echo "repetition $rep: $kills kill(s), $runs run(s): final state identical"
	kills_total=$((kills_total + kills))
	rm -rf "$out"
done
echo "$kills_total kill(s) in $reps repetition(s), $in_write of them during a checkpoint write"

# kiln eval on the final checkpoint: the numbers of the run's last evaluation
"$kiln" eval "$tmp/run.ini" --checkpoint "$ref" > "$tmp/eval.log" 2> "$tmp/eval.err" ||
	fail "kiln eval exited $?"
acc=$(sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$tmp/eval.log")
want=$(sed -n 's/.*"test_acc": \([0-9.]*\).*/\1/p' "$tmp/ref.log")
[ -n "$acc" ] && [ "$acc" = "$want" ] || fail "kiln eval: test_acc '$acc', the run ended with '$want'"
grep -q '"step": 60' "$tmp/eval.log" || fail "kiln eval: no step"
# the newest of out_dir/checkpoints without --checkpoint
"$kiln" eval "$tmp/run.ini" run.out_dir="$tmp/ref" > "$tmp/eval.log" 2> "$tmp/eval.err" ||
	fail "kiln eval (newest) exited $?"
grep -q 'ckpt-60.kiln' "$tmp/eval.log" || fail "kiln eval did not take the newest checkpoint"
# another model: exit 2; a corrupt file: exit 3, naming it
"$kiln" eval "$tmp/run.ini" --checkpoint "$ref" layer.fc1.out=256 > /dev/null 2> "$tmp/eval.err"
[ $? -eq 2 ] || fail "kiln eval with another model: exit code, expected 2"
grep -q 'holds another model' "$tmp/eval.err" || fail "kiln eval: no 'holds another model'"
head -c 1000 "$ref" > "$tmp/cut.kiln"
"$kiln" eval "$tmp/run.ini" --checkpoint "$tmp/cut.kiln" > /dev/null 2> "$tmp/eval.err"
[ $? -eq 3 ] || fail "kiln eval of a truncated file: exit code, expected 3"
grep -q "$tmp/cut.kiln: truncated" "$tmp/eval.err" || fail "kiln eval: no 'truncated' naming the file"
echo "kiln eval: the run's accuracy ($acc); another model and a truncated file refused"

# SIGTERM: once training has started, stop with a checkpoint, exit 0
out="$tmp/term"
"$kiln" train "$tmp/run.ini" run.out_dir="$out" train.checkpoint_every=0 > "$tmp/term.log" 2>&1 &
pid=$!
n=0
until grep -q '"event":"train"' "$out/metrics.jsonl" 2>/dev/null; do
	n=$((n + 1))
	[ $n -le 600 ] || { kill -9 "$pid"; fail "training did not start"; }
	sleep 0.01
done
kill -TERM "$pid"
wait "$pid"
rc=$?
[ $rc -eq 0 ] || fail "SIGTERM: exit $rc, expected 0"
if grep -q 'checkpoint written to' "$tmp/term.log"; then
	grep -q 'resume with --resume' "$tmp/term.log" || fail "SIGTERM: no resume hint"
	grep -q '"stopped": true' "$tmp/term.log" || fail "SIGTERM: no \"stopped\" in the JSON line"
	"$kiln" train "$tmp/run.ini" run.out_dir="$out" train.checkpoint_every=100 --resume \
		> "$tmp/term2.log" 2>&1 || fail "resuming after SIGTERM failed"
	grep -q 'resumed_step' "$tmp/term2.log" || fail "the run after SIGTERM did not resume"
	"$tool" same "$ref" "$out/checkpoints/ckpt-60.kiln" $STATE ||
		fail "SIGTERM + resume: final state differs"
	echo "SIGTERM: checkpoint, exit 0, resumed to the identical final state"
else
	# it finished before the signal arrived
	grep -q 'final test accuracy' "$tmp/term.log" || fail "SIGTERM: neither stopped nor finished"
	echo "SIGTERM: the run had finished already"
fi
echo "PASS"
