#!/bin/sh
# tests/hostile_io.sh - output files and standard streams in a hostile
# environment (session 30's report), on tests/data/tr_cnn.ini's tiny model:
#  1. the safetensors writer (export --safetensors, quantize --out, predict
#     --logits X.safetensors) writes through a symlink (its target replaced,
#     the link kept) and straight to a FIFO or device, as --onnx does; the old
#     code replaced the link or the device node with a regular file;
name=hostile_io
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"

need_source idx
d="data.path=$data"

# ---- 1: the safetensors writer and what its path names ----
# a symlink to a regular file: the target replaced, the link kept
echo old >"$tmp/real.safetensors"
ln -s real.safetensors "$tmp/link.safetensors"
kiln 0 export "$ini" "$d" run.out_dir= --safetensors "$tmp/link.safetensors"
[ -L "$tmp/link.safetensors" ] || fail "export replaced the symlink with a file"
[ "$(wc -c <"$tmp/real.safetensors")" -gt 100 ] || fail "export did not write the link's target"
[ "$(ls "$tmp" | grep -c tmp)" -eq 0 ] || fail "a temporary file was left: $(ls "$tmp")"
# a symlink to a device (/dev/null): written through, the link kept
ln -s /dev/null "$tmp/null.safetensors"
kiln 0 export "$ini" "$d" run.out_dir= --safetensors "$tmp/null.safetensors"
[ -L "$tmp/null.safetensors" ] || fail "export replaced the link to /dev/null with a file"
# a FIFO: the bytes go to its reader, the FIFO stays
mkfifo "$tmp/fifo"
cat "$tmp/fifo" >"$tmp/from_fifo" &
reader=$!
kiln 0 export "$ini" "$d" run.out_dir= --safetensors "$tmp/fifo"
[ -p "$tmp/fifo" ] || { kill $reader; fail "export replaced the FIFO with a regular file"; }
wait $reader
cmp -s "$tmp/from_fifo" "$tmp/real.safetensors" || fail "the FIFO's reader did not get the file"
# a dangling symlink: its target created, the link kept
ln -s made.safetensors "$tmp/dangling.safetensors"
kiln 0 export "$ini" "$d" run.out_dir= --safetensors "$tmp/dangling.safetensors"
[ -L "$tmp/dangling.safetensors" ] && [ -f "$tmp/made.safetensors" ] ||
	fail "a dangling link: the link replaced or its target not made"
# a directory: refused naming it
mkdir "$tmp/adir"
kiln 1 export "$ini" "$d" run.out_dir= --safetensors "$tmp/adir"
stderr_has "$tmp/adir: cannot write: Is a directory"

echo "$checks checks passed"
