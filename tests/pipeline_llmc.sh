#!/bin/sh
# tests/pipeline_llmc.sh - [model] init_from of llm.c's model file on 2
# pipeline stages on 2 ranks ([dist] pipeline = 2): each rank holds its
# stage's parameters alone from start-up and loads its stage's tensors
# from the file, opened once, as a safetensors file or a kiln checkpoint
# is loaded (session 12), ending with one process's bytes.  Before session
# 39 an llm.c file made every rank create and initialise the whole model
# ("[model] init_from of an llm.c file: its loader writes the whole
# model"), which it did not need since kiln_weights_load writes the
# stage's slice alone, and the trainer opened the file once to see
# whether it was llm.c's (kiln_llmc_is_model) before the loader opened it
# again: a file replaced between the two was probed as one and read as
# the other.  tests/shim_fault.c logs each rank's open()s of the file.
name=pipeline_llmc
. "$(dirname "$0")/lib.sh"
need_source tokens
[ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ] ||
	{ echo "SKIP: the gloo plugin is not built"; exit 77; }
tool="$abs_top_builddir/tests/ckpt_tool"
data="$srcdir/tests/data"
shim_build || fail "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"

# tests/data/gpt_tiny.ini untied (llm.c's file has no lm_head: drawn), the
# first block's attention on stage 0
grep -v '^tie = ' "$data/gpt_tiny.ini" >"$tmp/gpt.ini"
cp "$data/gpt2_llmc.bin" "$tmp/llmc.bin"
set -- "data.path=$data/gpt_tokens.bin" train.max_steps=3 train.optimizer=sgd train.momentum=0.9 \
	train.lr=0.05 train.batch=4 pipeline.micro_batches=2 model.init_strict=0 \
	"model.init_from=$tmp/llmc.bin" \
	"model.stages=transformer.wte,transformer.h.0.attn.c_proj|transformer.h.0.res_1,loss"
kiln 0 train "$tmp/gpt.ini" "$@" "run.out_dir=$tmp/one"
stderr_has "$tmp/llmc.bin: loaded 28 of the model's 29 parameters and buffers"

last="launch -n 2 -- train $tmp/gpt.ini $* dist.pipeline=2"
LD_PRELOAD="$shim" SHIM_OPEN_PREFIX="$tmp/llmc.bin" SHIM_OPEN_LOG="$tmp/opens" \
	timeout 120 "$kiln" launch -n 2 -- "$kiln" train "$tmp/gpt.ini" "$@" run.comm=gloo \
	"run.out_dir=$tmp/two" dist.pipeline=2 dist.timeout=60 >"$out" 2>"$err" ||
	fail "2 stages on 2 ranks: exit $?"
for r in 0 1; do
	grep -q "rank $r (pipeline stage $r): holds the stage's parameters and gradients alone: .*from start-up on: created and initialised as the stage's alone" "$err" ||
		fail "rank $r does not hold its stage alone from start-up: $(grep "rank $r .*start-up" "$err")"
done
[ "$(grep -c "$tmp/llmc.bin: loaded 28 of the model's 29 parameters and buffers" "$err")" = 2 ] ||
	fail "not both ranks loaded the file"
[ "$(grep -c "^$tmp/llmc.bin\$" "$tmp/opens")" = 2 ] ||
	fail "the file was opened $(wc -l <"$tmp/opens") times by the 2 ranks (want once each)"
"$tool" same "$tmp/one/checkpoints/ckpt-3.kiln" "$tmp/two/checkpoints/ckpt-3.kiln" params \
	optim.momentum || fail "2 stages on 2 ranks differ from one process"
echo "ok: llm.c's file as init_from: each rank its stage alone from start-up, the file opened once a rank, one process's bytes"
echo "PASS"
