#!/bin/sh
# tests/dropout_global.sh - dropout draws by the global batch (kiln/ops.h
# KILN_OP_DROPOUT's counter { step, row0, rstride }, DESIGN.md
# "Randomness"): a sample gets the same mask whichever rank, accumulation
# micro-step or pipeline micro-batch holds it.  An MLP of synthetic data
# with two dropout layers (p = 0.5), 6 SGD steps with momentum of a global
# batch of 64, ends with the parameters and momentum (1e-5) of one process
# of batch 64 when run as:
#  1. 2 ranks of batch 32 (gloo), and 2 ranks of 16 with accumulate = 2;
#  2. one process of batch 32 with [train] accumulate = 2;
#  3. a pipeline in one process ([pipeline] micro_batches = 4), on device
#     instances of its own ([run] devices, 2 micro-batches), with
#     accumulate = 2 too; 2 stages on 2 ranks ([dist] pipeline = 2, 4
#     micro-batches); and P = 2 x D = 2 (DDP x pipeline, 4 ranks);
#  4. a checkpoint of step 3 resumed: bit for bit the uninterrupted run;
#     2 ranks' checkpoint resumed in one process: equal to it (1e-5);
#  5. the GPT of tests/data/gpt_tiny.ini with dropout 0.2 on both blocks'
#     attention probabilities (AdamW, 6 steps): 2 ranks of batch 2 and
#     accumulate = 2 of batch 2 equal one process of batch 4.
# Before session 32 the mask's element index was the rank's own (every
# rank dropped the same units) and its step counted micro-steps: every
# comparison above but the resume failed (1.5e-3 apart after one step).
# Every process runs under `timeout`.
name=dropglobal needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/mlp.ini"
{
	ini run seed=5 threads=1
	ini_synthetic 512 8 16 workers=0
	ini_layers flat:flatten fc1:linear:out=32 r1:relu d1:dropout:p=0.5 fc2:linear:out=24 \
		r2:relu d2:dropout:p=0.5 fc3:linear:out=16 loss:softmax_xent
	ini_sgd_steps 6 log_every=3 eval=0
	ini dist timeout=30
} > "$ini"
near() { # near A B WHAT
	"$tool" close "$(ck "$1" 6)" "$(ck "$2" 6)" 1e-5 params optim.momentum ||
		bad "$3: parameters differ from one process of batch 64"
}

# ---- 1, 2. ranks and accumulation -------------------------------------------
run one 0 64
run two 2 32
near one two "2 ranks of batch 32"
run twoacc 2 16 train.accumulate=2
near one twoacc "2 ranks of batch 16, accumulate = 2"
run acc 0 32 train.accumulate=2
near one acc "batch 32, accumulate = 2"
# (the dropout layers matter: without them the run ends elsewhere)
run nodrop 0 64 layer.d1.p=0 layer.d2.p=0
"$tool" close "$(ck one 6)" "$(ck nodrop 6)" 1e-5 params > /dev/null 2>&1 &&
	bad "p = 0.5 ends where p = 0 does: the masks drop nothing"

# ---- 3. pipelines ---------------------------------------------------------------
run pipe 0 64 layer.fc2.stage=1 pipeline.micro_batches=4
grep -q "2 stages, 4 micro-batches" "$tmp/pipe.log" || bad "pipe: no pipeline of 4 micro-batches"
near one pipe "2 stages in one process, 4 micro-batches"
run pipedev 0 64 layer.fc2.stage=1 pipeline.micro_batches=2 "run.devices=cpu:0,cpu:1"
near one pipedev "2 stages on 2 device instances, 2 micro-batches"
run pipeacc 0 32 layer.fc2.stage=1 pipeline.micro_batches=2 train.accumulate=2
near one pipeacc "2 stages, 2 micro-batches, accumulate = 2"
run piperanks 2 64 dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=4
near one piperanks "2 stages on 2 ranks, 4 micro-batches"
run ddppipe 4 32 dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2
near one ddppipe "P = 2 x D = 2 (4 ranks), 2 micro-batches"

# ---- 4. resume ------------------------------------------------------------------
run part 0 64 train.max_steps=3
[ -f "$(ck part 3)" ] || bad "no checkpoint at step 3"
cp -r "$tmp/part" "$tmp/res"
run res 0 64 train.resume=1
"$tool" same "$(ck one 6)" "$(ck res 6)" params optim.momentum ||
	bad "resumed at step 3: not the uninterrupted run bit for bit"
run part2 2 32 train.max_steps=3
cp -r "$tmp/part2" "$tmp/res2"
run res2 0 64 train.resume=1
near one res2 "2 ranks' checkpoint of step 3 resumed in one process"

# ---- 5. attention's dropout on a GPT ----------------------------------------------
need_source tokens
data="$srcdir/tests/data"
ini="$data/gpt_tiny.ini"
state="params optim.exp_avg optim.exp_avg_sq"
set -- "data.path=$data/gpt_tokens.bin" "model.init_from=$data/gpt_init.safetensors" \
	train.epochs=2 train.max_steps=6 run.comm=gloo dist.timeout=60 \
	layer.transformer.h.0.attn.sdpa.dropout=0.2 layer.transformer.h.1.attn.sdpa.dropout=0.2
run gone 0 4 "$@"
run gtwo 2 2 "$@"
"$tool" close "$(ck gone 6)" "$(ck gtwo 6)" 1e-5 $state ||
	bad "GPT with attention dropout: 2 ranks of batch 2 differ from one process of batch 4"
run gacc 0 2 "$@" train.accumulate=2
"$tool" close "$(ck gone 6)" "$(ck gacc 6)" 1e-5 $state ||
	bad "GPT with attention dropout: accumulate = 2 of batch 2 differs from one process of batch 4"
[ $fail = 0 ] && echo "ok: dropout draws by the global batch (ranks, accumulation, pipelines, attention)"
exit $fail
