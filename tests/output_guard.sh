#!/bin/sh
# tests/output_guard.sh - no command writes over a file it reads, and a
# failed export keeps the previous one (session 31; before it, `kiln export
# --checkpoint C --safetensors C` and `kiln predict --checkpoint W --logits
# W` replaced their input and exited 0, and a failed ONNX write removed the
# file it was replacing).  tests/data/tr_cnn.ini trained 5 steps (checkpoint
# C), its weights exported (W), its INT8 model (Q), then:
#  1. export --safetensors / --onnx onto C, W, Q, CONFIG, a link to C,
#     [model] init_from, or the newest checkpoint picked without
#     --checkpoint; predict --logits onto W, CONFIG, or a hard link to C;
#     quantize --out onto CONFIG; quantize --out, export --onnx and
#     predict --eval-set --logits onto a file of the data they read (idx
#     images, labels, a hard link to the images, a records shard): each
#     exits 2 naming the file and the input is byte-identical afterwards;
#  2. an ONNX (and a safetensors) export, or predict --logits (.npy and
#     .safetensors), that cannot be written (a file size limit, EFBIG) exits
#     1 and leaves the earlier file byte-identical, with no temporary file
#     beside it.
#  3. kiln report -o onto a file of the run (its checkpoint, metrics.jsonl,
#     config.ini, profile.txt, trace.json, a file of the data its config
#     reads) exits 2 naming it and leaves it
#     byte-identical (before session 36 the checkpoint was replaced with
#     HTML, exit 0); a FIFO or /dev/zero as config.ini or profile.txt is
#     "Not available: ... not a regular file" in a report written at once
#     (before session 36 the FIFO hung it for ever and /dev/zero was read
#     until memory ran out).
name=output_guard
. "$(dirname "$0")/lib.sh"
need_source idx
data="$srcdir/tests/data"
cp "$data/tr_cnn.ini" "$tmp/net.ini"
ini="$tmp/net.ini"
common="data.path=$data model.init_from=$data/tr_cnn_init.safetensors run.out_dir=$tmp/run"

kiln 0 train "$ini" $common
ck="$tmp/run/checkpoints/ckpt-5.kiln"
[ -f "$ck" ] || fail "no $ck"
kiln 0 export "$ini" $common --safetensors "$tmp/w.safetensors"
kiln 0 quantize "$ini" $common --calibrate 1 --out "$tmp/q.safetensors"
for f in "$ck" "$tmp/w.safetensors" "$tmp/q.safetensors" "$ini"; do
	cp "$f" "$f.orig"
done
# same FILE: FILE is byte-identical to its copy taken before
same() { cmp -s "$1" "$1.orig" || fail "$1 was changed"; }

# ---- 1. an output that is an input --------------------------------------------
kiln 2 export "$ini" $common --checkpoint "$ck" --safetensors "$ck"
stderr_has "the output $ck is the file $ck, which this command reads: choose another file"
same "$ck"
kiln 2 export "$ini" $common --checkpoint "$ck" --onnx "$ck"
stderr_has "the output $ck is the file $ck, which this command reads"
same "$ck"
kiln 2 export "$ini" $common --checkpoint "$tmp/w.safetensors" --safetensors "$tmp/w.safetensors"
stderr_has "the output $tmp/w.safetensors is the file $tmp/w.safetensors, which this command reads"
same "$tmp/w.safetensors"
kiln 2 export "$ini" $common --quantized "$tmp/q.safetensors" --onnx "$tmp/q.safetensors"
stderr_has "the output $tmp/q.safetensors is the file $tmp/q.safetensors, which this command reads"
same "$tmp/q.safetensors"
kiln 2 export "$ini" $common --safetensors "$ini"
stderr_has "the output $ini is the file $ini, which this command reads"
same "$ini"
# a symbolic link to the checkpoint is the checkpoint
ln -s "$ck" "$tmp/link.safetensors"
kiln 2 export "$ini" $common --checkpoint "$ck" --safetensors "$tmp/link.safetensors"
stderr_has "the output $tmp/link.safetensors is the file $ck, which this command reads"
same "$ck"
# no --checkpoint: the newest one in out_dir is read, and any checkpoint refused
kiln 2 export "$ini" $common --onnx "$ck"
stderr_has "the output $ck is a kiln checkpoint, which would be overwritten: choose another file"
same "$ck"
# no checkpoint at all: the initial weights, read from [model] init_from
kiln 2 export "$ini" "data.path=$data" "model.init_from=$tmp/w.safetensors" \
	"run.out_dir=$tmp/empty" --safetensors "$tmp/w.safetensors"
stderr_has "the output $tmp/w.safetensors is the file $tmp/w.safetensors, which this command reads"
same "$tmp/w.safetensors"
# predict --logits
kiln 2 predict "$ini" $common --eval-set --checkpoint "$tmp/w.safetensors" --logits "$tmp/w.safetensors"
stderr_has "the output $tmp/w.safetensors is the file $tmp/w.safetensors, which this command reads"
same "$tmp/w.safetensors"
ln "$ck" "$tmp/hard.safetensors"
kiln 2 predict "$ini" $common --eval-set --checkpoint "$ck" --logits "$tmp/hard.safetensors"
stderr_has "the output $tmp/hard.safetensors is the file $ck, which this command reads"
same "$ck"
kiln 2 predict "$ini" $common --eval-set --logits "$tmp/hard.safetensors"
stderr_has "the output $tmp/hard.safetensors is a kiln checkpoint, which would be overwritten"
same "$ck"
kiln 2 predict "$ini" $common --eval-set --quantized "$tmp/q.safetensors" --logits "$tmp/q.safetensors"
stderr_has "the output $tmp/q.safetensors is the file $tmp/q.safetensors, which this command reads"
same "$tmp/q.safetensors"
# quantize --out (the checkpoints were refused since session 29: tests/int8.sh)
kiln 2 quantize "$ini" $common --calibrate 1 --out "$ini"
stderr_has "the output $ini is the file $ini, which this command reads"
same "$ini"
# a file of the data the command reads (its source's `files`, source ops
# version 4): quantize --out onto the calibration images, export --onnx onto
# [data]'s labels, predict --eval-set --logits onto [data.eval]'s records
# shard (before session 34 each replaced the file and exited 0)
mkdir "$tmp/d"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/d/"
for f in "$tmp/d/tr_cnn_images.idx" "$tmp/d/tr_cnn_labels.idx"; do cp "$f" "$f.orig"; done
dcommon="data.path=$tmp/d model.init_from=$data/tr_cnn_init.safetensors run.out_dir=$tmp/run"
kiln 2 quantize "$ini" $dcommon --checkpoint "$ck" --calibrate 1 --out "$tmp/d/tr_cnn_images.idx"
stderr_has "the output $tmp/d/tr_cnn_images.idx is the file $tmp/d/tr_cnn_images.idx, which [data] reads: choose another file"
same "$tmp/d/tr_cnn_images.idx"
kiln 2 export "$ini" $dcommon --checkpoint "$ck" --onnx "$tmp/d/tr_cnn_labels.idx"
stderr_has "the output $tmp/d/tr_cnn_labels.idx is the file $tmp/d/tr_cnn_labels.idx, which [data] reads: choose another file"
same "$tmp/d/tr_cnn_labels.idx"
# a hard link to a data file, in another directory under another name
ln "$tmp/d/tr_cnn_images.idx" "$tmp/hardimg.idx"
kiln 2 quantize "$ini" $dcommon --checkpoint "$ck" --calibrate 1 --out "$tmp/hardimg.idx"
stderr_has "the output $tmp/hardimg.idx is the file $tmp/d/tr_cnn_images.idx, which [data] reads: choose another file"
same "$tmp/d/tr_cnn_images.idx"
kiln 0 pack "$ini" "data.path=$data" --section data.eval --out "$tmp/rec"
# (named .npy, as --logits wants: the records source reads any name)
shard="$tmp/rec/eval.npy"
mv "$tmp/rec/test-00000.krec" "$shard"
cp "$shard" "$shard.orig"
# the config with [data.eval] that shard
{ sed '/^\[data.eval\]/,/^$/d' "$ini"; printf '[data.eval]\nsource = records\npath = %s\n' "$shard"; } >"$tmp/rec.ini"
kiln 2 predict "$tmp/rec.ini" $common --eval-set --checkpoint "$ck" --logits "$shard"
stderr_has "the output $shard is the file $shard, which [data.eval] reads: choose another file"
same "$shard"
echo "ok: an output that is a file of the data read: exit 2, the data unchanged"
# and an output that is nobody's input is written
kiln 0 predict "$ini" $common --eval-set --checkpoint "$ck" --logits "$tmp/l.safetensors"
[ -s "$tmp/l.safetensors" ] || fail "predict --logits wrote nothing"
echo "ok: an output that is an input or a checkpoint: exit 2, the input unchanged"

# ---- 2. a failed write keeps the earlier export --------------------------------
# limited: run kiln with files limited to $limit blocks (4 unless set) and
# SIGXFSZ ignored, so a write past it fails with EFBIG (the exports here are
# 16 KiB, the logits 1 KiB and a header; dash counts 512-byte blocks)
limited() {
	want=$1
	shift
	# stderr through a pipe: a file would be cut at the limit too
	{ (trap '' XFSZ && ulimit -f "${limit:-4}" && exec "$kiln" "$@") 2>&1 >"$out"
	  echo $? >"$tmp/rc"; } | cat >"$err"
	rc=$(cat "$tmp/rc")
	[ "$rc" -eq "$want" ] || { cat "$err"; fail "exit $rc, expected $want: kiln $*"; }
	echo "ok: (ulimit -f ${limit:-4}) kiln $* (exit $rc)"
}
for kind in onnx safetensors; do
	if [ $kind = onnx ] && ! "$kiln" export "$ini" $common --checkpoint "$ck" --onnx "$tmp/good.onnx" 2>"$err" &&
		grep -q "built without ONNX export" "$err"; then
		echo "skip: this kiln was built without ONNX export"
		continue
	fi
	kiln 0 export "$ini" $common --checkpoint "$ck" --$kind "$tmp/good.$kind"
	cp "$tmp/good.$kind" "$tmp/good.$kind.orig"
	limited 1 export "$ini" $common --checkpoint "$ck" --$kind "$tmp/good.$kind"
	stderr_has "$tmp/good.$kind: cannot write: File too large"
	same "$tmp/good.$kind"
	! ls "$tmp" | grep -q "^good\.$kind\.kiln-tmp" || fail "a temporary file was left: $(ls "$tmp")"
	# a replaced export keeps its permission bits: a private file stays
	# private (the temporary renamed over it was 0644 before the review of
	# session 31)
	chmod 600 "$tmp/good.$kind"
	kiln 0 export "$ini" $common --checkpoint "$ck" --$kind "$tmp/good.$kind"
	[ "$(stat -c %a "$tmp/good.$kind")" = 600 ] ||
		fail "good.$kind: mode $(stat -c %a "$tmp/good.$kind") after a new export, want 600"
done
echo "ok: an export that cannot be written keeps the earlier file whole; one that can keeps its mode"
# predict --logits the same way (the .npy was opened in place before
# session 32: a write past the limit left the earlier file cut short)
limit=1
for kind in npy safetensors; do
	kiln 0 predict "$ini" $common --eval-set --checkpoint "$ck" --logits "$tmp/l.$kind"
	[ "$(stat -c %s "$tmp/l.$kind")" -gt 1024 ] || fail "l.$kind: $(stat -c %s "$tmp/l.$kind") bytes, the test wants > 1024"
	cp "$tmp/l.$kind" "$tmp/l.$kind.orig"
	limited 1 predict "$ini" $common --eval-set --checkpoint "$ck" --logits "$tmp/l.$kind"
	stderr_has "$tmp/l.$kind: cannot write"
	stderr_has "File too large"
	same "$tmp/l.$kind"
	! ls "$tmp" | grep -q "^l\.$kind\.kiln-tmp" || fail "a temporary file was left: $(ls "$tmp")"
done
echo "ok: predict --logits that cannot be written keeps the earlier file whole"
# kiln report -o the same way (opened in place before session 32: a write
# past the limit removed the earlier report)
kiln 0 report "$tmp/run" -o "$tmp/r.html"
[ "$(stat -c %s "$tmp/r.html")" -gt 1024 ] || fail "r.html: $(stat -c %s "$tmp/r.html") bytes, the test wants > 1024"
cp "$tmp/r.html" "$tmp/r.html.orig"
limited 1 report "$tmp/run" -o "$tmp/r.html"
stderr_has "$tmp/r.html: cannot write the report: File too large"
same "$tmp/r.html"
! ls "$tmp" | grep -q "^r\.html\.kiln-tmp" || fail "a temporary file was left: $(ls "$tmp")"
echo "ok: a report that cannot be written keeps the earlier one whole"

# ---- 3. kiln report -o onto the run's own files; FIFOs in the run --------------
run="$tmp/run"
echo "profile" >"$run/profile.txt"
echo "{}" >"$run/trace.json"
for f in "$ck" "$run/metrics.jsonl" "$run/config.ini" "$run/profile.txt" "$run/trace.json"; do
	cp "$f" "$f.orig"
done
kiln 2 report "$run" -o "$ck"
stderr_has "the output $ck is a kiln checkpoint, which would be overwritten: choose another file"
same "$ck"
for f in metrics.jsonl config.ini profile.txt; do
	kiln 2 report "$run" -o "$run/$f"
	stderr_has "the output $run/$f is the file $run/$f, which this command reads: choose another file"
	same "$run/$f"
done
kiln 2 report "$run" -o "$run/trace.json"
stderr_has "the output $run/trace.json is the file $run/trace.json, which the run in $run wrote: choose another file"
same "$run/trace.json"
! ls "$run" "$run/checkpoints" | grep -q "kiln-tmp" || fail "a temporary file was left: $(ls "$run")"
# a file of the data the run's config.ini reads (the model summary opens
# it): refused as it opens, nothing written
mkdir "$tmp/rund"
cp "$run/metrics.jsonl" "$tmp/rund/"
sed "s|^path = .*|path = $tmp/d|" "$run/config.ini.orig" >"$tmp/rund/config.ini"
kiln 2 report "$tmp/rund" -o "$tmp/d/tr_cnn_labels.idx"
stderr_has "the output $tmp/d/tr_cnn_labels.idx is the file $tmp/d/tr_cnn_labels.idx, which [data] reads: choose another file"
same "$tmp/d/tr_cnn_labels.idx"
! ls "$tmp/d" | grep -q "kiln-tmp" || fail "a temporary file was left: $(ls "$tmp/d")"
echo "ok: report -o onto a file of the run: exit 2, the file unchanged"
# a FIFO (nobody writing it) or /dev/zero as config.ini or profile.txt
for what in config.ini profile.txt; do
	for kind in fifo zero; do
		rm -rf "$tmp/fr"
		mkdir "$tmp/fr"
		cp "$run/metrics.jsonl" "$tmp/fr/"
		[ $what = profile.txt ] && cp "$run/config.ini.orig" "$tmp/fr/config.ini"
		if [ $kind = fifo ]; then
			mkfifo "$tmp/fr/$what"
			desc="a FIFO (named pipe), not a regular file"
		else
			ln -s /dev/zero "$tmp/fr/$what"
			desc="a character device, not a regular file"
		fi
		timeout 60 "$kiln" report "$tmp/fr" >"$out" 2>"$err"
		rc=$?
		[ $rc -eq 0 ] || { cat "$err"; fail "report with a $kind $what: exit $rc (124: it hung)"; }
		grep -qF "Not available: $tmp/fr/$what: $desc" "$tmp/fr/report.html" ||
			fail "report with a $kind $what: no 'Not available' note"
		echo "ok: report with a $kind $what: written, the file not available"
	done
done
echo "PASS"
