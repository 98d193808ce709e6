#!/bin/sh
# tests/predict_peek.sh - `kiln predict` of image files reads of [data.eval]
# only what its transforms need: the images' size and channels, from the
# source's peek (source ops version 5, docs/plugins.md "ABI 2.24"), not the
# whole set (before session 39 it opened the set as `kiln eval` does: an
# IDX file inflated and read whole with its labels, every records shard
# mapped and its index checked, every file of a folder listed, every
# member of every tar shard indexed, to learn three numbers).
#
# tests/data/tr_cnn.ini (8x8 gray images, 5 classes) trains 5 steps; its
# evaluation set is packed as PNGs (the inputs), records shards and tar
# shards.  Then, for each source, a [data.eval] whose header (or root) is
# whole but whose data beyond it is bad: an IDX image file cut after its
# header (plain and gzipped) or with its label file gone; records whose
# last shard's index is corrupt; a folder with a class subtree deeper than
# the source allows; tar shards the last of which is cut inside a member.
# `kiln eval` of each fails (exit 3, or 2 for the missing labels), so the
# set is bad; `kiln predict` of the PNGs succeeds with the predictions of
# the good set, byte for byte, and reads none of it: no "[data.eval] is not
# readable" (before session 39 it opened the set, failed, and took the
# model's input as the images' size, saying so).  The size is the peek's:
# records packed at 10x10 and an IDX header of 10x10 (its data cut), with
# no [data.eval] size, refuse the 8x8 PNGs (the model's own size would
# take them); an IDX image file that is not there still gets the model's
# input size, with the info line, as before.
#
# Then --format csv: class names (the folders of a [data] folder source)
# and file names holding a comma, a double quote, a newline, a carriage
# return or a leading space are quoted as RFC 4180 says: Python's csv
# module reads each row back into the file, index, class and probability
# fields of the jsonl output of the same run.
name=predict_peek
. "$(dirname "$0")/lib.sh"
need_python3
for s in idx records folder tar; do need_source $s; done
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors"

kiln 0 train "$ini" $common "run.out_dir=$tmp/run"
ck="$tmp/run/checkpoints/ckpt-5.kiln"
kiln 0 pack "$ini" --format folder --store png --out "$tmp/png" --section data.eval $common
pngs="$tmp/png/test"
kiln 0 pack "$ini" --out "$tmp/rec" --section data.eval --shard-size 4K $common
[ "$(ls "$tmp/rec" | grep -c '^test-.*\.krec$')" -ge 2 ] || fail "kiln pack wrote one shard: $(ls "$tmp/rec")"
# tr_cnn.ini without [data.eval]'s idx keys, for the other sources
awk '/^\[/ { ev = $0 == "[data.eval]" } ev && /^(images|labels) =/ { next } { print }' \
	"$ini" >"$tmp/noev.ini"

# the predictions with the whole idx set
kiln 0 predict "$ini" --checkpoint "$ck" "$pngs" --top-k 5 $common
cp "$out" "$tmp/ref.jsonl"
[ "$(wc -l <"$tmp/ref.jsonl")" -eq 48 ] || fail "predict printed $(wc -l <"$tmp/ref.jsonl") lines, not 48"

# the bad sets
"$py" - "$tmp" "$data" <<'EOF' || exit 99
import gzip, glob, io, os, shutil, sys, tarfile
t, data = sys.argv[1], sys.argv[2]
img = open(data + "/tr_cnn_images.idx", "rb").read()
lab = open(data + "/tr_cnn_labels.idx", "rb").read()
assert len(img) == 16 + 48 * 64, len(img)
# idx: the header and half the images; gzipped, the stream cut in half
os.mkdir(t + "/idx")
open(t + "/idx/cut.idx", "wb").write(img[:16 + 24 * 64])
open(t + "/idx/labels.idx", "wb").write(lab)
gz = gzip.compress(img, mtime=0)
open(t + "/idx/cut.gz", "wb").write(gz[:len(gz) // 2])
open(t + "/idx/whole.idx", "wb").write(img)
# records: the last shard's index corrupt (one byte before its CRC)
sh = sorted(glob.glob(t + "/rec/test-*.krec"))
b = bytearray(open(sh[-1], "rb").read())
b[-5] ^= 0xff
open(sh[-1], "wb").write(bytes(b))
# tar: WebDataset shards of the PNGs (KEY.png, KEY.cls), the last one cut
# inside its last member
pngs = sorted(glob.glob(t + "/png/test/*/*.png"))
os.mkdir(t + "/tar")
for k in range(3):
    with tarfile.open("%s/tar/test-%d.tar" % (t, k), "w", format=tarfile.USTAR_FORMAT) as tf:
        for p in pngs[k * 16:(k + 1) * 16]:
            key = "%s_%s" % (os.path.basename(os.path.dirname(p)), os.path.basename(p)[:-4])
            for name, blob in ((key + ".png", open(p, "rb").read()),
                               (key + ".cls", os.path.basename(os.path.dirname(p)).encode())):
                ti = tarfile.TarInfo(name); ti.size = len(blob); ti.mtime = 0
                tf.addfile(ti, io.BytesIO(blob))
last = t + "/tar/test-2.tar"
with tarfile.open(last) as tf:
    m = tf.getmembers()[-2]  # the last image
cut = m.offset_data + m.size // 2
open(last, "r+b").truncate(cut)
# folder: a copy with a class subtree 70 directories deep (the source
# allows 64)
shutil.copytree(t + "/png/test", t + "/deep/test")
d = t + "/deep/test/0"
for i in range(70):
    d += "/d"
os.makedirs(d)
EOF

# bad EXIT WHAT MESSAGE INI OVERRIDES...: `kiln eval` of the set fails with
# EXIT and MESSAGE, and `kiln predict` of the PNGs gives the good set's
# predictions, reading none of the bad part
bad() {
	code=$1 what=$2 msg=$3 cfg=$4
	shift 4
	kiln "$code" eval "$cfg" --checkpoint "$ck" $common "$@"
	stderr_has "$msg"
	kiln 0 predict "$cfg" --checkpoint "$ck" "$pngs" --top-k 5 $common "$@"
	! grep -qF "[data.eval] is not readable" "$err" ||
		fail "$what: predict read the set: $(grep -F "[data.eval] is not readable" "$err")"
	cmp -s "$out" "$tmp/ref.jsonl" || fail "$what: predict's output differs from the good set's"
	echo "ok: $what: eval fails (exit $code), predict reads only what it needs"
}
bad 3 "idx, the image file cut after its header" "$tmp/idx/cut.idx: truncated data in the image file" \
	"$ini" "data.eval.images=$tmp/idx/cut.idx" "data.eval.labels=$tmp/idx/labels.idx"
bad 3 "idx, the gzip stream cut" "$tmp/idx/cut.gz: truncated data in the image file" \
	"$ini" "data.eval.images=$tmp/idx/cut.gz" "data.eval.labels=$tmp/idx/labels.idx" \
	data.eval.unzip_cache=none
bad 2 "idx, no label file" "$tmp/idx/none.idx: no such file" \
	"$ini" "data.eval.images=$tmp/idx/whole.idx" "data.eval.labels=$tmp/idx/none.idx"
bad 3 "records, the last shard's index corrupt" "index CRC32C mismatch" \
	"$tmp/noev.ini" data.eval.source=records "data.eval.path=$tmp/rec"
bad 3 "tar, the last shard cut" "$tmp/tar/test-2.tar: " \
	"$tmp/noev.ini" data.eval.source=tar "data.eval.path=$tmp/tar" data.eval.size=8 \
	data.eval.channels=1
bad 3 "folder, a class subtree too deep" "more than 64 directory levels below the class directory" \
	"$tmp/noev.ini" data.eval.source=folder "data.eval.path=$tmp/deep" data.eval.size=8 \
	data.eval.channels=1

# the size is the set's, told by the peek: records packed at 10x10 and an
# IDX header of 10x10 (its data cut), with no [data.eval] size, take 10x10
# images, not these 8x8 ones (the model's own 8x8, which a set that cannot
# be read gets, would take them)
kiln 0 pack "$ini" --out "$tmp/rec10" --section data.eval --resize 10 $common
"$py" - "$tmp/idx/ten.idx" <<'EOF' || exit 99
import struct, sys
open(sys.argv[1], "wb").write(struct.pack(">IIII", 0x803, 48, 10, 10) + bytes(100))
EOF
kiln 3 predict "$tmp/noev.ini" --checkpoint "$ck" "$pngs" $common data.eval.source=records \
	"data.eval.path=$tmp/rec10"
stderr_has "8x8 pixels, the model reads 10x10 images ([data.eval] sets no size or resize to resize them)"
kiln 3 predict "$ini" --checkpoint "$ck" "$pngs" $common "data.eval.images=$tmp/idx/ten.idx" \
	"data.eval.labels=$tmp/idx/labels.idx"
stderr_has "8x8 pixels, the model reads 10x10 images ([data.eval] sets no size or resize to resize them)"
echo "ok: the peek tells the set's image size"

# and a source whose peek fails says so and goes on as before
kiln 0 predict "$ini" --checkpoint "$ck" "$pngs" --top-k 5 $common \
	"data.eval.images=$tmp/idx/none.idx" "data.eval.labels=$tmp/idx/labels.idx"
stderr_has "[data.eval] is not readable"
stderr_has "$tmp/idx/none.idx: no such file"
cmp -s "$out" "$tmp/ref.jsonl" || fail "predict without [data.eval]'s images predicts otherwise"
echo "ok: a header that cannot be read: the model's input size, as before"

# ---- --format csv: RFC 4180 quoting, read back by Python's csv -----------
"$py" - "$tmp" <<'EOF' || exit 99
import os, shutil, sys
t = sys.argv[1]
names = ["a,b", 'say "hi"', "two\nlines", "cr\rx", " lead"]
assert sorted(names) == [" lead", "a,b", "cr\rx", 'say "hi"', "two\nlines"]
for i, n in enumerate(sorted(names)):
    shutil.copytree("%s/png/test/%d" % (t, i), "%s/cls/train/%s" % (t, n))
os.mkdir(t + "/odd")
one = sorted(os.listdir(t + "/png/test/0"))[0]
for n in ("c,omma.png", 'q"uote.png', "new\nline.png", "cr\rx.png", " lead.png", "plain.png"):
    shutil.copy("%s/png/test/0/%s" % (t, one), "%s/odd/%s" % (t, n))
EOF
data_folder_ini "$tmp/cls" "$ini" "$tmp/cls.ini"
ev="data.eval.source=idx data.eval.path=$data"
kiln 0 predict "$tmp/cls.ini" --checkpoint "$ck" "$tmp/odd" --top-k 5 --format csv $ev
cp "$out" "$tmp/odd.csv"
kiln 0 predict "$tmp/cls.ini" --checkpoint "$ck" "$tmp/odd" --top-k 5 $ev
"$py" - "$tmp/odd.csv" "$out" <<'EOF' || fail "predict's csv is not the jsonl's rows"
import csv, json, sys
rows = list(csv.reader(open(sys.argv[1], newline="", encoding="utf-8"), strict=True))
js = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert rows[0] == ["file"] + [f % j for j in range(1, 6) for f in ("index%d", "class%d", "prob%d")], rows[0]
assert len(rows) == 1 + len(js) == 7, (len(rows), len(js))
classes = set()
for r, j in zip(rows[1:], js):
    assert len(r) == 16 and r[0] == j["file"], (r, j["file"])
    for k, top in enumerate(j["top"]):
        assert r[1 + 3 * k:4 + 3 * k] == [str(top["index"]), top["class"], "%.6g" % top["prob"]], (r, top)
        classes.add(top["class"])
assert classes == {"a,b", 'say "hi"', "two\nlines", "cr\rx", " lead"}, classes
print("csv: %d rows with commas, quotes, newlines and CRs in names read back as jsonl's" % (len(rows) - 1))
EOF
echo "ok: predict --format csv quotes names as RFC 4180 says"
echo "PASS ($checks kiln runs)"
exit 0
