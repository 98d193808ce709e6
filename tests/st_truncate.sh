#!/bin/sh
# tests/st_truncate.sh - a weights file cut short while kiln reads it (the
# weights exported again over the same path while `kiln predict` or `kiln
# train` with init_from runs; a network file system): the command stops
# with exit 3 and an error naming the file, the tensor, its bytes, how
# many were there and the file's size when kiln opened it and now.
# Before session 39 kiln read safetensors files through a mapping: a page
# past the new end killed it with SIGBUS (exit 135, nothing said), and
# within the file's last page the lost bytes read as zeros, loaded as
# weights (exit 0: `kiln eval` reported the loss of an all-zero model).
#
# tests/shim_fault.c (SHIM_TRUNC_*) cuts the file to its first SIZE bytes
# as kiln first maps it or reads past them: after kiln opened it and took
# its size, before any tensor was read.  SIZE keeps the header (8 + N
# bytes; llm.c's: 1024), so the file is still well formed when opened.
#  1. the GPT (114 KB of weights): `kiln export`, `kiln predict` and `kiln
#     eval` with --checkpoint W, `kiln train` with [model] init_from = W;
#  2. tests/data/tr_cnn (2116 bytes, one page), `kiln eval --checkpoint`;
#  3. llm.c's model file as init_from (read whole before session 39: "read
#     failed", exit 1, naming no tensor);
#  4. an INT8 model of `kiln quantize`, `kiln predict --quantized`.
name=st_truncate
. "$(dirname "$0")/lib.sh"
need_source tokens
need_source idx
data="$srcdir/tests/data"
shim_build || fail "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"

# header FILE: the bytes of a safetensors file's header, its length included
header() { echo $((8 + $(od -An -t u8 -N8 "$1"))); }

# cut WANT FILE SIZE CMD...: `kiln CMD` with FILE (the weights it reads: a
# copy made anew from $src) cut to SIZE bytes as described above; exit WANT
cut() {
	_want=$1 _file=$2 _size=$3
	shift 3
	cp "$src" "$_file"
	last="$* (cut to $_size bytes)"
	(export LD_PRELOAD="$shim" SHIM_TRUNC_PATH="$_file" SHIM_TRUNC_SIZE="$_size" \
		SHIM_TRUNC_PAST="$_size"; exec "$kiln" "$@") >"$out" 2>"$err"
	rc=$?
	checks=$((checks + 1))
	[ "$rc" -lt 128 ] || fail "exit code $rc: killed by a signal (SIGBUS: the file is mapped)"
	[ "$rc" -eq "$_want" ] || fail "exit code $rc, expected $_want"
	[ "$(wc -c <"$_file")" -eq "$_size" ] || fail "the shim did not cut $_file"
}

# said FILE SIZE: the error names FILE (once: --checkpoint's said what F
# is not, then F again, before session 40), a tensor, its bytes, 0 of
# them there, and FILE's sizes at open ($src's) and now (SIZE)
said() {
	grep -qE "^kiln: error: .*$1(: not a kiln checkpoint, and as a weights file \(safetensors, llm\.c's model file\))?: tensor '[^']+' \(bytes [0-9]+\.\.[0-9]+\): only 0 of [0-9]+ bytes are there: the file had $(wc -c <"$src") bytes when kiln opened it, it has $2 now \(was it truncated or rewritten while kiln read it\?\)\$" "$err" ||
		fail "no error naming the file, the tensor and the sizes"
	echo "ok: kiln $last: exit 3, $(grep 'kiln: error' "$err" | sed 's/.*\(tensor .*\)/\1/')"
}

# ---- 1. the GPT ----------------------------------------------------------
src="$data/gpt_init.safetensors"
w="$tmp/w.safetensors"
g="$data/gpt_tiny.ini data.path=$data/gpt_tokens.bin run.out_dir=$tmp/none"
h=$(header "$src")
cut 3 "$w" "$h" export $g --checkpoint "$w" --safetensors "$tmp/x.safetensors"
said "$w" "$h"
[ ! -e "$tmp/x.safetensors" ] || fail "export wrote $tmp/x.safetensors from a cut file"
cut 3 "$w" "$h" predict $g --checkpoint "$w" --eval-set
said "$w" "$h"
cut 3 "$w" "$h" eval $g data.eval.path="$data/gpt_tokens.bin" --checkpoint "$w"
said "$w" "$h"
cut 3 "$w" "$h" train $g "run.out_dir=$tmp/tr" "model.init_from=$w" train.max_steps=1
said "$w" "$h"
grep -q "\[model\] init_from: $w: tensor" "$err" || fail "train's error does not name [model] init_from"
# uncut, the same commands run
cp "$src" "$w"
kiln 0 export $g --checkpoint "$w" --safetensors "$tmp/x.safetensors"
kiln 0 train $g "run.out_dir=$tmp/tr" "model.init_from=$w" train.max_steps=1

# ---- 2. a file of one page ------------------------------------------------
src="$data/tr_cnn_trained.safetensors"
c="$data/tr_cnn.ini data.path=$data data.eval.path=$data run.out_dir=$tmp/none"
h=$(header "$src")
cut 3 "$w" "$h" eval $c --checkpoint "$w"
said "$w" "$h"

# ---- 3. llm.c's model file ------------------------------------------------
src="$data/gpt2_llmc.bin"
b="$tmp/w.bin"
cut 3 "$b" 1024 export $g "model.init_from=$b" --safetensors "$tmp/x.safetensors"
said "$b" 1024

# ---- 4. an INT8 model -----------------------------------------------------
kiln 0 quantize $c --checkpoint "$data/tr_cnn_trained.safetensors" --calibrate 1 \
	--out "$tmp/q.safetensors" data.eval.split=train
src="$tmp/q.safetensors"
q="$tmp/wq.safetensors"
h=$(header "$src")
cut 3 "$q" "$h" predict $c --quantized "$q" --eval-set
said "$q" "$h"

echo "PASS: $checks checks"
