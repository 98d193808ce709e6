#!/bin/sh
# tests/predict.sh - `kiln predict` (docs/inference.md) against `kiln eval`,
# and its refusals.
#
# tests/data/tr_cnn.ini (conv, batchnorm, relu, pool, linear; 48 8x8 gray
# images in 5 classes) trains 5 steps; its evaluation set is written as a
# folder of PNGs (`kiln pack --format folder`).  Then:
#  1. `kiln eval` of a config whose [data.eval] is that folder, and `kiln
#     predict` of the same config on the same folder: the loss (mean
#     -log p[label]) and accuracy computed from predict's probabilities
#     equal eval's to float tolerance; --logits .npy holds the same
#     probabilities' logits; csv has a row per image;
#  1b2. into a closed pipe (`| head` gone) it stops after the first batch,
#     exit 1 without an error;
#  2. the idx config (its images have one size: predict checks each PNG
#     against it) predicts the same; so do the exported safetensors
#     weights and batch 7 (batch 1: same argmax, probabilities within 2e-6),
#     the safetensors named as the weights (no initial-weights warning; a
#     bad one's message names the file, not init_from);
#  3. corrupt, truncated, empty, wrong-size, wrong-channel-count and
#     non-image files, a FIFO, a device and a file larger than any image
#     fail with exit 3 and a message naming the file (none blocks; an RGBA
#     file's says so, a resize past the limit on a side names it); a
#     missing path or an image-less folder exit 2; a folder's links back
#     to itself are skipped with a warning;
#  3b. folding (the default) against --no-fold: logits within 2e-5 of
#     the largest, the same argmax; `kiln quantize`, then `predict
#     --quantized` gives `eval --quantized`'s loss and accuracy, and
#     --no-fold with it is refused (exit 2: an INT8 model is folded), and
#     so is a checkpoint passed as the INT8 model, named as one;
#  3b2. a model whose layernorm refuses nhwc, trained nchw: predict, eval
#     --fold and quantize keep nchw (the log says why), folded = --no-fold;
#     quantize of a model of one 1-channel conv says it stays f32;
#  3c. [run] precision = bf16: eval and predict run bf16 (logits and loss
#     off fp32's by a bf16-sized amount; predict --no-fold's loss = eval's);
#  3d. [data.eval] dtype = bf16: predict --eval-set and predict of image
#     files give eval's loss (their samples rounded to bf16 as the loader's);
#  4. tests/infer_threads: the C API from threads (one shared model, and
#     a model per thread) gives the single-threaded logits bit for bit.
# The checks need only python3's standard library.
name=predict
. "$(dirname "$0")/lib.sh"
need_python3
need_source idx
need_source folder
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors"

kiln 0 train "$ini" $common "run.out_dir=$tmp/run"
ck="$tmp/run/checkpoints/ckpt-5.kiln"
[ -f "$ck" ] || fail "no checkpoint $ck"
kiln 0 pack "$ini" --format folder --store png --out "$tmp/png" --section data.eval $common
pngs="$tmp/png/test"
[ -d "$pngs" ] || fail "kiln pack wrote no $pngs"

# the same model with [data.eval] = the PNG folder
awk -v png="$tmp/png" '/^\[/ { ev = $0 == "[data.eval]" }
	ev && /^(images|labels) =/ { next }
	{ print }
	$0 == "[data.eval]" { print "source = folder\npath = " png "\nsize = 8\nchannels = 1" }' \
	"$ini" >"$tmp/f.ini"
# and, for the C API (which takes no overrides), [data] path in the file
awk -v d="$data" '{ print } $0 == "[data]" { print "path = " d }' "$ini" >"$tmp/t.ini"

# ---- 1. predict = eval ------------------------------------------------------
kiln 0 eval "$tmp/f.ini" --checkpoint "$ck" "data.path=$data"
cp "$out" "$tmp/eval.json"
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$pngs" --top-k 5 "data.path=$data"
cp "$out" "$tmp/pred.jsonl"
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$pngs" --logits "$tmp/logits.npy" "data.path=$data"
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$pngs" --format csv --top-k 2 "data.path=$data"
cp "$out" "$tmp/pred.csv"
# a folder given with its trailing slash: its files' paths have one slash
# before the name (they had two: "test//0/x.png")
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$pngs/" --format csv --top-k 2 "data.path=$data"
! grep -q '//' "$out" || fail "a folder with a trailing slash gives paths with '//': $(grep -m1 '//' "$out")"
"$py" - "$tmp/eval.json" "$tmp/pred.jsonl" "$tmp/logits.npy" "$tmp/pred.csv" <<'EOF' || fail "predict disagrees with eval"
import json, math, os, struct, sys
ev = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
assert len(rows) == ev["test_samples"] == 48, (len(rows), ev["test_samples"])
loss = acc = 0.0
names = sorted(os.listdir(os.path.dirname(os.path.dirname(rows[0]["file"]))))
for r in rows:
    label = names.index(os.path.basename(os.path.dirname(r["file"])))
    probs = {t["index"]: t["prob"] for t in r["top"]}
    assert len(probs) == 5 and abs(sum(probs.values()) - 1) < 1e-4, r
    assert [t["class"] for t in r["top"]] == [names[t["index"]] for t in r["top"]], r
    loss -= math.log(probs[label])
    acc += r["top"][0]["index"] == label
loss /= len(rows); acc /= len(rows)
print("eval: loss %.6f acc %.6f; predict: loss %.6f acc %.6f" % (ev["test_loss"], ev["test_acc"], loss, acc))
assert abs(loss - ev["test_loss"]) <= 1e-4 * max(1, ev["test_loss"]), "loss"
assert round(acc * 48) == round(ev["test_acc"] * 48), "accuracy"
raw = open(sys.argv[3], "rb").read()
assert raw[:6] == b"\x93NUMPY"
hl = struct.unpack("<H", raw[8:10])[0]
hdr = raw[10:10 + hl].decode()
assert "(48, 5)" in hdr and "<f4" in hdr and (10 + hl) % 64 == 0, hdr
lg = struct.unpack("<240f", raw[10 + hl:])
for i, r in enumerate(rows):
    l = lg[5 * i:5 * i + 5]
    m = max(l); s = sum(math.exp(v - m) for v in l)
    for t in r["top"]:
        assert abs(math.exp(l[t["index"]] - m) / s - t["prob"]) < 1e-5, (i, t)
csv = open(sys.argv[4]).read().splitlines()
assert csv[0] == "file,index1,class1,prob1,index2,class2,prob2", csv[0]
assert len(csv) == 49 and csv[1].split(",")[1] == str(rows[0]["top"][0]["index"]), csv[1]
EOF
echo "ok: predict's probabilities give eval's loss and accuracy; npy and csv agree"

# ---- 1b. --eval-set: the idx set itself, as eval reads it ----------------
kiln 0 eval "$ini" --checkpoint "$ck" "data.path=$data"
cp "$out" "$tmp/eval_idx.json"
kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --top-k 5 --batch 10 "data.path=$data"
"$py" - "$tmp/eval_idx.json" "$out" <<'EOF' || fail "predict --eval-set disagrees with eval"
import json, math, sys
ev = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
assert [r["sample"] for r in rows] == list(range(48)), "sample order"
loss = sum(-math.log({t["index"]: t["prob"] for t in r["top"]}[r["label"]]) for r in rows) / 48
acc = sum(r["top"][0]["index"] == r["label"] for r in rows) / 48
print("eval: loss %.6f acc %.6f; predict --eval-set: loss %.6f acc %.6f" % (ev["test_loss"], ev["test_acc"], loss, acc))
assert abs(loss - ev["test_loss"]) <= 1e-4 * max(1, ev["test_loss"]) and round(acc * 48) == round(ev["test_acc"] * 48)
EOF
kiln 2 predict "$ini" --checkpoint "$ck" --eval-set "$pngs" "data.path=$data"
echo "ok: predict --eval-set gives eval's loss and accuracy"

# ---- 1b2. a reader that is gone: predict stops after the batch ----------
# stdout a pipe whose reading end is closed before kiln starts (every
# write fails with EPIPE): the first of the 6 batches of 8 is the last run,
# exit 1 with no error (before session 36 every batch ran, to the end)
KILN_LOG_LEVEL=debug "$py" - "$kiln" "$err" predict "$ini" --checkpoint "$ck" --eval-set --batch 8 \
	"data.path=$data" <<'EOF' || fail "predict into a closed pipe: $(tail -3 "$err")"
import os, subprocess, sys
r, w = os.pipe()
os.close(r)
rc = subprocess.call([sys.argv[1]] + sys.argv[3:], stdout=w, stderr=open(sys.argv[2], "w"))
sys.exit(0 if rc == 1 else "exit %d, expected 1" % rc)
EOF
stderr_has "[predict] debug: standard output cannot be written: stopped after sample 7"
! grep -q "kiln: error" "$err" || fail "predict into a closed pipe printed an error: $(grep "kiln: error" "$err")"
echo "ok: predict into a closed pipe stops after its first batch, exit 1, quietly"

# ---- 1c. training and evaluation folders with other classes ----------------
# train/ has the classes 0..4, test/ lacks 1: the folder source labelled
# test/2 as 1 (each split by its own sorted folders) and eval's numbers were
# wrong with exit 0; predict named the classes from [data.eval], index 1 "2".
mkdir -p "$tmp/miss/train" "$tmp/miss/test"
cp -r "$pngs"/* "$tmp/miss/train/"
cp -r "$pngs"/0 "$pngs"/2 "$pngs"/3 "$pngs"/4 "$tmp/miss/test/"
# f.ini with [data] a folder too (its [data.eval] inherits the folder source)
data_folder_ini "$tmp/miss" "$tmp/f.ini" "$tmp/fm.ini"
mf="data.eval.path=$tmp/miss"
kiln 3 eval "$tmp/fm.ini" --checkpoint "$ck" $mf
stderr_has "[data.eval] $tmp/miss/test has 4 class folders and [data] $tmp/miss/train has 5, and class 1 is '2' in [data.eval] but '1' in [data]"
kiln 3 train "$tmp/fm.ini" $mf "run.out_dir=$tmp/run_miss" train.max_steps=1
stderr_has "class 1 is '2' in [data.eval] but '1' in [data]"
kiln 3 predict "$tmp/fm.ini" --checkpoint "$ck" --eval-set $mf
stderr_has "class 1 is '2' in [data.eval] but '1' in [data]"
# predict names the classes the model learnt: [data]'s (here = the indices)
kiln 0 predict "$tmp/fm.ini" --checkpoint "$ck" "$pngs/1" --format csv --top-k 5 $mf
awk -F, 'NR > 1 { for (j = 2; j <= NF; j += 3) if ($j != $(j + 1)) { print; exit 1 } }' "$out" ||
	fail "predict names a class other than [data]'s: $(sed -n 2p "$out")"
# the same folders: no refusal
mkdir "$tmp/miss/test/1"
kiln 0 eval "$tmp/fm.ini" --checkpoint "$ck" $mf
# [data] the classes' root itself (no train/), written with a slash, and
# the test split below it: one tree; test/ is [data]'s last class, after
# 0..4, so every label agrees and it passes (docs/data.md; the roots were
# compared as written, "D/" against "D/test", and refused before session
# 31; a nested pair was not compared at all before session 32:
# tests/check_sources' test_folder_nested_eval has the refusals)
mkdir -p "$tmp/nest/test"
cp -r "$pngs"/* "$tmp/nest/"
cp -r "$pngs"/* "$tmp/nest/test/"
kiln 0 eval "$tmp/fm.ini" --checkpoint "$ck" "data.path=$tmp/nest/" "data.eval.path=$tmp/nest/test"
echo "ok: train/test class folders that differ are refused; predict names [data]'s"

# ---- 2. the idx config, exported weights, other batches -----------------
kiln 0 predict "$ini" --checkpoint "$ck" "$pngs" --top-k 5 "data.path=$data" --batch 7
cmp -s "$out" "$tmp/pred.jsonl" || fail "the idx config predicts otherwise than the folder config"
kiln 0 export "$ini" --checkpoint "$ck" --safetensors "$tmp/w.safetensors" "data.path=$data"
kiln 0 predict "$ini" --checkpoint "$tmp/w.safetensors" "$pngs" --top-k 5 "data.path=$data" --batch 7
cmp -s "$out" "$tmp/pred.jsonl" || fail "the exported safetensors predict otherwise"
# named as the weights, not as initial weights (a false warning before)
stderr_has "predicting with the weights of $tmp/w.safetensors"
! grep -q "initial weights" "$err" || fail "a safetensors --checkpoint: a warning of initial weights"
# batch 1: oneDNN computes a one-row product with another kernel (other
# rounding), so the same classes, probabilities within 2e-6
kiln 0 predict "$ini" --checkpoint "$tmp/w.safetensors" "$pngs" --top-k 5 "data.path=$data" --batch 1
"$py" - "$out" "$tmp/pred.jsonl" <<'EOF' || fail "batch 1 predicts otherwise than batch 7"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 48, (len(a), len(b))
d = 0.0
for x, y in zip(a, b):
    assert x["file"] == y["file"]
    assert x["top"][0]["index"] == y["top"][0]["index"], x["file"]
    d = max([d] + [abs(p["prob"] - q["prob"]) for p, q in zip(x["top"], y["top"])])
assert d <= 2e-6, d
print("batch 1 vs 7: same argmax, probabilities within %.1e" % d)
EOF
# the default checkpoint: the newest in [run] out_dir
kiln 0 predict "$ini" "$pngs" --top-k 5 "data.path=$data" "run.out_dir=$tmp/run"
cmp -s "$out" "$tmp/pred.jsonl" || fail "the default checkpoint predicts otherwise"
echo "ok: the same predictions from the idx config, safetensors, batch 7; batch 1 within 2e-6"

# ---- 2b. no data files; no trained weights ------------------------------------
# the checkpoint records the model's input shape (its "sample" section), so
# predict opens no [data] file: the PNGs are taken at the model's 8x8x1
mkdir "$tmp/nodata"
kiln 0 predict "$ini" --checkpoint "$ck" "$pngs" --top-k 5 "data.path=$tmp/nodata"
stderr_has "[data.eval] is not readable"
cmp -s "$out" "$tmp/pred.jsonl" || fail "predict without the data files predicts otherwise"
kiln 0 export "$ini" --checkpoint "$ck" --safetensors "$tmp/nodata.safetensors" "data.path=$tmp/nodata"
# no checkpoint: the seeded initial weights with a warning, as `kiln export`
# takes them; the same predictions as from that export
kiln 0 export "$ini" --safetensors "$tmp/init.safetensors" "data.path=$data" "run.out_dir=$tmp/none"
stderr_has "exporting the initial weights"
kiln 0 predict "$ini" "$pngs" --top-k 5 "data.path=$data" "run.out_dir=$tmp/none"
stderr_has "predicting with the initial weights ([run] seed)"
cp "$out" "$tmp/init.jsonl"
cmp -s "$out" "$tmp/pred.jsonl" && fail "the initial weights predict as the trained ones"
kiln 0 predict "$ini" --checkpoint "$tmp/init.safetensors" "$pngs" --top-k 5 "data.path=$data"
cmp -s "$out" "$tmp/init.jsonl" || fail "predict of the initial weights differs from their export's"
echo "ok: predict without the data files; the initial weights as export takes them"

# ---- 3. bad inputs -------------------------------------------------------
one=$(find "$pngs" -name '*.png' | sort | head -1)
"$py" - "$tmp/bad" "$one" <<'EOF' || exit 99
import os, struct, sys, zlib
d = sys.argv[1]; os.mkdir(d)
def png(path, w, h, c):
    raw = b"".join(b"\0" + bytes((x * 7 + y) % 256 for x in range(w * c)) for y in range(h))
    chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, {1: 0, 3: 2}[c], 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
png(d + "/big.png", 16, 16, 1)
png(d + "/rgb.png", 8, 8, 3)
png(d + "/ok.png", 8, 8, 1)
good = open(sys.argv[2], "rb").read()
open(d + "/trunc.png", "wb").write(good[:len(good) // 2])
open(d + "/corrupt.png", "wb").write(good[:40] + bytes(range(256)) + good[40:])
open(d + "/noise.png", "wb").write(bytes((i * 37) % 256 for i in range(300)))
open(d + "/notes.txt", "w").write("not an image\n")
open(d + "/empty.png", "wb").close()
EOF
kiln 0 predict "$ini" --checkpoint "$ck" "$tmp/bad/ok.png" "data.path=$data"
stdout_has "ok.png"
for f in big.png rgb.png trunc.png corrupt.png noise.png notes.txt empty.png; do
	kiln 3 predict "$ini" --checkpoint "$ck" "$pngs" "$tmp/bad/$f" "data.path=$data"
	stderr_has "$tmp/bad/$f"
done
kiln 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/big.png" "data.path=$data"
stderr_has "16x16 pixels, the model reads 8x8 images"
kiln 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/rgb.png" "data.path=$data"
stderr_has "3 channels, the model reads 1-channel images"
# without the data files: the same checks against the model's input
kiln 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/big.png" "data.path=$tmp/nodata"
stderr_has "16x16 pixels, the model reads 8x8 images"
kiln 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/rgb.png" "data.path=$tmp/nodata"
stderr_has "3 channels, the model reads 1-channel images"
# the channels the file had, where the decoder changed them (an RGBA PNG
# was "3 channels" alone), and a resize past the transforms' limit on a
# side: named, with the sizes width x height as above (it was "a 1x30000
# image resized to 8x240000 (shorter side 8)")
"$py" - "$tmp/odd" <<'EOF' || exit 99
import os, struct, sys, zlib
d = sys.argv[1]; os.mkdir(d)
def png(path, w, h, c):
    raw = b"".join(b"\0" + bytes((x * 7 + y) % 256 for x in range(w * c)) for y in range(h))
    chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, {1: 0, 2: 4, 3: 2, 4: 6}[c], 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
png(d + "/rgba.png", 8, 8, 4)
png(d + "/la.png", 8, 8, 2)
png(d + "/thin.png", 30000, 1, 1)
EOF
kiln 3 predict "$ini" --checkpoint "$ck" "$tmp/odd/rgba.png" "data.path=$data"
stderr_has "$tmp/odd/rgba.png: 3 channels, the model reads 1-channel images ([data.eval] sets no channels to convert them); the file is RGBA (4 channels), decoded to RGB (3) with its alpha composited onto black"
# an RGB file whose alpha is a tRNS chunk is not "RGBA (4 channels)"
kiln 3 predict "$ini" --checkpoint "$ck" "$srcdir/tests/data/png/rgb_trns.png" "data.path=$data"
stderr_has "rgb_trns.png: 4x4 pixels, the model reads 8x8 images ([data.eval] sets no size or resize to resize them); the file is RGB with a tRNS transparency chunk, decoded to RGB (3 channels) with its transparent pixels composited onto black"
# gray with alpha decodes to the model's one channel: no complaint
kiln 0 predict "$ini" --checkpoint "$ck" "$tmp/odd/la.png" "data.path=$data"
kiln 3 predict "$tmp/f.ini" --checkpoint "$ck" "$tmp/odd/thin.png" "data.path=$data" data.eval.resize=8
stderr_has "$tmp/odd/thin.png: a 30000x1 image (width x height) with its shorter side resized to 8 would be 240000x8, outside the transforms' 1 to 65536 pixels a side (MAX_SIDE, core/transform.c): too long and thin for \`resize = 8\`"
# a folder config resizes and converts, as eval would
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$tmp/bad/big.png" "$tmp/bad/rgb.png" "data.path=$data"
kiln 2 predict "$ini" --checkpoint "$ck" "$tmp/nothing.png" "data.path=$data"
stderr_has "$tmp/nothing.png: no such file or folder"
mkdir "$tmp/empty"
kiln 2 predict "$ini" --checkpoint "$ck" "$tmp/empty" "data.path=$data"
stderr_has "no .jpg/.jpeg/.png files"
kiln 2 predict "$ini" --checkpoint "$ck" "$pngs" --logits "$tmp/x.bin" "data.path=$data"
kiln 2 predict "$ini" --checkpoint "$ck" "data.path=$data"
kiln 2 predict "$ini" --checkpoint "$ck" "$pngs" --top-k 0 "data.path=$data"
kiln 2 predict "$ini" --checkpoint "$ck" "$pngs" --format xml "data.path=$data"
stderr_has "--format 'xml': choose jsonl or csv"
kiln 3 predict "$ini" --checkpoint "$tmp/bad/notes.txt" "$pngs" "data.path=$data"
# the message names the --checkpoint file, not a model.init_from the user
# never typed (it began "command line 'model.init_from=...'"), and once
# (twice before session 40: "...model file): $tmp/bad/notes.txt: header")
stderr_has "kiln: error: $tmp/bad/notes.txt: not a kiln checkpoint, and as a weights file (safetensors, llm.c's model file): header length "
! grep -q "init_from" "$err" || fail "a bad safetensors --checkpoint blamed init_from"
# what could hang or exhaust memory, under a 60 s limit (a hang fails as
# exit 124): a FIFO and a device are refused before open() can block, a
# file larger than any image (a sparse one) before it is read, and a
# folder's links back to itself are not followed (2^64 paths before)
printf '#!/bin/sh\nexec timeout 60 "%s" "$@"\n' "$kiln" >"$tmp/kiln60"
chmod +x "$tmp/kiln60"
kiln_60() { _k=$kiln; kiln="$tmp/kiln60"; kiln "$@"; kiln=$_k; }
mkfifo "$tmp/bad/fifo.png" || exit 99
kiln_60 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/fifo.png" "data.path=$data"
stderr_has "$tmp/bad/fifo.png: cannot open the image: a FIFO (named pipe), not a regular file"
kiln_60 3 predict "$ini" --checkpoint "$ck" /dev/zero "data.path=$data"
stderr_has "/dev/zero: cannot open the image: a character device, not a regular file"
truncate -s 1073741825 "$tmp/bad/sparse.png" || exit 99
kiln_60 3 predict "$ini" --checkpoint "$ck" "$tmp/bad/sparse.png" "data.path=$data"
stderr_has "$tmp/bad/sparse.png: 1073741825 bytes is larger than any image kiln reads (1073741824)"
rm "$tmp/bad/fifo.png" "$tmp/bad/sparse.png"
mkdir "$tmp/loop"
cp "$tmp/bad/ok.png" "$tmp/loop/"
ln -s . "$tmp/loop/a" && ln -s . "$tmp/loop/b" || exit 99
kiln_60 0 predict "$ini" --checkpoint "$ck" "$tmp/loop" "data.path=$data"
[ "$(wc -l <"$out")" -eq 1 ] || fail "a folder with links to itself: not the one image once"
stderr_has "$tmp/loop/a: a link back to a directory above it; not followed"
stderr_has "$tmp/loop/b: a link back to a directory above it; not followed"
echo "ok: bad inputs fail naming the file"

# ---- 3a. the jsonl output is JSON ------------------------------------------
# NaN logits give "prob": null; a file name's bytes that are not UTF-8 are
# written as \ufffd (were: nan and the raw bytes).  A weights file holding
# NaN is refused since session 30 (fc1's bias NaN: exit 3 naming it), so the
# NaN logits come from finite weights that overflow (every tensor 3e38:
# inf - inf on the way to the logits)
# (rewritten without kiln.crc32c, as a tool that changes kiln's file must:
# the CRCs would refuse it first; tests/st_mut.py)
st_mut "$tmp/w.safetensors" "$tmp/w_nocrc.safetensors" old
"$py" - "$tmp/w_nocrc.safetensors" "$tmp/nan.safetensors" "$tmp/bad/ok.png" "$tmp/names" <<'EOF' || exit 99
import os, st, struct, sys
f = st.load(sys.argv[1])
nanb, big = bytearray(f.raw), bytearray(f.raw)
a, b = f.span("fc1.bias")
nanb[a:b] = struct.pack("<f", float("nan")) * ((b - a) // 4)
open(sys.argv[2], "wb").write(nanb)
for k, t in f.header.items():
    if t["dtype"] == "F32":
        a, b = f.span(k)
        big[a:b] = struct.pack("<f", 3e38) * ((b - a) // 4)
open(sys.argv[2] + ".big", "wb").write(big)
os.mkdir(sys.argv[4])
png = open(sys.argv[3], "rb").read()
for name in (b"caf\xc3\xa9.png", b"bad\xff.png", b"cut\xe2\x82.png", b"over\xc0\xaf.png", b'q"\\.png'):
    open(os.path.join(os.fsencode(sys.argv[4]), name), "wb").write(png)
EOF
kiln 3 predict "$ini" --checkpoint "$tmp/nan.safetensors" "$tmp/bad/ok.png" --top-k 2 "data.path=$data"
stderr_has "tensor 'fc1.bias' f32[5] holds a non-finite value (nan at element 0): refused"
kiln 0 predict "$ini" --checkpoint "$tmp/nan.safetensors.big" "$tmp/bad/ok.png" --top-k 2 "data.path=$data"
"$py" -c 'import json, sys; r = json.loads(open(sys.argv[1]).read()); assert [t["prob"] for t in r["top"]] == [None, None], r' "$out" ||
	fail 'NaN logits: not "prob": null'
# csv: an empty field there (was -nan)
kiln 0 predict "$ini" --checkpoint "$tmp/nan.safetensors.big" "$tmp/bad/ok.png" --top-k 2 --format csv "data.path=$data"
row=$(sed -n 2p "$out")
case "$row" in
*nan*) fail "NaN logits in csv: $row" ;;
"$tmp/bad/ok.png",*,*,,*,*,) ;;
*) fail "NaN logits in csv: not empty prob fields: $row" ;;
esac
kiln 0 predict "$ini" --checkpoint "$ck" "$tmp/names" --top-k 1 "data.path=$data"
"$py" - "$out" "$tmp/names" <<'EOF' || fail "file names in jsonl"
import json, sys
names = [json.loads(l)["file"] for l in open(sys.argv[1], encoding="utf-8", errors="strict")]
want = [sys.argv[2] + "/" + n for n in ("bad\ufffd.png", "caf\u00e9.png", "cut\ufffd\ufffd.png", "over\ufffd\ufffd.png", 'q"\\.png')]
assert names == want, names
EOF
echo 'ok: jsonl writes null for a NaN probability (csv an empty field), \ufffd for non-UTF-8 bytes'

# ---- 3b. folding (the default) and --no-fold; --quantized = eval's ------
kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --logits "$tmp/fold.npy" "data.path=$data"
stderr_has "folded: 1 layers removed"
kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --logits "$tmp/nofold.npy" --no-fold "data.path=$data"
"$py" - "$tmp/fold.npy" "$tmp/nofold.npy" <<'EOF' || fail "folded predictions differ from unfolded ones"
import struct, sys
def npy(p):
    raw = open(p, "rb").read(); hl = struct.unpack("<H", raw[8:10])[0]
    return struct.unpack("<240f", raw[10 + hl:])
a, b = npy(sys.argv[1]), npy(sys.argv[2])
assert a != b, "folding changed nothing: is it on?"
big = max(abs(v) for v in b)
d = max(abs(x - y) for x, y in zip(a, b))
print("folded vs unfolded: max |diff| %.3g, max |logit| %.3g" % (d, big))
assert d <= 2e-5 * max(1, big), d
am = lambda v, i: max(range(5), key=lambda k: v[5 * i + k])
assert all(am(a, i) == am(b, i) for i in range(48)), "argmax"
EOF
kiln 0 quantize "$ini" --checkpoint "$ck" --calibrate 2 --method minmax --out "$tmp/q.safetensors" "data.path=$data"
kiln 0 eval "$ini" --quantized "$tmp/q.safetensors" "data.path=$data"
cp "$out" "$tmp/eval_q.json"
kiln 0 predict "$ini" --quantized "$tmp/q.safetensors" --eval-set --top-k 5 "data.path=$data"
cp "$out" "$tmp/pred_q.jsonl"
# an INT8 model is the folded one: --no-fold with it is refused (before
# session 31 it was ignored silently)
kiln 2 predict "$ini" --quantized "$tmp/q.safetensors" --eval-set --top-k 5 --no-fold "data.path=$data"
stderr_has "kiln: error: --no-fold with --quantized $tmp/q.safetensors: an INT8 model is the folded model (kiln quantize folds it before quantizing) and has no unfolded form; drop --no-fold"
[ ! -s "$out" ] || fail "predict --quantized --no-fold printed predictions"
# a checkpoint given as the INT8 model is named as one (before session 31:
# "header length ... exceeds ...", exit 3)
for cmd in eval predict; do
	kiln 2 $cmd "$ini" --quantized "$ck" "data.path=$data" $([ $cmd = eval ] || echo --eval-set)
	stderr_has "kiln: error: $ck: this is a kiln checkpoint, not an INT8 model of \`kiln quantize\`: pass it with --checkpoint"
done
"$py" - "$tmp/eval_q.json" "$tmp/pred_q.jsonl" <<'EOF' || fail "predict --quantized disagrees with eval --quantized"
import json, math, sys
ev = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
loss = sum(-math.log({t["index"]: t["prob"] for t in r["top"]}[r["label"]]) for r in rows) / 48
acc = sum(r["top"][0]["index"] == r["label"] for r in rows) / 48
print("eval --quantized: loss %.6f acc %.6f; predict --quantized: loss %.6f acc %.6f" % (ev["test_loss"], ev["test_acc"], loss, acc))
assert abs(loss - ev["test_loss"]) <= 1e-4 * max(1, ev["test_loss"]) and round(acc * 48) == round(ev["test_acc"] * 48)
EOF
kiln 2 predict "$ini" --quantized "$tmp/q.safetensors" --checkpoint "$ck" --eval-set "data.path=$data"
stderr_has "a quantized model carries its weights"
echo "ok: folded = unfolded to 2e-5; predict --quantized = eval --quantized"

# ---- 3b2. a layer that refuses the device's layout ------------------------
# conv, batchnorm, then a layernorm of the 4-d tensor (nn.LayerNorm(W): the
# width in nchw; channels-last would normalise the channels instead), trained
# with [model] layout = nchw.  The folded model keeps nchw, saying why (before
# session 31 it was `auto`, nhwc on the CPU, and predict, eval --fold and
# quantize failed: "layer 'ln' (layernorm) needs ... nhwc" for a user who
# asked for nchw); its logits are --no-fold's within 2e-5
awk '/^\[/ { lay = /^\[layer\./ } !lay' "$ini" >"$tmp/ln4.ini"
cat >>"$tmp/ln4.ini" <<'EOF'
[layer.c1]
type = conv
out = 4
kernel = 3
padding = 1
[layer.b1]
type = batchnorm
[layer.ln]
type = layernorm
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 5
[layer.loss]
type = softmax_xent
EOF
ln4="data.path=$data model.layout=nchw run.out_dir=$tmp/ln4run"
kiln 0 train "$tmp/ln4.ini" $ln4
kiln 0 predict "$tmp/ln4.ini" --eval-set --logits "$tmp/ln4_fold.npy" $ln4
stderr_has "the folded model keeps [model] layout = nchw (the trained model's): nhwc (the device's) refused: layer 'ln' (layernorm) normalises the last dimension"
stderr_has "folded: 1 layers removed"
kiln 0 predict "$tmp/ln4.ini" --eval-set --logits "$tmp/ln4_nofold.npy" --no-fold $ln4
kiln 0 eval "$tmp/ln4.ini" $ln4
cp "$out" "$tmp/ln4_eval.json"
kiln 0 eval "$tmp/ln4.ini" --fold $ln4
cp "$out" "$tmp/ln4_evalf.json"
"$py" - "$tmp/ln4_fold.npy" "$tmp/ln4_nofold.npy" "$tmp/ln4_eval.json" "$tmp/ln4_evalf.json" <<'EOF' || fail "the nchw layernorm model folded"
import json, struct, sys
def npy(p):
    raw = open(p, "rb").read(); hl = struct.unpack("<H", raw[8:10])[0]
    return struct.unpack("<240f", raw[10 + hl:])
a, b = npy(sys.argv[1]), npy(sys.argv[2])
assert a != b, "folding changed nothing: is the batchnorm folded?"
big = max(abs(v) for v in b)
d = max(abs(x - y) for x, y in zip(a, b))
e, f = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
print("layernorm nchw: folded vs unfolded max |diff| %.3g (max |logit| %.3g); eval loss %.6f, --fold %.6f" % (d, big, e["test_loss"], f["test_loss"]))
assert d <= 2e-5 * max(1, big), d
assert abs(e["test_loss"] - f["test_loss"]) <= 1e-5 * max(1, e["test_loss"])
EOF
# INT8: nhwc is asked for (oneDNN's direct int8 kernels), refused, nchw kept
kiln 0 quantize "$tmp/ln4.ini" --calibrate 2 --out "$tmp/ln4_q.safetensors" $ln4
kiln 0 eval "$tmp/ln4.ini" --quantized "$tmp/ln4_q.safetensors" $ln4
stderr_has "keeps [model] layout = nchw (the trained model's): nhwc (where oneDNN's INT8 convolutions have direct kernels) refused"
kiln 0 predict "$tmp/ln4.ini" --quantized "$tmp/ln4_q.safetensors" --eval-set $ln4
# the unfolded model in `auto` (nhwc on the CPU) says where nhwc came from
kiln 2 eval "$tmp/ln4.ini" "data.path=$data" "run.out_dir=$tmp/ln4run"
stderr_has "layer 'ln' (layernorm) normalises the last dimension, the width of an nchw tensor, but got f32[1, 4, 8, 8] nhwc: channels-last ([model] layout = nhwc, which \`auto\` is on the CPU), whose last dimension is the channels; set [model] layout = nchw"
echo "ok: a layernorm model trained nchw folds, evaluates and quantizes in nchw"
# a model whose only conv has 1 input channel (it stays f32: fewer than 4 per
# group) and no linear: quantize says so (before session 34: "the model has
# no conv or linear layer to quantize")
awk '/^\[/ { lay = /^\[layer\./ } !lay' "$ini" >"$tmp/c1.ini"
printf '[layer.c]\ntype = conv\nout = 5\nkernel = 3\n[layer.gp]\ntype = global_avgpool\n[layer.f]\ntype = flatten\n[layer.loss]\ntype = softmax_xent\n' >>"$tmp/c1.ini"
kiln 0 train "$tmp/c1.ini" "data.path=$data" "run.out_dir=$tmp/c1run"
kiln 1 quantize "$tmp/c1.ini" --calibrate 1 --out "$tmp/c1_q.safetensors" "data.path=$data" "run.out_dir=$tmp/c1run"
stderr_has "nothing to quantize: the model has no linear layer, and its convs stay f32 with fewer than 4 input channels per group (conv 'c' has 1; oneDNN's int8 kernels take them in fours)"
echo "ok: quantize says why a model of one 1-channel conv has nothing to quantize"

# ---- 3c. [run] precision = bf16 in eval and predict (as training has it) --
if "$kiln" plugins 2>/dev/null | grep -qw amp; then
	kiln 0 eval "$ini" --checkpoint "$ck" "data.path=$data" run.precision=bf16
	cp "$out" "$tmp/eval_bf16.json"
	stderr_has "precision = bf16"
	kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --top-k 5 --no-fold "data.path=$data" run.precision=bf16
	cp "$out" "$tmp/pred_bf16.jsonl"
	kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --logits "$tmp/bf16.npy" "data.path=$data" run.precision=bf16
	"$py" - "$tmp/eval_idx.json" "$tmp/eval_bf16.json" "$tmp/pred_bf16.jsonl" "$tmp/bf16.npy" "$tmp/fold.npy" <<'EOF' || fail "bf16 evaluation"
import json, math, struct, sys
f32, b16 = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rows = [json.loads(l) for l in open(sys.argv[3])]
def npy(p):
    raw = open(p, "rb").read(); hl = struct.unpack("<H", raw[8:10])[0]
    return struct.unpack("<240f", raw[10 + hl:])
a, b = npy(sys.argv[4]), npy(sys.argv[5])
big = max(abs(v) for v in b)
d = max(abs(x - y) for x, y in zip(a, b))
dl = abs(b16["test_loss"] - f32["test_loss"])
print("bf16 vs fp32: logits max |diff| %.3g (max |logit| %.3g); eval loss %.6f vs %.6f" % (d, big, b16["test_loss"], f32["test_loss"]))
# bf16 compute: an 8-bit mantissa (2^-8 relative per rounding), so the
# logits move, by more than f32 rounding and less than a few bf16 steps
assert 1e-4 * big < d < 0.05 * max(1, big), d
assert 0 < dl < 0.02 * max(1, f32["test_loss"]), dl
loss = sum(-math.log({t["index"]: t["prob"] for t in r["top"]}[r["label"]]) for r in rows) / 48
print("bf16 predict --eval-set: loss %.6f" % loss)
assert abs(loss - b16["test_loss"]) <= 1e-4 * max(1, b16["test_loss"]), "predict bf16 vs eval bf16"
EOF
	echo "ok: bf16 eval and predict differ from fp32 by a bf16-sized amount, and agree"
else
	echo "skip 3c: no amp plugin"
fi

# ---- 3d. [data.eval] dtype = bf16: predict sees eval's samples -----------
# the loader rounds the transforms' f32 to bf16 (nearest even) and the device
# widens them; predict rounds its f32 samples alike, for --eval-set and for
# image files (before session 31 it skipped the rounding: --eval-set's loss
# was the f32 one, 1.587318 where eval said 1.587265).  --no-fold: eval's graph
kiln 0 eval "$ini" --checkpoint "$ck" "data.path=$data" data.eval.dtype=bf16
cp "$out" "$tmp/eval_dt.json"
kiln 0 predict "$ini" --checkpoint "$ck" --eval-set --logits "$tmp/dt.npy" --no-fold "data.path=$data" data.eval.dtype=bf16
kiln 0 eval "$tmp/f.ini" --checkpoint "$ck" "data.path=$data" data.eval.dtype=bf16
cp "$out" "$tmp/eval_dtf.json"
kiln 0 predict "$tmp/f.ini" --checkpoint "$ck" "$pngs" --logits "$tmp/dtf.npy" --no-fold "data.path=$data" data.eval.dtype=bf16
"$py" - "$tmp/eval_dt.json" "$tmp/dt.npy" "$tmp/nofold.npy" "$data/tr_cnn_labels.idx" \
	"$tmp/eval_dtf.json" "$tmp/dtf.npy" "$tmp/pred.jsonl" <<'EOF' || fail "dtype = bf16: predict's samples are not eval's"
import json, math, os, struct, sys
def npy(p):
    raw = open(p, "rb").read(); hl = struct.unpack("<H", raw[8:10])[0]
    return struct.unpack("<240f", raw[10 + hl:])
def loss(lg, labels):
    s = 0.0
    for i, y in enumerate(labels):
        l = lg[5 * i:5 * i + 5]; m = max(l)
        s += m + math.log(sum(math.exp(v - m) for v in l)) - l[y]
    return s / len(labels)
# --eval-set: the idx labels; the images: their folders' names, in predict's order
labels = list(open(sys.argv[4], "rb").read()[8:])
rows = [json.loads(l) for l in open(sys.argv[7])]
names = sorted(os.listdir(os.path.dirname(os.path.dirname(rows[0]["file"]))))
flabels = [names.index(os.path.basename(os.path.dirname(r["file"]))) for r in rows]
for what, ev, lg, lab in (("--eval-set", sys.argv[1], sys.argv[2], labels), ("images", sys.argv[5], sys.argv[6], flabels)):
    e, got = json.load(open(ev))["test_loss"], loss(npy(lg), lab)
    print("dtype = bf16, %s: eval loss %.6f, predict's logits' loss %.6f" % (what, e, got))
    assert abs(got - e) <= 2e-6, what
assert npy(sys.argv[2]) != npy(sys.argv[3]), "bf16 samples gave the f32 logits"
EOF
echo "ok: [data.eval] dtype = bf16: predict's loss is eval's"

# ---- 4. the C API from threads ---------------------------------------------
# (with no OpenMP variables set: the library sets kiln's rule itself)
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$top_builddir/tests/infer_threads" "$tmp/t.ini" "$ck" ||
	fail "tests/infer_threads failed"
echo "PASS ($checks kiln runs)"
exit 0
