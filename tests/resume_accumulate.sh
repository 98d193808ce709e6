#!/bin/sh
# tests/resume_accumulate.sh - [train] accumulate may change on resume
# (session 40; core/resume.c safe_keys, core/train_resume_batch.c).  The
# dist tests' MLP on 2048 Fashion-MNIST samples, a cosine schedule with
# warmup and lr_scale = linear over base_batch 32.  Each uninterrupted run
# writes checkpoints every 40 steps and ends at step 128; a copy of it cut
# at step 40 (the later checkpoints removed) resumes with its global
# batch G (batch x accumulate x ranks) split another way, and must end
# with the uninterrupted run's weights (its last checkpoint's, exported to
# safetensors, compared in python3's stdlib: within 1e-5 absolute and
# 1e-4 of the largest weight; 3e-8 measured, the micro-batches' gradients
# being added in another order) and its learning rates bit for bit (every
# train row of metrics.jsonl after the resume):
#  1. AdamW, 2 ranks x batch 16 -> 1 process x batch 16 x accumulate 2 (a
#     2-GPU run moved to 1 GPU whose batch of 32 would not fit): said,
#     with the micro-batches' other samples (each rank takes every other
#     sample of a step's: the loss's mean per micro-batch);
#  2. SGD with momentum (where a wrong 1/accumulate loss seed would show,
#     as AdamW's update nearly hides a gradient's scale), 1 epoch of batch
#     16 -> batch 8 x accumulate 2: the micro-batch's change from 16 rows
#     to 8 is said, and accumulate's at the same global batch keeps the
#     schedule;
#  3. AdamW, 1 process batch 16 x accumulate 2 -> 2 ranks x batch 16 with
#     ZeRO-1;
#  4. SGD, 2 pipeline stages in one process, batch 32 / micro_batches 2
#     -> batch 16 / micro_batches 1 x accumulate 2 (the same micro-batches
#     of 16 rows: nothing said of them; the loss seed 1/(M x accumulate)
#     = 1/2 both);
#  5. the checkpoint's accumulate, read from its config: a checkpoint at
#     the end of epoch 1 of batch 16 x accumulate 2 resumes with
#     accumulate 3 (the epoch stays complete: 2048 samples in steps of 32,
#     then of 48) and runs epoch 2's 42 steps; one at step 3 (sample 48) of
#     batch 16 resumed with accumulate 2 is refused (exit 3), naming both
#     splits;
#  6. the MLP with batchnorm: 2 ranks x 16 -> 1 x 16 x accumulate 2 warns
#     that batchnorm's statistics are per micro-batch and the micro-batches
#     hold other samples; accumulate 2 -> 4 on 1 process (the same
#     micro-batches, twice the global batch) warns of the global batch.
# Before session 40 every resume here exited 2: "[train] accumulate is '1'
# in the checkpoint but '2' here".
name=resacc needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60 gloo
opt="train.schedule=cosine train.warmup=5 train.lr_scale=linear train.base_batch=32 train.log_every=1 train.checkpoint_every=40 train.keep_last=0"
adamw="train.optimizer=adamw train.lr=0.003 train.weight_decay=0.01"

# export NAME STEP: NAME's checkpoint at STEP to $tmp/NAME.safetensors
export_w() {
	"$kiln" export "$ini" --checkpoint "$(ck "$1" "$2")" --safetensors "$tmp/$1.safetensors" \
		> "$tmp/$1.export.log" 2>&1 || { bad "$1: kiln export exited $?"; cat "$tmp/$1.export.log"; }
}

# same_run REF CUT: CUT's last checkpoint's weights are REF's within the
# tolerance, and its lr after the resume REF's bit for bit
same_run() {
	export_w "$1" 128
	export_w "$2" 128
	/usr/bin/python3 - "$tmp/$1.safetensors" "$tmp/$2.safetensors" \
		"$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'EOF' || bad "$2: differs from $1"
import json, st, sys
def tensors(p):
    f = st.load(p)
    for k, v in f.header.items():
        assert v["dtype"] == "F32", (k, v["dtype"])
    return {k: f.values(k) for k in f.header}
def lrs(p):
    rows = {}
    for line in open(p):
        j = json.loads(line)
        if j["event"] == "train":
            rows[j["step"]] = j["lr"]   # the later row of a step counts
    return rows
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = 0
if sorted(a) != sorted(b):
    print("tensors", sorted(a), sorted(b)); sys.exit(1)
big = max(abs(x) for k in a for x in a[k])
worst = max((abs(x - y), k) for k in a for x, y in zip(a[k], b[k]))
print("max |dW| %.3g (%s), the largest weight %.3g" % (worst[0], worst[1], big))
if not worst[0] <= min(1e-5, 1e-4 * big):
    bad = 1
la, lb = lrs(sys.argv[3]), lrs(sys.argv[4])
after = [s for s in sorted(lb) if s > 40]
if len(after) != 88 or max(la) != 128:
    print("steps after the resume", after[:3], "...", len(after), "uninterrupted", max(la)); bad = 1
for s in after:
    if la.get(s) != lb[s]:
        print("step %d: lr %r, uninterrupted %r" % (s, lb[s], la.get(s))); bad = 1
        break
sys.exit(bad)
EOF
}

# cut REF CUT NPROC BATCH [overrides...]: a copy of REF cut at step 40,
# resumed with NPROC BATCH and the overrides
cut() {
	_ref=$1 _cut=$2
	shift 2
	rm -rf "$tmp/$_cut"
	cp -r "$tmp/$_ref" "$tmp/$_cut"
	rm "$(ck "$_cut" 80)" "$(ck "$_cut" 120)" "$(ck "$_cut" 128)"
	run "$_cut" "$@" $opt train.resume=1
	grep -q "resuming from .*ckpt-40.kiln" "$tmp/$_cut.log" || bad "$_cut did not resume at step 40"
}

# ---- 1. 2 ranks x 16 -> 1 x 16 x accumulate 2 --------------------------------
run two 2 16 $opt $adamw
cut two two_acc 0 16 $adamw train.accumulate=2
same_run two two_acc
grep -q "resume: the checkpoint was written by 2 rank(s), this run has 1" "$tmp/two_acc.log" ||
	bad "two_acc: the world's change is not said"
grep -q "resume: a micro-batch stays 16 rows (batch 16 / micro_batches 1), but a step's samples are shared by 1 rank(s), the checkpoint's run's by 2 (each rank takes every world-th sample of a step's): the micro-batches hold other samples, and the loss's mean over the targets it counts is per micro-batch, so the run will not continue as it would have where targets are ignored (with none ignored, only the rounding changes)" "$tmp/two_acc.log" ||
	bad "two_acc: the micro-batches' other samples are not said"
grep -q "resume: \[train\] accumulate changes from 1 to 2 at the same global batch 32 (batch 16 x accumulate 1 x 2 rank(s) -> 16 x 2 x 1): the steps per epoch, the LR schedule and lr_scale's rate are the checkpoint's run's, and the run continues as it would have up to float rounding" "$tmp/two_acc.log" ||
	bad "two_acc: accumulate's change at the same global batch is not said"
grep -q "global batch changes" "$tmp/two_acc.log" && bad "two_acc: the global batch was said to change"
echo "ok: 2 ranks x 16 resumed on 1 x 16 x accumulate 2: the uninterrupted weights and lr"

# ---- 2. batch 16 -> 8 x accumulate 2 -----------------------------------------
run one 0 16 $opt train.epochs=1
cut one one_acc 0 8 train.accumulate=2 train.epochs=1
same_run one one_acc
grep -q "resume: a micro-batch changes from 16 rows (batch 16 / micro_batches 1 on each of 1 rank(s)) to 8 (8 / 1 on 1)" "$tmp/one_acc.log" ||
	bad "one_acc: the micro-batch's change is not said"
grep -q "resume: \[train\] accumulate changes from 1 to 2 at the same global batch 16 (batch 16 x accumulate 1 x 1 rank(s) -> 8 x 2 x 1)" "$tmp/one_acc.log" ||
	bad "one_acc: accumulate's change at the same global batch is not said"
echo "ok: batch 16 resumed as 8 x accumulate 2: the uninterrupted weights and lr"

# ---- 3. 1 x 16 x accumulate 2 -> 2 ranks x 16, ZeRO-1 -------------------------
run acc 0 16 $opt $adamw train.accumulate=2
cut acc acc_zero 2 16 $adamw dist.zero=1
same_run acc acc_zero
echo "ok: batch 16 x accumulate 2 resumed on 2 ranks x 16 with ZeRO-1: the uninterrupted weights and lr"

# ---- 4. pipeline micro-batches -> accumulate ----------------------------------
run pipe 0 32 $opt layer.fc2.stage=1 pipeline.micro_batches=2
cut pipe pipe_acc 0 16 layer.fc2.stage=1 pipeline.micro_batches=1 train.accumulate=2
same_run pipe pipe_acc
grep "resume: a micro-batch" "$tmp/pipe_acc.log" && bad "pipe_acc: the same micro-batches were said to change"
echo "ok: 2 stages, micro_batches 2 of batch 32 resumed as batch 16 x accumulate 2: the uninterrupted weights and lr"

# ---- 5. the checkpoint's accumulate --------------------------------------------
# a checkpoint at the end of epoch 1 of batch 16 x accumulate 2 resumed
# with accumulate 3 (with this run's accumulate the checkpoint's global
# batch was taken for 48, and the offset of 2048 refused)
run ep 0 16 $opt train.accumulate=2 train.max_steps=64 train.checkpoint_every=0
run ep 0 16 $opt train.accumulate=3 train.resume=1
grep -q "resume: the checkpoint's epoch 1 was complete (2048 samples in steps of 32); it stays complete in steps of 48" "$tmp/ep.log" ||
	bad "ep: the complete epoch in steps of 32 is not kept complete in steps of 48"
grep -q '"steps": 106' "$tmp/ep.log" || { bad "ep: not 64 + 42 steps"; grep '"steps"' "$tmp/ep.log"; }
# step 3 (sample 48) in steps of 32
run three 0 16 $opt train.max_steps=3 train.checkpoint_every=0
rc=0
KILN_MASTER_PORT=$(free_port 9) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/three" \
	train.batch=16 $opt train.accumulate=2 train.resume=1 > "$tmp/three_r.log" 2>&1 || rc=$?
[ "$rc" = 3 ] && grep -q "ckpt-3.kiln: it stopped at sample 48 of an epoch with batch 16 x accumulate 1 x 1 rank(s), which this run (batch 16 x accumulate 2 x 1 rank(s) = 32 samples a step) cannot continue" "$tmp/three_r.log" ||
	{ bad "an offset of no whole step of batch 16 x accumulate 2: exit $rc"; tail -3 "$tmp/three_r.log"; }
echo "ok: the checkpoint's accumulate read from its config"

# ---- 6. batchnorm's statistics per micro-batch -----------------------------------
ini="$tmp/bn.ini"
mlp_ini "$ini" 5 60 gloo
sed -i 's/^\[layer.r1\]$/[layer.bn]\ntype = batchnorm\n\n&/' "$ini"
grep -q "^type = batchnorm" "$ini" || bad "no batchnorm layer in $ini"
run bn 2 16 train.max_steps=4
run bn 0 16 train.max_steps=6 train.accumulate=2 train.resume=1
grep -q "resume: a micro-batch stays 16 rows (batch 16 / micro_batches 1), but a step's samples are shared by 1 rank(s), the checkpoint's run's by 2 (each rank takes every world-th sample of a step's): the micro-batches hold other samples, and batchnorm's batch statistics and the loss's mean over the targets it counts are per micro-batch, so the run will not continue as it would have$" "$tmp/bn.log" ||
	bad "bn: 2 ranks x 16 -> 1 x 16 x accumulate 2: batchnorm's other micro-batches are not said"
grep -q "the run continues as it would have up to float rounding (the micro-batches' gradients are added in another order), bar what the micro-batches' change above does$" "$tmp/bn.log" ||
	bad "bn: accumulate's change at the same global batch does not point at the micro-batches'"
# accumulate 2 -> 4 on 1 process: the same micro-batches, another global batch
run bn 0 16 train.max_steps=7 train.accumulate=4 train.resume=1
grep -q "resume: the global batch changes from 32 (batch 16 x accumulate 2 x 1 rank(s)) to 64 (16 x 4 x 1)" "$tmp/bn.log" ||
	bad "bn: accumulate 2 -> 4: the global batch's change is not said"
grep "resume: a micro-batch" "$tmp/bn.log" && bad "bn: accumulate 2 -> 4: the same micro-batches were said to change"
echo "ok: batchnorm's statistics per micro-batch said where the micro-batches change"
exit $fail
