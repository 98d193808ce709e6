#!/bin/sh
# tests/dist_plateau.sh - [train] schedule = plateau (ReduceLROnPlateau on
# each evaluation point's loss, core/train_plateau.c) on several ranks:
# rank 0's loss, agreed (core/train_eval.c, eval_agree), cuts every rank's
# rate alike, so the run is one process's with the same global batch.
# tests/sched_plateau.sh checks the rates against PyTorch's rule in one
# process; this test compares the ranks with that process.
#
# The 48 tr_cnn images (tests/data, 8x8, 5 classes), an MLP (16 hidden),
# global batch 8 (6 steps an epoch), 4 epochs, an evaluation of the same
# images every 2 steps, lr 0.5 with momentum 0.9, plateau_factor 0.5,
# patience 1, threshold 0.02 (rel: the rate is halved after a second
# evaluation in a row that does not improve the best loss by 2%; here
# at steps 8, 12, 16 and 22, the best improved at steps 4 and 18; the
# nearest call, step 16's, 4e-4 relative from the threshold, the runs
# 1e-7 apart).  Runs on gloo:
#   ddp   2 ranks, batch 4
#   zero  2 ranks, batch 4, [dist] zero = 1
#   pipe  2 stages on 2 ranks ([dist] pipeline = 2, D = 1), batch 8 in 2
#         micro-batches, fc2 and the loss on stage 1
#   pipez the same with [dist] zero = 1: each evaluation on the gathered
#         model, sharded over both ranks (core/train_eval.c, eval_gathered)
# Each equals the 1-process run (batch 8): every step's logged lr
# (metrics.jsonl, log_every = 1) within 1e-6 relative, every evaluation's
# loss within 1e-5 relative, and ckpt-24.kiln's params and momentum
# within 1e-5 (ckpt_tool close, as tests/dist_zero.sh); and the rate is
# cut at least once (each run's rank 0 logs "lr 0.5 -> 0.25", and the
# last step's lr is below 0.5).  Each resumed from its
# ckpt-12.kiln (after 2 cuts: the checkpoint's "plateau" section, read by
# rank 0 and broadcast, or by each stage's rank in pipe) resumes at step 13's
# rate and ends with the uninterrupted run's ckpt-24.kiln, its params,
# momentum and plateau state byte for byte; and its "trained weights"
# lines are the uninterrupted run's: rank 0's ckpt-24.kiln alone (before
# session 44 pipe's rank 1, which read ckpt-12.kiln itself, named it).
name=dist_plateau needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
need_source idx

ini="$tmp/p.ini"
{
	ini run seed=3 threads=1
	ini_tr_cnn_mlp "$srcdir/tests/data" 16
	ini train epochs=4 max_steps=0 batch=8 lr=0.5 momentum=0.9 eval=1 eval_every=2 log_every=1 \
		checkpoint_every=6 schedule=plateau plateau_factor=0.5 plateau_patience=1 \
		plateau_threshold=0.02
	ini dist timeout=60 heartbeat=60
} > "$ini"

# lrs DIR: "step lr" a line each, the train events of DIR/metrics.jsonl
lrs() {
	awk '/"event": *"train"/ && match($0, /"step": *[0-9]+/) {
		s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
		if (match($0, /"lr": *[^,}]*/)) { v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); print s, v } }' \
		"$1/metrics.jsonl"
}
# losses DIR: "step loss" a line each, the eval events
losses() {
	awk '/"event": *"eval"/ && match($0, /"step": *[0-9]+/) {
		s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
		if (match($0, /"loss": *[^,}]*/)) { v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); print s, v } }' \
		"$1/metrics.jsonl"
}
# agree A B TOL WHAT: the "step value" lists A and B name the same steps,
# each value of B within TOL relative of A's
agree() {
	LC_ALL=C join "$1" "$2" > "$1.join"
	[ "$(wc -l < "$1.join")" = "$(wc -l < "$1")" ] && [ "$(wc -l < "$1")" = "$(wc -l < "$2")" ] &&
		[ -s "$1" ] &&
		awk -v t="$3" '{ d = $2 - $3; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
			if (!(d <= t * m)) { print "step " $1 ": " $2 " vs " $3; bad = 1 } } END { exit bad }' "$1.join" ||
		{ bad "$4"; paste "$1" "$2" | head -30; }
}

KILN_MASTER_PORT=$(free_port 3) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/one" \
	> "$tmp/one.log" 2>&1 || { bad "the 1-process run failed"; tail -20 "$tmp/one.log"; }
lrs "$tmp/one" | LC_ALL=C sort > "$tmp/one.lr"
losses "$tmp/one" | LC_ALL=C sort > "$tmp/one.loss"
[ "$(wc -l < "$tmp/one.lr")" = 24 ] || bad "one: $(wc -l < "$tmp/one.lr") train events with an lr, want 24"
r13=$(awk '$1 == 13 { print $2 }' "$tmp/one.lr")

for how in ddp zero pipe pipez; do
	n=2
	case $how in
	ddp) set -- train.batch=4 ;;
	zero) set -- train.batch=4 dist.zero=1 ;;
	pipe) set -- dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2 ;;
	pipez) set -- dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2 dist.zero=1 ;;
	esac
	KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n $n -- "$kiln" train "$ini" \
		run.comm=gloo run.out_dir="$tmp/$how" "$@" > "$tmp/$how.log" 2>&1 ||
		{ bad "$how: kiln launch failed"; tail -20 "$tmp/$how.log"; continue; }
	lrs "$tmp/$how" | LC_ALL=C sort > "$tmp/$how.lr"
	losses "$tmp/$how" | LC_ALL=C sort > "$tmp/$how.loss"
	agree "$tmp/one.lr" "$tmp/$how.lr" 1e-6 "$how: the steps' lr are not the 1-process run's"
	agree "$tmp/one.loss" "$tmp/$how.loss" 1e-5 "$how: the evaluations' losses are not the 1-process run's"
	"$tool" close "$(ck one 24)" "$(ck "$how" 24)" 1e-5 params optim.momentum ||
		bad "$how: ckpt-24.kiln's weights are not the 1-process run's"
	grep -q "schedule = plateau: test loss .* lr 0.5 -> 0.25" "$tmp/$how.log" ||
		bad "$how: no cut of the rate from 0.5 to 0.25 logged"
	echo "$how: lr by step $(sort -n "$tmp/$how.lr" | awk '{ printf "%s ", $2 }')"
	[ $how != pipez ] || [ "$(grep -c "the model is created and initialised whole at start-up: ZeRO-1" "$tmp/$how.log")" = 2 ] ||
		bad "pipez: the ranks do not evaluate the gathered model"
	rm -rf "$tmp/${how}r"
	mkdir -p "$tmp/${how}r/checkpoints"
	cp "$(ck "$how" 12)" "$tmp/${how}r/checkpoints/"
	KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n $n -- "$kiln" train "$ini" \
		run.comm=gloo run.out_dir="$tmp/${how}r" "$@" --resume > "$tmp/${how}r.log" 2>&1 ||
		{ bad "${how}r: the resumed run failed"; tail -20 "$tmp/${how}r.log"; continue; }
	r=$(sed -n 's/.*resume: schedule = plateau at lr \([0-9.e+-]*\) .*/\1/p' "$tmp/${how}r.log")
	awk -v a="$r" -v b="$r13" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d * d <= 1e-12 * b * b) }' ||
		bad "${how}r: resumed at lr '$r', not step 13's $r13"
	"$tool" same "$(ck "$how" 24)" "$(ck "${how}r" 24)" params optim.momentum plateau ||
		bad "${how}r: resumed at step 12, ckpt-24.kiln differs from the uninterrupted run's"
	# the ranks name the final weights as the uninterrupted run's do:
	# rank 0 ckpt-24.kiln, the others none (before session 44 a stage's
	# rank that read ckpt-12.kiln itself named it)
	grep "^trained weights: " "$tmp/$how.log" | sed "s|$tmp/$how/|OUT/|" | sort > "$tmp/$how.named"
	grep "^trained weights: " "$tmp/${how}r.log" | sed "s|$tmp/${how}r/|OUT/|" | sort > "$tmp/${how}r.named"
	{ [ "$(wc -l < "$tmp/$how.named")" = 1 ] && grep -q "^trained weights: OUT/checkpoints/ckpt-24.kiln " "$tmp/$how.named" &&
		cmp -s "$tmp/$how.named" "$tmp/${how}r.named"; } ||
		{ bad "${how}r: the ranks' \"trained weights\" are not the uninterrupted run's (rank 0's ckpt-24.kiln alone)"; cat "$tmp/$how.named" "$tmp/${how}r.named"; }
done
grep -q "schedule = plateau: test loss .* lr 0.5 -> 0.25" "$tmp/one.log" ||
	bad "one: no cut of the rate from 0.5 to 0.25 logged"
last=$(sort -n "$tmp/one.lr" | tail -1 | cut -d' ' -f2)
awk -v l="$last" 'BEGIN { exit !(l != "" && l < 0.5 * (1 - 1e-6)) }' ||
	bad "one: the last step's lr is '$last': the rate was never cut"
echo "one: lr by step $(sort -n "$tmp/one.lr" | awk '{ printf "%s ", $2 }')"

[ "$fail" = 0 ] && echo "ok: schedule = plateau on 2 ranks (DDP, ZeRO-1, 2 stages, 2 ZeRO-1 stages) is one process's"
exit $fail
