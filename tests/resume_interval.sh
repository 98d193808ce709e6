#!/bin/sh
# tests/resume_interval.sh - a resume between two log points goes on with
# the log interval open at the checkpoint (its "interval" section, session
# 39; docs/checkpoints.md, docs/logging.md).  The dist tests' MLP on
# Fashion-MNIST, 2 epochs of 32 steps of a global batch of 64, log_every 7;
# a run cut at step 40 (a checkpoint there, the one of step 45 removed:
# the interval of steps 36..40 open) or at max_steps 45 (its log point
# there, which the uninterrupted run has not, closed the interval 43..45),
# then resumed to the end (the latter on 1 process and 2 ranks), must log the uninterrupted run's train rows
# (metrics.jsonl, the later row of a step kept as docs/logging.md says;
# time, samples_per_s and data_wait apart), end with its final train_loss
# and its last checkpoint's "epoch" section bit for bit:
#  1. one process; an interval whose samples are not the epoch
#     section's is refused (exit 3), and so are values no run trains
#     (crafted: a correct count of 1e30, a NaN loss sum with no step
#     skipped; session 40);
#  2. 2 ranks (gloo), every rank's sums its own; the finished run's last
#     checkpoint written again by a resume on 1 process (its owed
#     evaluation) keeps its interval, in 1 process's layout: resumed to
#     the end, the rows of the 1-process resume of the 2 ranks' file
#     (session 40);
#  3. 2 ranks with ZeRO-1;
#  4. 2 pipeline stages on 2 ranks (one pipe: batch 64);
#  5. a 2-rank checkpoint resumed on 1 process: the first row after the
#     resume averages the whole interval, the 2 ranks' sums on 1 (1e-5);
#     one whose interval is no whole share of 3 ranks (a global batch
#     changed with the world) starts it afresh, said.
# Before session 39 the resumed device sums started at 0: the first row
# averaged the steps after the resume alone (0.5546 for 0.5316 in a run of
# log_every 7), and the epoch's train_loss differed in the last bits.
name=resint needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60 gloo

# same_rows REF CUT CUT_END: CUT's train rows (the later of a step kept)
# are REF's, bar the time fields, and CUT has no other row but its cut
# run's last (CUT_END: the log point max_steps put there; - for none);
# the final train_loss the same double
same_rows() {
	/usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'EOF' || bad "$2: its rows differ from $1's"
import json, sys
def load(p):
    rows, fin = {}, None
    for line in open(p):
        j = json.loads(line)
        if j["event"] == "train":
            rows[j["step"]] = j   # the later row of a step counts
        elif j["event"] == "final":
            fin = j
    return rows, fin
(a, fa), (b, fb) = load(sys.argv[1]), load(sys.argv[2])
skip = {"time", "samples_per_s", "data_wait"}
bad = 0
extra = set(b) - set(a) - ({int(sys.argv[3])} if sys.argv[3] != "-" else set())
if set(a) - set(b) or extra:
    print("steps missing", sorted(set(a) - set(b)), "extra", sorted(extra)); bad = 1
for s in sorted(set(a) & set(b)):
    for k in set(a[s]) | set(b[s]):
        if k not in skip and a[s].get(k) != b[s].get(k):
            print("step %d %s: %r, uninterrupted %r" % (s, k, b[s].get(k), a[s].get(k))); bad = 1
if fa["train_loss"] != fb["train_loss"]:
    print("final train_loss %r, uninterrupted %r" % (fb["train_loss"], fa["train_loss"])); bad = 1
sys.exit(bad)
EOF
	"$tool" same "$(ck "$1" 64)" "$(ck "$2" 64)" epoch params ||
		bad "$2: the last checkpoint's epoch sums differ from $1's"
}

# cuts NAME CLOSED NPROC BATCH [overrides...]: the uninterrupted run NAME
# and the run cut at max_steps 45 with a checkpoint at step 40 too
# (NAME_w, kept for section 5), resumed from step 40 (NAME_o) and, when
# CLOSED is 1, from step 45 (NAME_c)
cuts() {
	_c=$1 _closed=$2
	shift 2
	run "$_c" "$@" train.log_every=7
	run "${_c}_w" "$@" train.log_every=7 train.max_steps=45 train.checkpoint_every=40
	cp -r "$tmp/${_c}_w" "$tmp/${_c}_o"
	rm "$(ck "${_c}_o" 45)"
	run "${_c}_o" "$@" train.log_every=7 train.resume=1
	grep -q "resuming from .*ckpt-40.kiln" "$tmp/${_c}_o.log" || bad "${_c}_o did not resume at step 40"
	same_rows "$_c" "${_c}_o" 45
	if [ "$_closed" = 1 ]; then
		cp -r "$tmp/${_c}_w" "$tmp/${_c}_c"
		run "${_c}_c" "$@" train.log_every=7 train.resume=1
		same_rows "$_c" "${_c}_c" 45
	fi
	echo "ok: $_c: resumed between log points at step 40 (and after max_steps 45: $_closed), the uninterrupted rows"
}

# ---- 1-4 ----------------------------------------------------------------
cuts one 1 0 64
"$tool" sections "$(ck one_w 40)" | grep -q '^interval 112 ' ||
	bad "one process: no 112-byte interval section in ckpt-40.kiln"
# an interval whose samples are not the epoch section's (its samples, i64
# element 2, set to 400, the CRCs redone; before session 40 1065353216,
# which is more than the epoch holds: refused now as below) is refused,
# exit 3
mkdir -p "$tmp/mism/checkpoints"
cp "$(ck one_w 40)" "$tmp/mism/checkpoints/"
"$tool" int "$(ck mism 40)" interval 2 400 || bad "ckpt_tool int failed"
run_rc=0
KILN_MASTER_PORT=$(free_port 9) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/mism" \
	train.batch=64 train.log_every=7 train.resume=1 > "$tmp/mism.log" 2>&1 || run_rc=$?
[ "$run_rc" = 3 ] && grep -q "mism/checkpoints/ckpt-40.kiln: section 'interval' (192 + 400 samples a rank, 1 ranks in 1 stage(s)) does not match section 'epoch' (512 samples)" "$tmp/mism.log" ||
	{ bad "an interval that does not match the epoch's sums: exit $run_rc"; tail -3 "$tmp/mism.log"; }
# values no run trains (crafted: the CRCs redone) are refused, exit 3,
# naming the file and the section (session 40; before, accepted and
# seeded): rank 0's correct count (f32 element 21: the 80-byte head is 20
# floats, then loss, correct, top-5) 1e30, its loss sum (element 20) NaN
# with no step skipped
refused() { # refused NAME INDEX VALUE WHY
	rm -rf "$tmp/$1"
	mkdir -p "$tmp/$1/checkpoints"
	cp "$(ck one_w 40)" "$tmp/$1/checkpoints/"
	"$tool" set "$(ck "$1" 40)" interval "$2" "$3" || bad "ckpt_tool set failed"
	run_rc=0
	KILN_MASTER_PORT=$(free_port 9) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/$1" \
		train.batch=64 train.log_every=7 train.resume=1 > "$tmp/$1.log" 2>&1 || run_rc=$?
	[ "$run_rc" = 3 ] && grep -q "checkpoint $(ck "$1" 40): section 'interval': $4" "$tmp/$1.log" ||
		{ bad "$1: an interval section with $3 at element $2: exit $run_rc"; tail -3 "$tmp/$1.log"; }
}
refused forged 21 1e30 "more than its run trained ([0-9]* rows of 320 samples, correct 1e+30 of 320 samples on each of 1 ranks in it)"
refused nanloss 20 nan "a loss sum that is not finite (a rank's, in the interval) with no step skipped for non-finite gradients there (0 skipped by its start, 0 by the checkpoint's step)"
echo "ok: one: crafted interval values refused"
cuts two 1 2 32
"$tool" sections "$(ck two_w 40)" | grep -q '^interval 144 ' ||
	bad "2 ranks: no 144-byte interval section (2 ranks' sums) in ckpt-40.kiln"
# a resume with no step left on another layout (1 process) writes the
# last checkpoint again (the evaluation after its step, owed: eval on
# now) with the interval closed at max_steps 45 in its layout (112 bytes:
# 1 rank), as its "trainer" and "epoch" sections are (session 40; before,
# dropped); resumed to the end on 1 process, the rows and sums of the
# same resume from the 2 ranks' own ckpt-45.kiln (the interval's
# rescale, the same sums in the same order) bit for bit
cp -r "$tmp/two_w" "$tmp/two_f"
cp -r "$tmp/two_w" "$tmp/two_d"
run two_f 0 64 train.log_every=7 train.max_steps=45 train.eval=1 train.resume=1
grep -q "checkpoint .*two_f/checkpoints/ckpt-45.kiln again" "$tmp/two_f.log" ||
	bad "two_f: the finished run's checkpoint was not written again"
"$tool" sections "$(ck two_f 45)" | grep -q '^interval 112 ' ||
	bad "two_f: the rewritten ckpt-45.kiln has no 112-byte interval section (1 rank's)"
run two_f 0 64 train.log_every=7 train.eval=1 train.resume=1
run two_d 0 64 train.log_every=7 train.eval=1 train.resume=1
same_rows two_d two_f -
echo "ok: two_f: a finished 2-rank run's checkpoint written again on 1 process keeps its interval"
cuts zero 0 2 32 dist.zero=1
cuts pipe 0 2 64 dist.pipeline=2 layer.fc2.stage=1

# ---- 5. another world size ----------------------------------------------
# the first row after the resume at step 40 (step 42) against the 2-rank
# run's: 1 process sums both ranks' f32 sums, in f64 (the parameters after
# the resume differ in the last bits too)
row42() { sed -n 's/.*"event":"train","epoch":2,"step":42,"loss":\([0-9.e-]*\).*/\1/p' "$tmp/$1/metrics.jsonl" | tail -1; }
rm "$(ck two_w 45)"
run two_w 0 64 train.log_every=7 train.resume=1
grep -q "resume: the log interval open at the checkpoint (steps 36..40, 2 rank(s) in 1 stage(s)) goes on over 1 rank(s) in 1 stage(s)" \
	"$tmp/two_w.log" || bad "2 ranks resumed on 1: the interval's rescale is not logged"
a=$(row42 two) b=$(row42 two_w)
echo "step 42's loss: 2 ranks $a, resumed from them on 1 process $b"
[ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-5 * a && -d < 1e-5 * a) }' ||
	bad "2 ranks resumed on 1: step 42's loss $b, the 2 ranks' $a"
# cut at step 35 with log_every 2 (the interval: step 35, 32 samples on each
# of 2 ranks) and resumed on 3 ranks of batch 64: no whole share a rank
run odd 2 32 train.log_every=2 train.max_steps=35
run odd 3 64 train.log_every=2 train.resume=1
grep -q "resume: the log interval open at the checkpoint (32 samples on each of 2 rank(s)) is no whole share of 3 ranks" \
	"$tmp/odd.log" || bad "2 ranks resumed on 3: the interval started afresh is not said"
exit $fail
