#!/bin/sh
# tests/dist_gpt.sh - data parallelism on a GPT: tests/data/gpt_tiny.ini
# (2 blocks of layernorm, causal attention and a tanh-GELU MLP, the
# lm_head tied to transformer.wte, AdamW with no_decay groups) from the
# PyTorch-made weights (gpt_init.safetensors) on its token shard.  With
# `kiln launch -n 2` and Gloo, 2 ranks of batch 2 end equal (ckpt_tool
# close, 1e-5) to one process of batch 4 on the same global batches, in
# parameters and both AdamW moments, after 6 optimizer steps over 2 epochs:
#  1. DDP ([dist] zero = 0), a bucket per few tensors (bucket_mb 0.01), so
#     the tied tensor's bucket waits for its last user's backward;
#  2. ZeRO-1 ([dist] zero = 1), the optimizer state sharded;
#  3. ZeRO-1 with recompute = auto (the blocks' outputs replayed in the
#     backward, the loss's gradient over the logits) equals it bit for bit.
# Every process runs under `timeout`, so a hang fails the test.
name=dist_gpt needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
need_source tokens
data="$srcdir/tests/data"
ini="$data/gpt_tiny.ini"
state="params optim.exp_avg optim.exp_avg_sq"
set -- "data.path=$data/gpt_tokens.bin" "model.init_from=$data/gpt_init.safetensors" \
	train.epochs=2 train.max_steps=6 run.comm=gloo dist.timeout=60 dist.bucket_mb=0.01

run one 0 4 "$@"
run ddp 2 2 "$@" dist.zero=0
run zero 2 2 "$@" dist.zero=1
run zero_rc 2 2 "$@" dist.zero=1 train.recompute=auto
[ -f "$(ck one 6)" ] || bad "one process wrote no checkpoint at step 6"
"$tool" close "$(ck one 6)" "$(ck ddp 6)" 1e-5 $state || bad "DDP on 2 ranks differs from one process"
"$tool" close "$(ck one 6)" "$(ck zero 6)" 1e-5 $state || bad "ZeRO-1 on 2 ranks differs from one process"
"$tool" same "$(ck zero 6)" "$(ck zero_rc 6)" $state || bad "ZeRO-1 with recompute = auto differs from without"
grep -q "recompute: " "$tmp/zero_rc.log" || bad "recompute = auto recomputed nothing"
[ $fail = 0 ] && echo "ok: 2 ranks (DDP, ZeRO-1) equal one process on the GPT"
exit $fail
