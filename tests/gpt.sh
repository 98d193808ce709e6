#!/bin/sh
# tests/gpt.sh - the training features on a GPT: a few steps of
# tests/data/gpt_tiny.ini (2 blocks, tied lm_head, tokens source) each.
#  1. gradient accumulation: batch 1 x accumulate 3 ends where batch 3 does
#     (parameters within 1e-5);
#  2. recompute = auto: parameters and optimizer state bit for bit those of
#     recompute = none;
#  3. checkpoints: a run stopped at step 7 (shuffled windows, 3 epochs of
#     5 steps, accumulate 3) and resumed ends byte for byte where the
#     uninterrupted run does;
#  4. clip_norm: one SGD step of rate 1 with clip_norm 1e-3 moves the
#     parameters (the tied one counted once) by a norm of 1e-3; the step
#     is counted as clipped in metrics.jsonl ("clipped": 1) and in kiln
#     train's JSON line and stderr (before session 34 neither said so);
#  5. warmup + cosine: the logged rates are 0.005, 0.01 (warmup 2 to
#     lr 0.01), then CosineAnnealingLR's 0.01, 0.00775, 0.00325 to 0.001;
#     no_decay: 20 of the 28 tensors (biases, norms, embeddings);
#  6. bf16 with accumulation, recompute and clipping trains (finite loss);
#  7. kiln memory: its total covers the run's device peak (within 128
#     bytes), and recompute = auto needs fewer activation bytes; recompute =
#     1024 (more segments than layers) recomputes nothing and logs so;
#  8. the profiler times the GPT's ops (attention, layernorm, embedding);
#  9. the loss's gradient over the logits (one buffer, the default): every
#     loss, parameter and AdamW moment bit for bit those of two buffers
#     ([layer.loss] inplace = 0), with and without recompute = auto, and
#     kiln memory counts the logits' gradient's 9984 bytes fewer (unpacked);
# 10. a padded vocabulary ([layer.loss] classes): the model padded to 72
#     tokens (8 more rows of wte, the tied lm_head 72 wide, the padding
#     rows +-0.5, large enough to move a softmax over them) with classes =
#     64 trains as the unpadded model does (every loss within 1e-5, every
#     exported tensor within 1e-5, wte's padding rows unchanged), which
#     gpt_steps.sh holds to PyTorch's numbers: the loss is over the real
#     vocabulary, as llm.c's; without classes the first loss differs.
name=gpt
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/gpt_tiny.ini"
tool="$top_builddir/tests/ckpt_tool"
state="params optim.exp_avg optim.exp_avg_sq step optim.step"
need_source tokens
set -- "data.path=$data/gpt_tokens.bin" "model.init_from=$data/gpt_init.safetensors"

# 1. gradient accumulation
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/b3"
peak=$(field device_peak_bytes "$out")
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/acc" train.batch=1 train.accumulate=3
"$tool" close "$(ck b3 5)" "$(ck acc 5)" 1e-5 params || fail "accumulate 3 x batch 1 strays from batch 3"

# 2. recompute
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/rc" train.recompute=auto
"$tool" same "$(ck b3 5)" "$(ck rc 5)" $state || fail "recompute = auto changed the training"

# 3. stop and resume, shuffled, with accumulation
long="data.shuffle=1 train.epochs=3 train.max_steps=0 train.batch=1 train.accumulate=3"
# shellcheck disable=SC2086 # one argument per setting
kiln 0 train "$ini" "$@" $long "run.out_dir=$tmp/full"
# shellcheck disable=SC2086
kiln 0 train "$ini" "$@" $long "run.out_dir=$tmp/part" train.max_steps=7
# shellcheck disable=SC2086
kiln 0 train "$ini" "$@" $long "run.out_dir=$tmp/part" train.resume=1
stderr_has "resum"
"$tool" same "$(ck full 15)" "$(ck part 15)" $state ||
	fail "resumed at step 7: the state at step 15 differs from the uninterrupted run"

# 4. clip_norm: the step is the clipped gradient
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/clip" train.optimizer=sgd train.momentum=0 \
	train.weight_decay=0 train.lr=1 train.clip_norm=1e-3 train.max_steps=1
stdout_has '"steps_skipped": 0, "steps_clipped": 1'
stderr_has "optimizer steps: 0 skipped for non-finite gradients, 1 clipped by clip_norm (of 1)"
grep -q '"event":"train",.*"skipped":0,"clipped":1,' "$tmp/clip/metrics.jsonl" ||
	fail "metrics.jsonl's train line does not count the clipped step: $(grep '"train"' "$tmp/clip/metrics.jsonl")"
kiln 0 export "$ini" --safetensors "$tmp/clip.safetensors" "$@" "run.out_dir=$tmp/clip"
/usr/bin/python3 - "$data" "$data/gpt_init.safetensors" "$tmp/clip.safetensors" <<'PY' || fail "the clipped step's norm is not clip_norm"
import math, sys
sys.path.insert(0, sys.argv[1])
from gen_trained_refs import read
a, b = read(sys.argv[2]), read(sys.argv[3])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
norm = math.sqrt(sum((x - y) ** 2 for n in a for x, y in zip(a[n][2], b[n][2])))
print("norm of the clipped step: %.7g" % norm)
sys.exit(0 if abs(norm - 1e-3) <= 1e-3 * 1e-3 else 1)
PY

# 5. warmup + cosine, no_decay
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/sched" train.warmup=2 train.schedule=cosine train.lr_min=0.001
lrs=$(sed -n 's/.*"event":"train".*"lr":\([0-9.e-]*\).*/\1/p' "$tmp/sched/metrics.jsonl" | tr '\n' ' ')
[ "$lrs" = "0.005 0.01 0.01 0.00775 0.00325 " ] || fail "warmup + cosine rates: $lrs"
stderr_has "no_decay: 20 of 28 trainable tensors"

# 6. bf16 with the rest
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/bf16" run.precision=bf16 train.batch=1 train.accumulate=3 \
	train.recompute=auto train.clip_norm=1.0
loss=$(field train_loss "$out")
awk -v l="$loss" 'BEGIN { exit !(l > 3 && l < 5) }' || fail "bf16 train loss $loss (fp32: 4.22)"

# 7. kiln memory
kiln 0 memory "$ini" "$@"
total=$(field total "$out")
act=$(field activations "$out")
[ -n "$peak" ] && [ "$peak" -le "$total" ] && [ $((total - peak)) -lt 128 ] ||
	fail "kiln memory predicts $total device bytes, the run asked for $peak"
kiln 0 memory "$ini" "$@" train.recompute=auto
act_rc=$(field activations "$out")
[ "$act_rc" -lt "$act" ] || fail "recompute = auto: $act_rc activation bytes, none: $act"
# more segments than layers: nothing recomputed, and the plan says so
kiln 0 memory "$ini" "$@" train.recompute=1024
[ "$(field recomputed "$out")" = 0 ] || fail "recompute = 1024 recomputed $(field recomputed "$out") outputs"
stderr_has "[core] command line 'train.recompute=1024': [train] recompute = 1024 is more segments than the model's "
stderr_has " layers can use (an output is recomputed only when the layers that read it share its segment): 0 layers' outputs recomputed; recompute = auto picks the count that needs the least memory"
kiln 0 memory "$ini" "$@" train.recompute=2
! grep -q "more segments than" "$err" || fail "recompute = 2 said it has more segments than layers"

# 8. the profiler
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/prof" --profile
for op in attention attention_bwd layernorm layernorm_bwd embedding_bwd act_bwd; do
	grep -q " $op " "$tmp/prof/profile.txt" || fail "the profile has no $op row"
done
# 9. the logits' gradient over the logits, against two buffers
losses() { sed -n 's/.*"event":"train".*"loss":\([0-9.e-]*\).*/\1/p' "$tmp/$1/metrics.jsonl" | tr '\n' ' '; }
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/two" layer.loss.inplace=0
"$tool" same "$(ck b3 5)" "$(ck two 5)" $state || fail "the gradient over the logits changed the training"
[ -n "$(losses b3)" ] && [ "$(losses b3)" = "$(losses two)" ] ||
	fail "losses with one buffer '$(losses b3)', with two '$(losses two)'"
kiln 0 train "$ini" "$@" "run.out_dir=$tmp/two_rc" layer.loss.inplace=0 train.recompute=auto
"$tool" same "$(ck rc 5)" "$(ck two_rc 5)" $state || fail "the gradient over the logits changed recompute = auto"
kiln 0 memory "$ini" "$@"
one=$(field activations_unpacked "$out")
kiln 0 memory "$ini" "$@" layer.loss.inplace=0
two=$(field activations_unpacked "$out")
[ $((two - one)) = $((3 * 13 * 64 * 4)) ] ||
	fail "one buffer for the logits and their gradient: $one activation bytes unpacked, two: $two (the gradient is 9984)"
# 10. a padded vocabulary, classes = the real one
/usr/bin/python3 - "$data" "$data/gpt_init.safetensors" "$tmp/pad.safetensors" <<'PY' || fail "no padded weights"
import json, struct, sys
sys.path.insert(0, sys.argv[1])
from gen_trained_refs import read
t = read(sys.argv[2])
dt, shape, vals = t["transformer.wte.weight"]
t["transformer.wte.weight"] = (dt, [72, shape[1]], vals + tuple(
    0.5 * (-1) ** (i // shape[1]) for i in range(8 * shape[1])))
head, blob = {}, b""
for n in sorted(t):
    d, sh, v = t[n]
    head[n] = {"dtype": d, "shape": sh, "data_offsets": [len(blob), len(blob) + 4 * len(v)]}
    blob += struct.pack("<%df" % len(v), *v)
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[3], "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY
pad="model.init_from=$tmp/pad.safetensors layer.transformer.wte.vocab=72 layer.lm_head.out=72"
# shellcheck disable=SC2086 # one argument per setting
kiln 0 train "$ini" "$1" $pad "run.out_dir=$tmp/pad" layer.loss.classes=64
# shellcheck disable=SC2086
kiln 0 train "$ini" "$1" $pad "run.out_dir=$tmp/pad_all" train.max_steps=1
kiln 0 export "$ini" --safetensors "$tmp/b3.safetensors" "$@" "run.out_dir=$tmp/b3"
# shellcheck disable=SC2086
kiln 0 export "$ini" --safetensors "$tmp/pad_out.safetensors" "$1" $pad "run.out_dir=$tmp/pad" \
	layer.loss.classes=64
/usr/bin/python3 - "$data" "$tmp" "$(losses b3)" "$(losses pad)" "$(losses pad_all)" <<'PY' ||
import sys
sys.path.insert(0, sys.argv[1])
from gen_trained_refs import read
tmp = sys.argv[2]
ref, pad, every = ([float(x) for x in a.split()] for a in sys.argv[3:6])
print("losses: unpadded", ref, "padded, classes = 64", pad, "padded, every column", every)
assert len(ref) == 5 and len(pad) == 5, "5 losses each"
assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(ref, pad)), "losses differ"
assert abs(every[0] - ref[0]) > 1e-3, "the padding columns did not change the loss"
a, b = read(tmp + "/b3.safetensors"), read(tmp + "/pad_out.safetensors")
init = read(tmp + "/pad.safetensors")["transformer.wte.weight"][2]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for n in a:
    x, y = a[n][2], b[n][2]
    if n == "transformer.wte.weight":
        assert y[len(x):] == init[len(x):], "wte's padding rows moved"
        y = y[:len(x)]
    assert len(x) == len(y), n
    err = max(abs(p - q) - 1e-5 * abs(p) for p, q in zip(x, y))
    assert err <= 1e-6, "%s differs by %g" % (n, err)
print("the padded model with classes = 64 trained as the unpadded one")
PY
	fail "the padded vocabulary with classes = 64 strays from the unpadded model"
echo "PASS: $checks kiln runs; accumulation, recompute, resume, clipping, schedule, bf16, memory, the profiler, the loss's gradient over the logits and a padded vocabulary on a GPT"
