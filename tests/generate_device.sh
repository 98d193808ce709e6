#!/bin/sh
# tests/generate_device.sh - `kiln generate` on a device without
# KILN_OP_ATTENTION_DECODE (docs/generate.md, "Device"), without a GPU:
# tests/plugins/tnodecode.c is the CPU device under the name tnodecode,
# which auto prefers and whose has_op says no to ATTENTION_DECODE (as the
# CUDA device's does).  A model with an attention layer: `auto` logs the
# fallback and generates on the CPU device (the text run.device=cpu
# prints), naming tnodecode is refused, exit 2.  An MLP over tokens (no
# attention): generates on tnodecode, named or chosen by auto, the same
# text (before the fix it was refused, and auto fell back for nothing).
# Session 43: the CPU device prefills a prompt (no "not prefilled" line);
# tprefill28, the CPU device under ABI 2.28 (tests/plugins/tnodecode.c),
# is asked for no decoding attention of several positions: the prompt is
# fed a position a step, said once at info level, the same text; so is
# it on tnorun, the CPU device under 2.31 without the new op
# ATTENTION_DECODE_RUN (as a device rebuilt unchanged: before, the core
# asked ATTENTION_DECODE itself for several positions, which such a
# device would read as one).  Session 45: greedy (--temperature 0), their
# step-fed text is the prefilled text, byte for byte (the reason below).
name=generate_device
. "$(dirname "$0")/lib.sh"

need_source tokens
plugdir="$abs_top_builddir/tests/plugins/nodecode/.libs"
[ -f "$plugdir/kiln-tnodecode.so" ] || fail "no $plugdir/kiln-tnodecode.so (make check builds it)"

i=0
while [ $i -lt 60 ]; do
	echo "the quick brown fox jumps over the lazy dog $i times."
	i=$((i + 1))
done >"$tmp/corpus.txt"
kiln 0 pack --format tokens "$tmp/corpus.txt" --out "$tmp/data" --val-fraction 0.1

# model_ini FILE NAME BODY: a token model of context 16 trained 3 steps
model_ini() {
	{
		printf '[run]\ndevice = cpu\nseed = 1\nout_dir = %s/%s\n' "$tmp" "$2"
		printf '[data]\nsource = tokens\npath = %s/data\ncontext = 16\nvocab = 256\n' "$tmp"
		printf '[train]\noptimizer = adamw\nlr = 3e-3\nbatch = 4\nmax_steps = 3\n'
		printf '[layer.wte]\ntype = embedding\nvocab = 256\ndim = 16\n'
		printf '[layer.wpe]\ntype = pos_embedding\nmax_len = 16\n'
		printf '%b' "$3"
		printf '[layer.head]\ntype = linear\nout = 256\n[layer.loss]\ntype = softmax_xent\n'
	} >"$1"
}
model_ini "$tmp/att.ini" att '[layer.qkv]\ntype = linear\nout = 48\n[layer.sdpa]\ntype = attention\nheads = 2\n'
model_ini "$tmp/mlp.ini" mlp '[layer.fc]\ntype = linear\nout = 32\n[layer.act]\ntype = gelu\n'
gen="--prompt the --tokens 8 --seed 3 --temperature 5"

for m in att mlp; do
	kiln 0 train "$tmp/$m.ini"
	kiln 0 generate "$tmp/$m.ini" $gen
	cp "$out" "$tmp/$m.ref"
done

KILN_PLUGIN_PATH=$plugdir
export KILN_PLUGIN_PATH
fallback="device = auto: generating on the CPU device (tnodecode has no ATTENTION_DECODE, the decoding attention, yet)"

# attention: auto falls back to the CPU device; naming tnodecode is refused
kiln 0 generate "$tmp/att.ini" run.device=auto $gen
stderr_has "$fallback"
cmp -s "$out" "$tmp/att.ref" || fail "auto's text differs from run.device=cpu's"
kiln 2 generate "$tmp/att.ini" run.device=tnodecode $gen
stderr_has "generation needs the CPU device: set run.device=cpu (the tnodecode device has no ATTENTION_DECODE"
[ ! -s "$out" ] || fail "a refused generate printed text"

# no attention: generates on tnodecode, named or chosen by auto
kiln 0 generate "$tmp/mlp.ini" run.device=tnodecode $gen
cmp -s "$out" "$tmp/mlp.ref" || fail "tnodecode's text differs from run.device=cpu's"
kiln 0 generate "$tmp/mlp.ini" run.device=auto $gen
stderr_has "device = auto: using tnodecode"
! grep -qF "generating on the CPU device" "$err" || fail "auto fell back for a model without attention"
cmp -s "$out" "$tmp/mlp.ref" || fail "auto's text differs from run.device=cpu's"
# a device built before ABI 2.31: the prompt a position a step, its text
# the CPU device's prefilled text, byte for byte.  Greedy: the prefill's
# GEMMs of T rows and blocked causal attention (session 44) round
# otherwise than the steps, within 1e-5 of their logits
# (tests/check_generate.c, test_prefill_equals_steps), which moves a
# random draw (--temperature 2) across a boundary between two tokens'
# cumulative probabilities when the uniform falls within that much of
# one, at any of 255 boundaries a token; the argmax only for two largest
# logits within 1e-5 of each other, which this model's are not (that
# would fail here, not pass by luck)
long="--prompt thequick --tokens 8 --temperature 0"
unset KILN_PLUGIN_PATH
kiln 0 generate "$tmp/att.ini" $long
! grep -qF "not prefilled" "$err" || fail "the CPU device fed the prompt a position a step: $(cat "$err")"
head -c 8 "$out" | grep -qx thequick || fail "the prefilled text does not start with the prompt: $(cat "$out")"
[ "$(wc -c <"$out")" = 17 ] || fail "not the prompt and 8 bytes and a newline prefilled: $(cat "$out")"
cp "$out" "$tmp/prefill.ref"
KILN_PLUGIN_PATH=$plugdir
export KILN_PLUGIN_PATH
kiln 0 generate "$tmp/att.ini" run.device=tprefill28 $long
stderr_has "the prompt is fed a position a step, not prefilled: "
stderr_has "tprefill28: built for ABI 2.28, before the decoding attention of several positions a run (2.31)"
[ "$(grep -c "not prefilled" "$err")" = 1 ] || fail "the fallback said more than once"
cmp -s "$out" "$tmp/prefill.ref" || fail "tprefill28's text fed a step a position differs from the prefilled: $(cat "$out") vs $(cat "$tmp/prefill.ref")"
kiln 0 generate "$tmp/att.ini" run.device=tnorun $long
stderr_has "the prompt is fed a position a step, not prefilled: "
stderr_has "tnorun: ATTENTION_DECODE_RUN is not implemented by this device"
[ "$(grep -c "not prefilled" "$err")" = 1 ] || fail "the fallback said more than once"
cmp -s "$out" "$tmp/prefill.ref" || fail "tnorun's text fed a step a position differs from the prefilled: $(cat "$out") vs $(cat "$tmp/prefill.ref")"
echo "generate_device: $checks checks passed"
