#!/bin/sh
# tests/png16.sh - 16-bit PNGs are reduced to 8 bits by keeping the high
# byte (v >> 8), as PIL does for 16-bit colour and docs/data.md says: a
# 16-bit gray PNG of an 8-bit one's samples times 257 (no gAMA or sRGB
# chunk, as PIL writes them) predicts the 8-bit one's logits bit for bit,
# and one of samples 257 v + 128 (within half a step of v) those of v +
# (v >= 128), its high byte.  Before session 41 kiln rounded v * 255 /
# 65535 (257 v + 128 -> v), 1 more than PIL's high byte for about a
# quarter of 16-bit colour values (tests/check_image has PIL's pixels of a
# 16-bit RGB file); before session 28 libpng's simplified API read 16-bit
# samples as linear light and mapped them through the sRGB curve (3 * 257
# -> 33, 89 * 257 -> 158), so the logits differed by up to 1.5.  Since
# session 36 no gAMA or sRGB chunk changes the samples of any PNG
# (tests/check_image has a 16-bit gAMA 1.0 file).  Only python3's standard
# library.
name=png16
. "$(dirname "$0")/lib.sh"
need_python3
need_source idx
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
mkdir -p "$tmp/p8" "$tmp/p8r" "$tmp/p16" "$tmp/p16r"
"$py" - "$tmp" <<'PY' || fail "writing the PNGs"
import struct, sys, zlib
d = sys.argv[1]
def png(path, rows, bits):
    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    w, h = len(rows[0]), len(rows)
    raw = b"".join(b"\0" + b"".join(struct.pack(">H" if bits == 16 else "B", v) for v in r) for r in rows)
    ihdr = struct.pack(">IIBBBBB", w, h, bits, 0, 0, 0, 0)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                           chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
for k in range(4):
    rows = [[(k * 61 + y * 29 + x * 7) % 256 for x in range(8)] for y in range(8)]
    png("%s/p8/%d.png" % (d, k), rows, 8)
    png("%s/p16/%d.png" % (d, k), [[v * 257 for v in r] for r in rows], 16)
    r16 = [[v * 257 + (128 if v < 255 else 0) for v in r] for r in rows]
    png("%s/p16r/%d.png" % (d, k), r16, 16)
    png("%s/p8r/%d.png" % (d, k), [[v >> 8 for v in r] for r in r16], 8)
PY
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors run.out_dir="
for s in p8 p8r p16 p16r; do
	kiln 0 predict "$ini" $common "$tmp/$s" --logits "$tmp/$s.npy"
done
cmp -s "$tmp/p8.npy" "$tmp/p16.npy" || fail "16-bit samples v * 257 predict other logits than the 8-bit v"
cmp -s "$tmp/p8.npy" "$tmp/p8r.npy" && fail "the high bytes of 257 v + 128 are v: the test would not tell the rules apart"
cmp -s "$tmp/p8r.npy" "$tmp/p16r.npy" || fail "16-bit samples 257 v + 128 predict other logits than their high bytes, v + (v >= 128)"
echo "ok: 16-bit PNGs give their high bytes' logits"
echo "PASS ($checks kiln runs)"
exit 0
