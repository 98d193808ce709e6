#!/bin/sh
# tests/int8_crc.sh - the CRC32Cs of an INT8 model of `kiln quantize`
# (metadata kiln.crc32c, since session 40; docs/formats.md "INT8 model"):
# before, a byte changed in the file (a bad copy, a disk) loaded silently
# where the values stayed in range: a weight's 7 bits one off, a scale a
# little other, the predictions of another model.
#  1. tests/data/tr_cnn quantized: `kiln predict --quantized --eval-set`
#     runs it; one bit flipped in each tensor in turn: predict and `kiln
#     eval --quantized` exit 3 naming the file, the tensor and the CRCs;
#  2. a byte of the header changed (the config's text, a layer's u8 input
#     told s8: one bit apart): refused, naming the header;
#  3. kiln.crc32c that is not 1 + n CRCs: refused, naming the key;
#  4. a file without kiln.crc32c (a kiln before session 40) loads
#     unchecked, as before: the same predictions as the file it came
#     from (and a flipped byte in it is not found: the format's version
#     stays kiln-int8/1, the key is optional).
name=int8_crc
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
c="data.path=$data data.eval.path=$data run.out_dir=$tmp/none"
q="$tmp/q.int8"
kiln 0 quantize "$ini" $c --checkpoint "$data/tr_cnn_trained.safetensors" --calibrate 1 \
	--out "$q" data.eval.split=train
kiln 0 predict "$ini" $c --quantized "$q" --eval-set
cp "$out" "$tmp/whole.predict"

# ---- 1. a flipped bit in each tensor --------------------------------------
crc_flips "$q" --quantized predict "$ini" $c --eval-set
[ "$(echo "$tensors" | wc -w)" -ge 5 ] || fail "the INT8 file holds the tensors: $tensors"
kiln 3 eval "$ini" $c --quantized "$flipped"
stderr_has "$flipped: tensor '$t' does not match its CRC32C"
echo "ok: a bit flipped in any of $(echo "$tensors" | wc -w) tensors is refused, predict and eval"

# ---- 2. the header --------------------------------------------------------
for w in header input; do
	st_mut "$q" "$tmp/h.int8" $w
	kiln 3 predict "$ini" $c --quantized "$tmp/h.int8" --eval-set
	stderr_has "$tmp/h.int8: the header (tensor names, dtypes, shapes, metadata) does not match its CRC32C"
	stderr_has "written; a tool that changes a kiln file must drop metadata kiln.crc32c"
done

# ---- 3. a kiln.crc32c that is not the file's --------------------------------
st_mut "$q" "$tmp/c.int8" crcs
kiln 3 predict "$ini" $c --quantized "$tmp/c.int8" --eval-set
stderr_has "$tmp/c.int8: metadata kiln.crc32c is not $(($(echo "$tensors" | wc -w) + 1)) CRC32Cs of 8 hex digits"

# ---- 4. an older file: no CRC, unchecked --------------------------------------
st_mut "$q" "$tmp/old.int8" old
kiln 0 predict "$ini" $c --quantized "$tmp/old.int8" --eval-set
cmp -s "$out" "$tmp/whole.predict" || fail "the file without kiln.crc32c predicts otherwise"
st_mut "$q" "$tmp/oldf.int8" oldflip conv1.bias
kiln 0 predict "$ini" $c --quantized "$tmp/oldf.int8" --eval-set
echo "ok: a file without kiln.crc32c (an older kiln's) loads as before, unchecked"
echo "PASS ($checks kiln runs)"
