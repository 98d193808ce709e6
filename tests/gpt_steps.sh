#!/bin/sh
# tests/gpt_steps.sh - a 2-layer GPT-2 trains as PyTorch trains it.
#
# tests/data/gpt_tiny.ini (V 64, C 32, 4 heads, T 13, batch 3, tanh GELU,
# lm_head tied to transformer.wte) starts from PyTorch's weights
# (gpt_init.safetensors) and reads the token shard gpt_tokens.bin with
# shuffle = 0, so step k trains on the same 3 windows as the script
# tests/data/gen_gpt_refs.py, which wrote both and the references:
#  1. 5 AdamW steps (weight decay with no_decay patterns): every step's
#     loss (metrics.jsonl) and every final weight (kiln export) match
#     PyTorch's to relative 1e-4 (max |kiln - torch| <= 1e-4 max |torch|
#     per tensor);
#  2. every gradient of step 1, tied weight included: one plain SGD step
#     (momentum 0, no decay) of rate 1e4, the gradient being
#     (init - exported) / 1e4, matches PyTorch's to relative 1e-4;
#  3. [run] precision = bf16: the 5 losses within 2e-2 of PyTorch's fp32
#     ones (the documented tolerance, docs/precision.md), deterministic;
#  4. the residual adds' and the positional embedding's input gradients
#     share their output gradient's storage (plan_memory.c plan_grad_alias:
#     both inputs of each of the 4 adds and transformer.wpe's, 9 named in
#     the debug log), and the 5 AdamW steps with those 5 layers at
#     [layer.X] inplace = 0 (each gradient copied, as before) end with
#     byte-equal weights.
#  5. [run] precision = fp16 (f16 compute, the dynamic loss scale): the 5
#     losses within 2e-2 of PyTorch's fp32 ones; started at a scale of 2^24
#     (GradScaler's init_scale 2^24, growth_interval 2) the first steps'
#     f16 gradients overflow: each such step is skipped (the first ones'
#     losses those of the initial weights, as an lr = 0 run logs them,
#     within 1e-4) and halves the scale, 2 finite steps in a row double it, and the run
#     goes on with finite losses.
# The comparison needs only python3's standard library.
name=gpt_steps
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/gpt_tiny.ini"
gen="$data/gen_gpt_refs.py"

need_python3 "to read the safetensors files"
need_source tokens
common="data.path=$data/gpt_tokens.bin model.init_from=$data/gpt_init.safetensors"

# 1. five AdamW steps: losses and final weights
kiln 0 train "$ini" $common "run.out_dir=$tmp/adamw"
"$py" "$gen" --check loss "$tmp/adamw/metrics.jsonl" || fail "the 5 AdamW losses differ from PyTorch's"
kiln 0 export "$ini" --safetensors "$tmp/adamw.safetensors" $common "run.out_dir=$tmp/adamw"
"$py" "$gen" --check adamw "$tmp/adamw.safetensors" || fail "the weights after 5 AdamW steps differ from PyTorch's"

# 2. the gradients of step 1, through one SGD step of rate 1e4
kiln 0 train "$ini" $common "run.out_dir=$tmp/grad" train.optimizer=sgd train.momentum=0 \
	train.weight_decay=0 train.lr=1e4 train.max_steps=1
kiln 0 export "$ini" --safetensors "$tmp/grad.safetensors" $common "run.out_dir=$tmp/grad"
"$py" "$gen" --check grad "$tmp/grad.safetensors" "$data/gpt_init.safetensors" 1e4 ||
	fail "the gradients of step 1 differ from PyTorch's"

# 3. bf16 within its tolerance, and deterministic
for r in 1 2; do
	kiln 0 train "$ini" $common "run.out_dir=$tmp/bf16_$r" run.precision=bf16
	kiln 0 export "$ini" --safetensors "$tmp/bf16_$r.safetensors" $common "run.out_dir=$tmp/bf16_$r"
done
"$py" "$gen" --check loss "$tmp/bf16_1/metrics.jsonl" 2e-2 || fail "bf16 losses beyond 2e-2 of PyTorch's"
cmp "$tmp/bf16_1.safetensors" "$tmp/bf16_2.safetensors" ||
	fail "two bf16 runs of the same config end with different weights"
# 4. the adds' gradients without copies: the same weights as with copies
KILN_LOG_LEVEL=debug kiln 0 train "$ini" $common "run.out_dir=$tmp/alias"
n=$(grep -c "the gradient of '.*' is its own" "$err")
[ "$n" -eq 9 ] || fail "expected 9 input gradients (4 adds, wpe) to share their output's, log says $n"
kiln 0 export "$ini" --safetensors "$tmp/alias.safetensors" $common "run.out_dir=$tmp/alias"
copies=layer.transformer.wpe.inplace=0
for b in 0 1; do
	for r in res_1 res_2; do copies="$copies layer.transformer.h.$b.$r.inplace=0"; done
done
# shellcheck disable=SC2086 # one argument per setting
KILN_LOG_LEVEL=debug kiln 0 train "$ini" $common "run.out_dir=$tmp/copies" $copies
! grep -q "is its own" "$err" || fail "inplace = 0 still shares an add's gradient"
# shellcheck disable=SC2086
kiln 0 export "$ini" --safetensors "$tmp/copies.safetensors" $common "run.out_dir=$tmp/copies" $copies
# the tensors' bytes (the metadata holds the config's hash, which differs)
"$py" - "$tmp/alias.safetensors" "$tmp/copies.safetensors" <<'PY' ||
import st, sys
a = st.tensors(sys.argv[1])
sys.exit(0 if a and not st.differ(sys.argv[1], sys.argv[2]) else 1)
PY
	fail "sharing the adds' gradients changed the weights after 5 steps"

# 5. fp16 with the dynamic loss scale
kiln 0 train "$ini" $common "run.out_dir=$tmp/fp16" run.precision=fp16
"$py" "$gen" --check loss "$tmp/fp16/metrics.jsonl" 2e-2 || fail "fp16 losses beyond 2e-2 of PyTorch's"
two="train.epochs=2 train.max_steps=10"
# shellcheck disable=SC2086
kiln 0 train "$ini" $common $two "run.out_dir=$tmp/lr0" train.lr=0
# shellcheck disable=SC2086
kiln 0 train "$ini" $common $two "run.out_dir=$tmp/scale" run.precision=fp16 \
	plugin.amp.init_scale=16777216 plugin.amp.growth_interval=2
steps() { # step loss skipped loss_scale, one train event a line
	sed -n 's/.*"event":"train".*"step":\([0-9]*\),"loss":\([^,]*\),.*"skipped":\([0-9]*\),"clipped":[0-9]*,"loss_scale":\([^,]*\),.*/\1 \2 \3 \4/p' "$1"
}
steps "$tmp/lr0/metrics.jsonl" >"$tmp/lr0.txt"
steps "$tmp/scale/metrics.jsonl" >"$tmp/scale.txt"
awk 'NR == FNR { l0[$1] = $2; next }
	function fail(m) { print "step " $1 ": " m; bad = 1; exit }
	{
		n++; skip = $3 - prev; prev = $3
		if (skip == 1) { skips++; want = scale * 0.5; good = 0
			d = $2 - l0[$1]; if (d < 0) d = -d
			if (!moved && d > 1e-4) fail("skipped, but its loss " $2 " is not the initial weights\047 " l0[$1])
		} else if (skip == 0) { good++; want = scale; moved = 1
			if (good == 2) { want = scale * 2; good = 0; grows++ }
		} else fail("skipped count went from " prev - skip " to " $3)
		if (n == 1) want = 16777216 * (skip ? 0.5 : 1)
		if ($4 + 0 != want) fail("loss scale " $4 ", GradScaler\047s rule gives " want)
		if ($2 != $2 + 0 || $2 > 10) fail("loss " $2)
		scale = $4
	}
	END { if (bad) exit 1
		if (n != 10 || skips < 1 || grows < 1 || skips == n) {
			print n " steps, " skips " skipped, " grows " growths: want 10, some of each"; exit 1 }
		print "fp16 scale: " skips " skipped steps, " grows " growths over " n " steps" }' \
	"$tmp/lr0.txt" "$tmp/scale.txt" || fail "fp16's dynamic loss scale on the GPT"

echo "PASS: $checks kiln runs; the GPT's losses, gradients and weights match PyTorch's"
