#!/bin/sh
# tests/st_vmem.sh - a safetensors file larger than the address space a
# job may use (`ulimit -v`, a batch system's h_vmem) is read: kiln's
# loaders pread each tensor and map nothing.  Before session 40 every
# open mapped the file whole, which they never read, and a 4 GiB file
# under `ulimit -v 2000000` failed before any tensor was read: "W: cannot
# map: Cannot allocate memory", exit 1.
#
# W holds a small model's weights (tests exported them) and one more
# tensor of 4 GiB that the model does not take (init_strict = 0 skips
# it), stored as a hole: the file is sparse, no disk is written.  `kiln
# eval --checkpoint W` under `ulimit -v 2000000` (1.9 GiB; the same run
# needs about 0.4 here) must give the loss of the same weights from the
# small file, bit for bit, and say it skipped the big tensor.  The eval
# seed is not the export's: initial weights would give another loss.
name=st_vmem
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source synthetic
limit=2000000 # KiB

ini="$tmp/v.ini"
{
	ini run seed=9 threads=1
	ini_synthetic 64 8 10 workers=1
	linear_layers 10
	ini train batch=16
} > "$ini"
small="$tmp/small.safetensors"
kiln 0 export "$ini" --safetensors "$small" run.seed=3 run.out_dir="$tmp/none"

# big.safetensors: small's header with "pad.unused" (F32, 2^30 values)
# after its tensors, padded with spaces to a multiple of 8, and without
# kiln.crc32c (another writer's file: kiln's CRCs, since session 41, are
# of small's tensors); small's data; then the 4 GiB hole
hlen=$(od -An -t u8 -N8 "$small" | tr -d ' ')
size=$(wc -c < "$small")
data=$((size - 8 - hlen))
pad=$((1 << 32))
json=$(dd if="$small" bs=1 skip=8 count="$hlen" 2>/dev/null | sed 's/ *$//; s/}$//; s/,"kiln\.crc32c":"[0-9a-f ]*"//')
json="$json,\"pad.unused\":{\"dtype\":\"F32\",\"shape\":[$((pad / 4))],\"data_offsets\":[$data,$((data + pad))]}}"
while [ $(( $(printf '%s' "$json" | wc -c) % 8 )) -ne 0 ]; do json="$json "; done
n=$(printf '%s' "$json" | wc -c)
big="$tmp/big.safetensors"
# the 8-byte little-endian length (n < 65536: two bytes, six zeros)
printf "\\$(printf %03o $((n % 256)))\\$(printf %03o $((n / 256)))\\000\\000\\000\\000\\000\\000" > "$big"
printf '%s' "$json" >> "$big"
dd if="$small" bs=1 skip=$((8 + hlen)) count="$data" 2>/dev/null >> "$big"
truncate -s $((8 + n + data + pad)) "$big" || fail "cannot extend $big"
[ "$(wc -c < "$big")" -eq $((8 + n + data + pad)) ] || fail "$big: wrong size"
used=$(du -k "$big" | cut -f1)
[ "$used" -lt 1024 ] || { echo "SKIP: $tmp's file system stores no holes ($big uses $used KiB)"; exit 77; }

# the small file under the limit: the run fits (the limit is no cause)
(ulimit -v $limit && exec "$kiln" eval "$ini" --checkpoint "$small") >"$out" 2>"$err"
rc=$?
last="eval $ini --checkpoint $small (ulimit -v $limit)"
[ $rc -eq 0 ] || fail "exit code $rc: the run does not fit in ulimit -v $limit even without the big file"
want=$(field test_loss "$out")
[ -n "$want" ] || fail "no test_loss"
echo "ok: kiln $last: test_loss $want"

# the big one: read, not mapped
(ulimit -v $limit && exec "$kiln" eval "$ini" --checkpoint "$big" model.init_strict=0) >"$out" 2>"$err"
rc=$?
last="eval $ini --checkpoint $big model.init_strict=0 (ulimit -v $limit; a $((8 + n + data + pad))-byte file)"
[ $rc -lt 128 ] || fail "exit code $rc: killed by a signal"
! grep -q "cannot map" "$err" || fail "the file was mapped"
[ $rc -eq 0 ] || fail "exit code $rc, expected 0"
got=$(field test_loss "$out")
[ "$got" = "$want" ] || fail "test_loss $got, the same weights from $small gave $want"
grep -q "pad.unused" "$err" || fail "the skipped tensor pad.unused is not named"
echo "ok: kiln $last: test_loss $got, the same as the small file's; pad.unused skipped"
echo "PASS"
exit 0
