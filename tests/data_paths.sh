#!/bin/sh
# tests/data_paths.sh - a data file that cannot be opened is told with the
# config key that led to it and where that key was set (file:line), for
# every source that reads files: a tokens or tar `path` that is set but
# missing (before session 33 a shards pattern was then matched in the
# working directory and only the pattern named: "fineweb_train_*.bin: no
# file matches this shards pattern"), a token or records shard, an IDX
# file under its standard name; and `kiln summary` opens the training data
# alone (its input's shape), so missing evaluation shards do not stop it,
# while `kiln memory`, which counts the evaluation loader, names them.
name=data_paths
. "$(dirname "$0")/lib.sh"
need_source tokens
need_source records
need_source idx
data="$srcdir/tests/data"

# tok INI PATH [SHARDS]: tests/data/gpt_tiny.ini with [data] path = PATH
# (and shards = SHARDS, on the line after it) written to INI
tok() {
	sed "s|^path = gpt_tokens.bin\$|path = $2${3:+\\
shards = $3}|" "$data/gpt_tiny.ini" > "$1"
}
line() { grep -n "^$2 = " "$1" | head -1 | cut -d: -f1; }

# a missing path, the shards a pattern
tok "$tmp/t1.ini" "$tmp/nodir" "train_*.bin"
kiln 3 summary "$tmp/t1.ini"
stderr_has "kiln: error: $tmp/nodir: cannot open the tokens data ([data] path, set at $tmp/t1.ini:$(line "$tmp/t1.ini" path)): No such file or directory"

# a directory with a train shard; a listed shard that is missing
mkdir -p "$tmp/tok"
cp "$data/gpt_tokens.bin" "$tmp/tok/train_000.bin"
tok "$tmp/t2.ini" "$tmp/tok" "train_000.bin, nope.bin"
kiln 3 summary "$tmp/t2.ini"
stderr_has "kiln: error: $tmp/tok/nope.bin: cannot open the token shard ([data] shards, set at $tmp/t2.ini:$(line "$tmp/t2.ini" shards)): No such file or directory"

# a missing path beside shards that are all absolute: path names nothing
# read (exit 3 "cannot open the tokens data" in session 33's first form)
tok "$tmp/t4.ini" "$tmp/nodir" "$tmp/tok/train_000.bin"
kiln 0 summary "$tmp/t4.ini"
stdout_has '"params": '

# the evaluation shards missing: summary needs only the training data;
# memory opens both, as training does
tok "$tmp/t3.ini" "$tmp/tok" "train_*.bin"
kiln 0 summary "$tmp/t3.ini" train.eval=1 "data.eval.shards=val_*.bin"
stdout_has '"params": '
kiln 3 memory "$tmp/t3.ini" train.eval=1 "data.eval.shards=val_*.bin"
stderr_has "$tmp/tok/val_*.bin: no file matches this shards pattern"

# records: a listed shard that is missing
cat > "$tmp/r.ini" <<EOF
[data]
source = records
path = $tmp
shards = missing.krec

[layer.fc]
type = linear
out = 2

[layer.loss]
type = softmax_xent
EOF
kiln 3 summary "$tmp/r.ini"
stderr_has "kiln: error: $tmp/missing.krec: cannot open the shard ([data] shards, set at $tmp/r.ini:4): No such file or directory"

# IDX under the standard names in a directory that does not exist
cat > "$tmp/i.ini" <<EOF
[data]
source = idx
path = $tmp/noidx

[layer.fc]
type = linear
out = 2

[layer.loss]
type = softmax_xent
EOF
kiln 3 summary "$tmp/i.ini"
stderr_has "kiln: error: $tmp/noidx/train-images-idx3-ubyte.gz: cannot open the image file: No such file or directory (also tried $tmp/noidx/train-images-idx3-ubyte; [data] path = $tmp/noidx, set at $tmp/i.ini:3; set path, or images)"

# tar: a missing path, the shards relative to it
if "$kiln" plugins 2>/dev/null | grep -q "^source  *tar .*available"; then
	sed -e 's/^source = records$/source = tar/' -e "s|^path = .*|path = $tmp/notar|" \
		-e 's/^shards = .*/shards = a.tar/' "$tmp/r.ini" > "$tmp/tar.ini"
	kiln 3 summary "$tmp/tar.ini"
	stderr_has "kiln: error: $tmp/notar: cannot open the tar data ([data] path, set at $tmp/tar.ini:3): No such file or directory"
fi
echo "PASS: $checks kiln runs"
