#!/bin/sh
# tests/export_crc.sh - the CRC32Cs of kiln's fp32 safetensors files
# (`kiln export --safetensors`, kiln_model_save_safetensors: metadata
# kiln.crc32c since session 41, as kiln quantize's INT8 files since 40;
# docs/safetensors.md "What kiln writes"): before, a byte changed in the
# file (a bad copy, a disk) loaded silently, another weight's value.
#  1. tests/data/tr_cnn's trained weights exported carry the key, and
#     `kiln predict --checkpoint` of the export predicts what the file it
#     came from does (a file of another writer: no key, unchecked);
#  2. one bit flipped in each tensor in turn: predict exits 3 naming the
#     file, the tensor and the CRCs; so do `kiln eval --checkpoint` and
#     [model] init_from (kiln export) for the last;
#  3. a metadata value changed (config_hash): refused, naming the header;
#  4. the key removed (a kiln before session 41): loads unchecked, as
#     before: the same predictions, and a flipped byte in it not found.
name=export_crc
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
c="data.path=$data data.eval.path=$data run.out_dir=$tmp/none"
w="$tmp/w.safetensors"

# ---- 1. the export's CRCs -------------------------------------------------
kiln 0 predict "$ini" $c --checkpoint "$data/tr_cnn_trained.safetensors" --eval-set
cp "$out" "$tmp/given.predict"
kiln 0 export "$ini" $c --checkpoint "$data/tr_cnn_trained.safetensors" --safetensors "$w"
kiln 0 predict "$ini" $c --checkpoint "$w" --eval-set
cmp -s "$out" "$tmp/given.predict" || fail "the export predicts otherwise than the file it came from"

# ---- 2. a flipped bit in each tensor --------------------------------------
crc_flips "$w" --checkpoint predict "$ini" $c --eval-set
[ "$(echo "$tensors" | wc -w)" -ge 5 ] || fail "the export holds the tensors: $tensors"
kiln 3 eval "$ini" $c --checkpoint "$flipped"
stderr_has "tensor '$t' does not match its CRC32C"
kiln 3 export "$ini" $c "model.init_from=$flipped" --safetensors "$tmp/o.st"
stderr_has "tensor '$t' does not match its CRC32C"
[ ! -e "$tmp/o.st" ] || fail "an export from a damaged init_from wrote its file"
echo "ok: a bit flipped in any of $(echo "$tensors" | wc -w) tensors is refused: predict, eval, init_from"

# ---- 3. the header --------------------------------------------------------
st_mut "$w" "$tmp/h.st" meta config_hash
kiln 3 predict "$ini" $c --checkpoint "$tmp/h.st" --eval-set
stderr_has "the header (tensor names, dtypes, shapes, metadata) does not match its CRC32C"
stderr_has "written; a tool that changes a kiln file must drop metadata kiln.crc32c"

# ---- 4. an older file: no CRC, unchecked ----------------------------------
st_mut "$w" "$tmp/old.st" old
kiln 0 predict "$ini" $c --checkpoint "$tmp/old.st" --eval-set
cmp -s "$out" "$tmp/given.predict" || fail "the file without kiln.crc32c predicts otherwise"
st_mut "$w" "$tmp/oldf.st" oldflip "$t"
kiln 0 predict "$ini" $c --checkpoint "$tmp/oldf.st" --eval-set
echo "ok: a file without kiln.crc32c (an older kiln's, another writer's) loads as before, unchecked"
echo "PASS ($checks kiln runs)"
