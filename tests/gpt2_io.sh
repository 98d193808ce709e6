#!/bin/sh
# tests/gpt2_io.sh - GPT-2's weight files in and out (docs/safetensors.md):
# tests/data/gen_gpt2_io_refs.py wrote tests/data/gpt_tiny.ini's 2-layer
# GPT-2 as Hugging Face's GPT2LMHeadModel saves it (gpt2_hf.safetensors:
# Conv1D weights [in, out], the tied lm_head once), as the GPT-2 release's
# GPT2Model names it (gpt2_hf_bare.safetensors: no "transformer." prefix,
# the attention mask buffers), and as llm.c's model file (gpt2_llmc.bin),
# with PyTorch's loss, logits and greedy tokens.
#  1. [model] init_format = gpt2: kiln export --format gpt2 writes the
#     file's tensors back bit for bit, and a second round trip through
#     kiln is byte-identical; the PyTorch layout export holds the Conv1D
#     weights transposed;
#  2. the bare names and llm.c's file load the same weights (identical
#     exports);
#  3. the loaded model's first-batch loss is PyTorch's (relative 1e-5) and
#     its greedy tokens are PyTorch's (the argmax of the logits, the
#     vocabulary padded to 256 for the byte-level tokenizer);
#  4. into a vocabulary padded to 72, the extra rows are 0;
#  5. errors: GPT-2's file read with PyTorch's layouts, an llm.c file of
#     other heads, truncated or with a bad version: exit 2 or 3.
name=gpt2_io
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/gpt_tiny.ini"
gen="$data/gen_gpt2_io_refs.py"

need_python3 "to read the safetensors files"
need_source tokens
common="data.path=$data/gpt_tokens.bin run.out_dir=$tmp/none"
hf="model.init_from=$data/gpt2_hf.safetensors model.init_format=gpt2"

# 1. GPT-2's layouts in and out
kiln 0 export "$ini" --format gpt2 --safetensors "$tmp/a.safetensors" $common $hf
"$py" "$gen" --check gpt2 "$tmp/a.safetensors" || fail "the GPT-2 export differs from the file loaded"
kiln 0 export "$ini" --format gpt2 --safetensors "$tmp/b.safetensors" $common \
	"model.init_from=$tmp/a.safetensors" model.init_format=gpt2
cmp "$tmp/a.safetensors" "$tmp/b.safetensors" || fail "a GPT-2 round trip is not byte-exact"
kiln 0 export "$ini" --safetensors "$tmp/hf.safetensors" $common $hf
"$py" "$gen" --check kiln "$tmp/hf.safetensors" || fail "the PyTorch-layout export is not the file transposed"

# 2. GPT2Model's names with the mask buffers; llm.c's model file
kiln 0 export "$ini" --safetensors "$tmp/bare.safetensors" $common \
	"model.init_from=$data/gpt2_hf_bare.safetensors" model.init_format=gpt2
cmp "$tmp/hf.safetensors" "$tmp/bare.safetensors" || fail "GPT2Model's names load other weights"
kiln 0 export "$ini" --safetensors "$tmp/llmc.safetensors" $common "model.init_from=$data/gpt2_llmc.bin"
stderr_has "loaded all"
cmp "$tmp/hf.safetensors" "$tmp/llmc.safetensors" || fail "llm.c's file loads other weights"

# 3. PyTorch's loss and greedy tokens
kiln 0 train "$ini" $hf "data.path=$data/gpt_tokens.bin" "run.out_dir=$tmp/loss" \
	train.optimizer=sgd train.lr=0 train.max_steps=1
"$py" "$gen" --check loss "$tmp/loss/metrics.jsonl" || fail "the first batch's loss differs from PyTorch's"
# (the byte-level tokenizer needs 256 ids: the vocabulary padded with zero rows)
kiln 0 generate "$ini" --prompt 0123 --tokens 9 --temperature 0 $common \
	"model.init_from=$data/gpt2_llmc.bin" data.vocab=256 layer.transformer.wte.vocab=256 \
	layer.lm_head.out=256
"$py" "$gen" --check greedy "$out" || fail "greedy decoding differs from PyTorch's"

# 4. a padded vocabulary (GPT-2's 50257 into 50304)
pad="data.vocab=72 layer.transformer.wte.vocab=72 layer.lm_head.out=72"
kiln 0 export "$ini" --safetensors "$tmp/pad.safetensors" $common $hf $pad
"$py" "$gen" --check padded "$tmp/pad.safetensors" 8 || fail "the padded rows are not 0"

# 5. errors
kiln 2 export "$ini" --safetensors "$tmp/x.safetensors" $common "model.init_from=$data/gpt2_hf.safetensors"
stderr_has "transformer.h.0.attn.c_attn.weight is [32, 96] in the file but [96, 32] in the model"
kiln 2 export "$ini" --format torch --safetensors "$tmp/x.safetensors" $common
kiln 2 export "$ini" --safetensors "$tmp/x.safetensors" $common "model.init_from=$data/gpt2_llmc.bin" \
	layer.transformer.h.1.attn.sdpa.heads=2
stderr_has "the llm.c model has 4 heads, [layer.transformer.h.1.attn.sdpa] heads = 2"
head -c 5000 "$data/gpt2_llmc.bin" >"$tmp/short.bin"
kiln 3 export "$ini" --safetensors "$tmp/x.safetensors" $common "model.init_from=$tmp/short.bin"
stderr_has "5000 bytes, but its header"
{ printf '\306\327\064\001\007\000\000\000'; tail -c +9 "$data/gpt2_llmc.bin"; } >"$tmp/v7.bin"
kiln 3 export "$ini" --safetensors "$tmp/x.safetensors" $common "model.init_from=$tmp/v7.bin"
stderr_has "version 7"
echo "PASS: $checks kiln runs; GPT-2's and llm.c's files load as PyTorch's model, export round-trips"
