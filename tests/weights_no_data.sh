#!/bin/sh
# tests/weights_no_data.sh - the model's input shape without the training
# set ([data]) read whole, where the weights record none: with a
# safetensors weights file (predict, export, eval --fold, quantize) it is
# what [data]'s source tells from a header (its peek), so an IDX training
# set cut past its 16-byte header, which `kiln eval` of it refuses, gives
# the same outputs byte for byte as the whole one; an INT8 file of `kiln
# quantize` records its input sample (metadata kiln.sample), so predict and
# eval --quantized run with [data] gone, with the same outputs.  An INT8
# file without it (an older kiln's) still takes [data]'s, and a safetensors
# file with [data] gone is refused naming [data]'s file (it records no
# shape).  Before session 39 each opened [data] whole: the cut set was
# exit 3, the INT8 file without [data] exit 2.
name=weights_no_data
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
w="$data/tr_cnn_trained.safetensors"
ini="$data/tr_cnn.ini"

# the CNN: [data] in $tmp/tr, [data.eval] in $tmp/ev; an image to predict
mkdir "$tmp/tr" "$tmp/ev"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/tr/"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/ev/"
c="data.path=$tmp/tr data.eval.path=$tmp/ev run.out_dir=$tmp/run"
kiln 0 pack "$ini" $c --format folder --store png --out "$tmp/png" --section data.eval
png=$(find "$tmp/png" -name '*.png' | sort | head -1)
[ -n "$png" ] || fail "kiln pack wrote no PNG"
q="$tmp/q.int8"
kiln 0 quantize "$ini" $c --checkpoint "$w" --calibrate 2 --out "$q"

# each command: LABEL OUTPUT ARGS (OUTPUT: the file whose bytes are
# compared, "stdout" for standard output; eval's: its loss and accuracy)
cases_w() {
	echo "predict-w stdout predict $ini $c --checkpoint $w $png"
	echo "export-w $tmp/e.safetensors export $ini $c --checkpoint $w --safetensors $tmp/e.safetensors"
	echo "evalfold-w stdout eval $ini $c --checkpoint $w --fold"
	echo "quantize-w $tmp/q2.int8 quantize $ini $c --checkpoint $w --calibrate 2 --out $tmp/q2.int8"
}
cases_q() {
	echo "predict-q stdout predict $ini $c --quantized $q $png"
	echo "eval-q stdout eval $ini $c --quantized $q"
}
# run WHEN LABEL OUTPUT ARGS...: kiln ARGS, exit 0, its output kept in
# $tmp/WHEN.LABEL
run() {
	when=$1 label=$2 file=$3
	shift 3
	[ "$file" = stdout ] || rm -f "$file"
	kiln 0 "$@"
	if [ "$file" = stdout ]; then
		sed 's/, "eval_samples_per_s": [0-9.e+-]*//' "$out" >"$tmp/$when.$label"
	else
		cp "$file" "$tmp/$when.$label"
	fi
	[ -s "$tmp/$when.$label" ] || fail "no output"
}
# each WHEN CASES: every case of CASES run with [data] as it is now, its
# output the same as with [data] whole
each() {
	$2 | while read -r label file rest; do
		# shellcheck disable=SC2086 # (the arguments, split)
		run "$1" "$label" "$file" $rest
		[ "$1" = whole ] || cmp -s "$tmp/whole.$label" "$tmp/$1.$label" ||
			fail "$label: the output differs with [data] $1"
		[ "$1" = whole ] || echo "ok: $label with [data] $1: exit 0, the same output"
	done || exit 1
}
each whole cases_w
each whole cases_q
grep -q '"kiln.sample": *"f32 1,8,8"' "$q" || fail "$q records no kiln.sample \"f32 1,8,8\""
echo "ok: the INT8 file records its input sample, f32 1,8,8"

# [data] cut past its header: its images file keeps the header and 3 of
# its 48 images (kiln eval of it fails: the set is bad)
head -c $((16 + 3 * 64)) "$data/tr_cnn_images.idx" >"$tmp/tr/tr_cnn_images.idx"
kiln 3 eval "$ini" $c --checkpoint "$w" data.eval.path="$tmp/tr"
stderr_has "tr_cnn_images.idx"
each cut cases_w
each cut cases_q

# [data] gone: the INT8 file's sample serves; a safetensors file has none
mv "$tmp/tr" "$tmp/tr.away"
each gone cases_q
kiln 2 predict "$ini" $c --checkpoint "$w" "$png"
stderr_has "[data] images: $tmp/tr/tr_cnn_images.idx: no such file"

# an INT8 file of an older kiln (no kiln.sample): [data]'s, as before;
# one whose kiln.sample is not a sample: refused, naming it
strip() {
	/usr/bin/python3 - "$q" "$1" "$2" <<'EOF'
import st, sys
def edit(h, meta, data):
    del meta["kiln.crc32c"] # (an older kiln's: tests/int8_crc.sh)
    if sys.argv[3] == "-":
        del meta["kiln.sample"]
    else:
        meta["kiln.sample"] = sys.argv[3]
st.rewrite(sys.argv[1], sys.argv[2], edit)
EOF
}
strip "$tmp/old.int8" - || fail "cannot write an INT8 file without kiln.sample"
kiln 2 predict "$ini" $c --quantized "$tmp/old.int8" "$png"
stderr_has "$tmp/old.int8 records no input sample (an INT8 file of a kiln before session 39: quantize again to run it without [data]), so [data]'s is read: $ini:"
stderr_has "[data] images: $tmp/tr/tr_cnn_images.idx: no such file"
mv "$tmp/tr.away" "$tmp/tr"
cp "$data/tr_cnn_images.idx" "$tmp/tr/"
kiln 0 predict "$ini" $c --quantized "$tmp/old.int8" "$png"
cmp -s "$out" "$tmp/whole.predict-q" || fail "an INT8 file without kiln.sample: another output"
echo "ok: an INT8 file without kiln.sample takes [data]'s sample, the same output"
for bad in "f32 1,8,x" "f33 1,8,8" "f32 1,0,8" "f32 1,8,8 "; do
	strip "$tmp/bad.int8" "$bad" || fail "cannot write an INT8 file with kiln.sample '$bad'"
	kiln 3 predict "$ini" $c --quantized "$tmp/bad.int8" "$png"
	stderr_has "$tmp/bad.int8: metadata kiln.sample is '$bad', want DTYPE D0,D1,..."
done
echo "PASS"
