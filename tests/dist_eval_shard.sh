#!/bin/sh
# tests/dist_eval_shard.sh - data-parallel ranks shard the evaluation set
# (session 43; core/train_eval.c eval_share, eval_shares_sum): each rank
# evaluates its contiguous run of the set's batches, every sample once,
# and the ranks add their shares' sums (the counts exactly), so every
# rank logs the whole set's numbers.  Before, every rank evaluated the
# whole set (D times the work).
#
# The sets are IDX files this test writes (8x8 images, 10 classes):
# 256 training samples, a [data.eval] of 203 (eval_batch 16: 12 full
# batches and one of 11, 203 not a multiple of 2 x 16; rank 0 evaluates
# batches 0-5, samples 0-95, rank 1 batches 6-12, samples 96-202) and a
# [data.val] of 77.  The model has a batchnorm, whose running statistics
# differ between the ranks (each rank's own batches, no sync_bn): before
# the pass every rank takes rank 0's (kiln_dist_eval_buffers), so that
# the evaluation is of the model rank 0 checkpoints.
#  1. 2 ranks on gloo (plain, ZeRO-1) and 4 ranks as 2 pipelines of 2
#     stages evaluating per stage (the set sharded over the 2 pipes): the
#     run's [data.val] evaluation at its last step (metrics.jsonl) and
#     its final test on [data.eval] (test_loss, test_acc) equal a
#     1-process `kiln eval` of the run's last checkpoint on those sets:
#     the loss within 1e-5 relative (the device's f32 sums add the batches
#     in another order: each rank its run, then the ranks' totals; equal
#     to the JSON's 6 decimals here), the accuracy within 6e-7 (its counts
#     are exact integers both ways: the same number, as the JSON's 6
#     decimals print it).  Without the buffers' broadcast the sharded loss differs
#     by 2e-4 to 1e-3 relative, and the pipeline's test accuracy by 0.5%
#     (rank 1's share normalised by rank 1's statistics; measured in
#     session 43 with the broadcast switched off: this section failed).
#  2. each rank reads its share alone: the set as PNG files (`kiln pack
#     --format folder`) with one that does not decode, the last (sample
#     202, rank 1's share) or the second (sample 1, rank 0's): only the
#     share's rank fails on it, naming it, the other "rank R failed (its
#     message says why)" (tests/eval_fault.sh's agreement).  Before, both
#     ranks read it and each named its own failure.
#     The same with 2 stages on 2 ranks evaluating the gathered model
#     (frozen parameters: [layer.conv1] trainable = 0 keeps the model whole,
#     docs/pipeline.md): each of the pipe's ranks reads its own share, as
#     two data-parallel ranks do.  Before session 44 both evaluated the
#     pipe's share, the whole set, and both failed on either PNG.
#  1 also runs a [data.eval] limit of 16 (one batch: rank 1's share empty),
#     and 2 pipelines of 2 stages with ZeRO-1 (each stage's data-parallel
#     ranks): the stages' parameters are gathered whole for an evaluation
#     (core/train_eval.c, eval_gathered), which is then sharded over all 4
#     ranks (since session 44).
#  3. on_error = skip with that PNG in rank 1's share (2 ranks; 2 pipes of
#     2 stages, the second pipe's; and 2 pipes of 2 stages with ZeRO-1,
#     evaluating the gathered model, rank 3's share): rank 0's count of bad
#     samples replaced is a 1-process run's (the evaluations' skips summed
#     over the ranks, a pipe's counted once per stage, each rank's once on
#     the gathered model).
name=dist_eval_shard needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
need_python3
need_source idx

"$py" - "$tmp" <<'PY' || exit 99
import random, struct, sys
rng = random.Random(43)
def write(stem, n):
    labels = [rng.randrange(10) for _ in range(n)]
    img = bytearray()
    for y in labels:
        # a class's band of brighter rows, with noise: learnable, not trivial
        for r in range(8):
            for c in range(8):
                img.append(min(255, rng.randrange(0, 120) + (120 if r == y % 8 else 0)))
    open("%s/%s-img.idx" % (sys.argv[1], stem), "wb").write(struct.pack(">IIII", 0x803, n, 8, 8) + bytes(img))
    open("%s/%s-lab.idx" % (sys.argv[1], stem), "wb").write(struct.pack(">II", 0x801, n) + bytes(labels))
write("train", 256)
write("test", 203)
write("val", 77)
PY

ini="$tmp/s.ini"
{
	ini run seed=5 threads=1
	ini data source=idx path="$tmp" images=train-img.idx labels=train-lab.idx workers=0 \
		mean=0.3 std=0.3
	ini data.eval images=test-img.idx labels=test-lab.idx
	ini data.val images=val-img.idx labels=val-lab.idx
	ini_layers conv1:conv:out=4:kernel=3:padding=1 bn1:batchnorm r1:relu flat:flatten \
		fc:linear:out=10 loss:softmax_xent
	ini_sgd_steps 6 batch=16 eval_batch=16 eval_every=3 log_every=3 checkpoint_every=0 keep_best=1
	ini dist timeout=60 heartbeat=60
} > "$ini"

# within L A B TOL [abs]: |A - B| <= TOL x |B| (TOL itself with abs)
within() {
	awk -v a="$2" -v b="$3" -v t="$4" -v abs="${5:-}" 'BEGIN { d = a - b; if (d < 0) d = -d;
		m = b < 0 ? -b : b; if (abs != "" || m == 0) m = 1;
		exit !(a != "" && b != "" && d <= t * m) }' ||
		bad "$1: $2, the 1-process kiln eval's $3 (tolerance $4${5:+ absolute})"
}
# jfield KEY SET FILE: KEY of the last eval record of SET in metrics.jsonl FILE
jfield() {
	grep '"event": *"eval"' "$3" | grep "\"set\": *\"$2\"" | tail -1 |
		sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"
}

# ---- 1. the numbers -----------------------------------------------------------------
for how in ddp zero pipe pipez tiny; do
	n=2 ns=203 lim=data.eval.limit=0
	case $how in
	zero) set -- dist.zero=1 ;;
	pipe) n=4; set -- dist.pipeline=2 layer.fc.stage=1 pipeline.micro_batches=2 ;;
	pipez) n=4; set -- dist.pipeline=2 layer.fc.stage=1 pipeline.micro_batches=2 dist.zero=1 ;;
	tiny) ns=16 lim=data.eval.limit=16; set -- ;; # one batch: rank 1's share empty
	*) set -- ;;
	esac
	KILN_MASTER_PORT=$(free_port 3) timeout 300 "$kiln" launch -n $n -- "$kiln" train "$ini" \
		run.comm=gloo run.out_dir="$tmp/$how" $lim "$@" > "$tmp/$how.out" 2> "$tmp/$how.log"
	rc=$?
	[ $rc = 0 ] || { bad "$how: kiln launch exited $rc"; tail -20 "$tmp/$how.log"; continue; }
	ck6=$(ck "$how" 6)
	[ -f "$ck6" ] || { bad "$how: no ckpt-6.kiln"; continue; }
	[ -n "$(ls "$tmp/$how/checkpoints/best" 2>/dev/null)" ] || bad "$how: keep_best wrote no best/ checkpoint"
	if [ $how = pipe ]; then
		grep -q "holds the stage's parameters and gradients alone" "$tmp/$how.log" ||
			bad "pipe: the evaluation did not run per stage"
	fi
	if [ $how = pipez ]; then
		[ "$(grep -c "the model is created and initialised whole at start-up: ZeRO-1" "$tmp/$how.log")" = 4 ] ||
			bad "pipez: the ranks do not evaluate the gathered model"
	fi
	"$kiln" eval "$ini" --checkpoint "$ck6" $lim > "$tmp/$how.test" 2> "$tmp/$how.test.err" ||
		{ bad "$how: kiln eval of ckpt-6 failed"; cat "$tmp/$how.test.err"; continue; }
	"$kiln" eval "$ini" --checkpoint "$ck6" data.eval.images=val-img.idx data.eval.labels=val-lab.idx \
		> "$tmp/$how.val" 2> "$tmp/$how.val.err" ||
		{ bad "$how: kiln eval of ckpt-6 on the val set failed"; cat "$tmp/$how.val.err"; continue; }
	tl=$(field test_loss "$tmp/$how.out") ta=$(field test_acc "$tmp/$how.out")
	el=$(field test_loss "$tmp/$how.test") ea=$(field test_acc "$tmp/$how.test")
	vl=$(jfield loss val "$tmp/$how/metrics.jsonl") va=$(jfield acc val "$tmp/$how/metrics.jsonl")
	wl=$(field test_loss "$tmp/$how.val") wa=$(field test_acc "$tmp/$how.val")
	echo "$how, $n ranks: test loss $tl acc $ta (kiln eval: $el $ea); val loss $vl acc $va (kiln eval: $wl $wa)"
	within "$how: the final test's loss" "$tl" "$el" 1e-5
	within "$how: the final test's accuracy" "$ta" "$ea" 6e-7 abs
	within "$how: step 6's val loss" "$vl" "$wl" 1e-5
	within "$how: step 6's val accuracy" "$va" "$wa" 6e-7 abs
	[ "$(field test_samples "$tmp/$how.out")" = $ns ] || bad "$how: test_samples is not $ns"
done

# ---- 2. each rank reads its share ---------------------------------------------------
need_source folder
"$kiln" pack "$ini" --format folder --store png --section data.eval --out "$tmp/png" \
	> "$tmp/pack.log" 2>&1 || { bad "kiln pack failed"; cat "$tmp/pack.log"; }
find "$tmp/png/test" -name '*.png' | sort > "$tmp/pngs"
[ "$(wc -l < "$tmp/pngs")" = 203 ] || bad "kiln pack wrote $(wc -l < "$tmp/pngs") PNGs, not 203"
{
	ini run seed=5 threads=1
	ini data source=idx path="$tmp" images=train-img.idx labels=train-lab.idx workers=0 \
		mean=0.3 std=0.3
	ini data.eval source=folder path="$tmp/png/test" channels=1 size=8
	ini_layers conv1:conv:out=4:kernel=3:padding=1 bn1:batchnorm r1:relu flat:flatten \
		fc:linear:out=10 loss:softmax_xent
	ini_sgd_steps 1 batch=16 eval_batch=16 eval_every=1 checkpoint_every=0 checkpoint_last=0
	ini dist timeout=60 heartbeat=60
} > "$tmp/share.ini"
# share WHICH OWNER OTHER SAMPLE [NAME OVERRIDES...]: PNG number WHICH
# (sed's line: SAMPLE + 1) cut to 40 bytes; the run's step-1 evaluation
# fails on OWNER's rank alone (the run $tmp/share<NAME><OWNER>)
share() {
	_w=$1 _o=$2 _x=$3 _s=$4 _n=share${5:-}$2
	shift 4
	[ $# = 0 ] || shift
	_f=$(sed -n "${_w}p" "$tmp/pngs")
	cp "$_f" "$tmp/good.png"
	head -c 40 "$tmp/good.png" > "$_f"
	KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n 2 -- "$kiln" train \
		"$tmp/share.ini" run.comm=gloo run.out_dir="$tmp/$_n" "$@" > "$tmp/$_n.log" 2>&1
	_rc=$?
	cp "$tmp/good.png" "$_f"
	[ $_rc != 0 ] && [ $_rc -lt 124 ] || bad "$_n: exit $_rc, want a failure"
	grep -q "rank $_x of 2: step 1's evaluation: rank $_o failed (its message says why)" "$tmp/$_n.log" ||
		bad "$_n: rank $_x did not name rank $_o's failure (rank $_x read sample $_s?)"
	grep -q "rank $_o of 2.*undecodable PNG" "$tmp/$_n.log" ||
		bad "$_n: rank $_o did not fail on the PNG of its share"
	! grep -q "rank $_x of 2.*undecodable PNG" "$tmp/$_n.log" ||
		bad "$_n: rank $_x read sample $_s, which is rank $_o's"
	[ "$fail" = 0 ] || grep -i "error\|fail" "$tmp/$_n.log" | head -8
}
share 203 1 0 202
share 2 0 1 1
# 2 stages on 2 ranks, the parameters gathered whole for the evaluation
# (frozen conv1: no rank holds its stage's alone), each rank its share
gp="dist.pipeline=2 layer.fc.stage=1 pipeline.micro_batches=2 layer.conv1.trainable=0"
# shellcheck disable=SC2086
share 203 1 0 202 pipe $gp
grep -q "the model is created and initialised whole at start-up: frozen parameters" "$tmp/sharepipe1.log" ||
	bad "sharepipe1: the ranks do not evaluate the gathered model"
# shellcheck disable=SC2086
share 2 0 1 1 pipe $gp

# ---- 3. the skipped-sample count is every rank's -------------------------------------
# on_error = skip, the undecodable PNG in rank 1's share (sample 202): rank
# 0's count of bad samples replaced (the run's result, its log line) is a
# 1-process run's (each evaluation's skip counted once).  Before, rank 0
# added its own evaluations' skips alone: none (no line, data_skipped 0).
_f=$(sed -n 203p "$tmp/pngs")
cp "$_f" "$tmp/good.png"
head -c 40 "$tmp/good.png" > "$_f"
"$kiln" train "$tmp/share.ini" data.on_error=skip run.out_dir="$tmp/skip1" \
	> "$tmp/skip1.out" 2> "$tmp/skip1.log" || bad "skip: the 1-process run failed"
KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n 2 -- "$kiln" train \
	"$tmp/share.ini" data.on_error=skip run.comm=gloo run.out_dir="$tmp/skip2" \
	> "$tmp/skip2.out" 2> "$tmp/skip2.log" || bad "skip: the 2-rank run failed"
# 2 pipes of 2 stages, evaluating per stage (each stage reads the pipe's share)
KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n 4 -- "$kiln" train \
	"$tmp/share.ini" data.on_error=skip run.comm=gloo run.out_dir="$tmp/skip4" \
	dist.pipeline=2 layer.fc.stage=1 pipeline.micro_batches=2 \
	> "$tmp/skip4.out" 2> "$tmp/skip4.log" || bad "skip: the 4-rank pipeline run failed"
# 2 pipes of 2 stages with ZeRO-1, evaluating the gathered model (each
# rank its share: sample 202 is rank 3's)
KILN_MASTER_PORT=$(free_port 5) timeout 120 "$kiln" launch -n 4 -- "$kiln" train \
	"$tmp/share.ini" data.on_error=skip run.comm=gloo run.out_dir="$tmp/skipz" \
	dist.pipeline=2 layer.fc.stage=1 pipeline.micro_batches=2 dist.zero=1 \
	> "$tmp/skipz.out" 2> "$tmp/skipz.log" || bad "skip: the 4-rank ZeRO-1 pipeline run failed"
cp "$tmp/good.png" "$_f"
s1=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced (on_error = skip)$/\1/p' "$tmp/skip1.log")
s2=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced over every rank (on_error = skip)$/\1/p' "$tmp/skip2.log")
s4=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced over every rank (on_error = skip)$/\1/p' "$tmp/skip4.log")
sz=$(sed -n 's/.*warning: \([0-9]*\) bad sample(s) skipped and replaced over every rank (on_error = skip)$/\1/p' "$tmp/skipz.log")
echo "bad samples skipped: 1 process $s1, 2 ranks $s2, 2 pipes of 2 stages $s4, with ZeRO-1 (gathered) $sz"
[ "$sz" = "$s1" ] || bad "skip: 2 pipes of 2 stages with ZeRO-1 reported '$sz' skips over every rank, a 1-process run $s1"
[ "$s4" = "$s1" ] || bad "skip: 2 pipes of 2 stages reported '$s4' skips over every rank, a 1-process run $s1"
[ -n "$s1" ] && [ "$s1" -gt 0 ] || bad "skip: the 1-process run reported '$s1' skips, want > 0"
[ "$s2" = "$s1" ] || bad "skip: 2 ranks reported '$s2' skips over every rank, a 1-process run $s1"

[ "$fail" = 0 ] && echo "ok: each rank evaluates its share; the sums are a 1-process evaluation's"
exit $fail
