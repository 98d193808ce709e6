#!/bin/sh
# tests/data_paths.sh - a data file that cannot be opened is told with the
# config key that led to it and where that key was set (file:line), for
# every source that reads files: a tokens or tar `path` that is set but
# missing (before session 33 a shards pattern was then matched in the
# working directory and only the pattern named: "fineweb_train_*.bin: no
# file matches this shards pattern"), a token or records shard, an IDX
# file under its standard name or its key's; every one a config error,
# exit 2, as a missing --checkpoint or [model] init_from (README.md, "Exit
# codes"; exit 3 before session 37), in the words "FILE:LINE: [section]
# key: PATH: no such file (what)"; and `kiln summary` opens the training data
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
kiln 2 summary "$tmp/t1.ini"
stderr_has "kiln: error: $tmp/t1.ini:$(line "$tmp/t1.ini" path): [data] path: $tmp/nodir: no such file (the tokens data)"
kiln 2 train "$tmp/t1.ini" "run.out_dir=$tmp/run1"
stderr_has "kiln: error: $tmp/t1.ini:$(line "$tmp/t1.ini" path): [data] path: $tmp/nodir: no such file (the tokens data)"

# a relative path is the working directory's, and said so (before session
# 50 a config run from another directory named data/x "no such file", no
# word of where it was looked for)
tok "$tmp/t1r.ini" "nodir"
rc=0
(cd "$tmp" && "$abs_top_builddir/kiln" summary t1r.ini) > "$out" 2> "$err" || rc=$?
[ "$rc" = 2 ] || fail "summary with a relative path not there: exit $rc, expected 2"
stderr_has "kiln: error: t1r.ini:$(line "$tmp/t1r.ini" path): [data] path: nodir: no such file (the tokens data; a relative name is read from the working directory, $(cd "$tmp" && pwd -P))"

# a directory with a train shard; a listed shard that is missing
mkdir -p "$tmp/tok"
cp "$data/gpt_tokens.bin" "$tmp/tok/train_000.bin"
tok "$tmp/t2.ini" "$tmp/tok" "train_000.bin, nope.bin"
kiln 2 summary "$tmp/t2.ini"
stderr_has "kiln: error: $tmp/t2.ini:$(line "$tmp/t2.ini" shards): [data] shards: $tmp/tok/nope.bin: no such file (the token shard)"

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
kiln 2 memory "$tmp/t3.ini" train.eval=1 "data.eval.shards=val_*.bin"
stderr_has "kiln: error: command line 'data.eval.shards=val_*.bin': [data.eval] shards: $tmp/tok/val_*.bin: no file matches this shards pattern"
# [data.eval]'s own path, the section named
kiln 2 memory "$tmp/t3.ini" train.eval=1 "data.eval.path=$tmp/noval.bin"
stderr_has "kiln: error: command line 'data.eval.path=$tmp/noval.bin': [data.eval] path: $tmp/noval.bin: no such file (the tokens data)"

# a split the key names that is not there (exit 3, naming no key, before
# session 37; the folder source's was exit 2 already)
tok "$tmp/t5.ini" "$tmp/tok"
kiln 2 summary "$tmp/t5.ini" data.split=nosuch
stderr_has "kiln: error: command line 'data.split=nosuch': [data] split: $tmp/tok/nosuch: no such file (the split's directory, or $tmp/tok/nosuch-*.bin shards)"

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
kiln 2 summary "$tmp/r.ini"
stderr_has "kiln: error: $tmp/r.ini:4: [data] shards: $tmp/missing.krec: no such file (the records shard)"
sed '/^shards = /d' "$tmp/r.ini" > "$tmp/r2.ini"
kiln 2 summary "$tmp/r2.ini" data.split=nosuch
stderr_has "kiln: error: command line 'data.split=nosuch': [data] split: $tmp/nosuch: no such file (the split's directory, or $tmp/nosuch-*.krec shards)"
# records: a path that is not there, set on the command line
kiln 2 summary "$tmp/r.ini" data.shards= "data.path=$tmp/norec"
stderr_has "kiln: error: command line 'data.path=$tmp/norec': [data] path: $tmp/norec: no such file (the records data)"


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
kiln 2 summary "$tmp/i.ini"
stderr_has "kiln: error: $tmp/i.ini:3: [data] path: $tmp/noidx/train-images-idx3-ubyte.gz: no such file (the image file; also tried $tmp/noidx/train-images-idx3-ubyte; set path, or images)"
# IDX: images and labels named by their keys
mkdir -p "$tmp/idx"
sed "s|^path = .*|path = $tmp/idx\\
images = img.gz|" "$tmp/i.ini" > "$tmp/i2.ini"
kiln 2 summary "$tmp/i2.ini"
stderr_has "kiln: error: $tmp/i2.ini:4: [data] images: $tmp/idx/img.gz: no such file (the image file)"
# (an IDX image file of one 1x1 image: magic 0x803, dims 1 1 1, a byte)
printf '\000\000\010\003\000\000\000\001\000\000\000\001\000\000\000\001\000' > "$tmp/idx/img.idx"
kiln 2 summary "$tmp/i.ini" "data.path=$tmp/idx" data.images=img.idx data.labels=nolab.idx
stderr_has "kiln: error: command line 'data.labels=nolab.idx': [data] labels: $tmp/idx/nolab.idx: no such file (the label file)"
# [data.eval] path inherited from [data]: the line is [data]'s, and said
# to be (before session 38 "i3.ini:3: [data.eval] path", a line of [data]
# named as [data.eval]'s); evaluation's file under its standard name
mkdir -p "$tmp/idx3"
cp "$data/tr_cnn_images.idx" "$data/tr_cnn_labels.idx" "$tmp/idx3/"
sed "s|^path = .*|path = $tmp/idx3\\
images = tr_cnn_images.idx\\
labels = tr_cnn_labels.idx|" "$tmp/i.ini" > "$tmp/i3.ini"
kiln 2 memory "$tmp/i3.ini" train.eval=1
stderr_has "kiln: error: $tmp/i3.ini:3: [data] path (inherited by [data.eval]): $tmp/idx3/t10k-images-idx3-ubyte.gz: no such file (the image file; also tried $tmp/idx3/t10k-images-idx3-ubyte; set path, or images)"

# tar: a missing path, the shards relative to it
if "$kiln" plugins 2>/dev/null | grep -q "^source  *tar .*available"; then
	sed -e 's/^source = records$/source = tar/' -e "s|^path = .*|path = $tmp/notar|" \
		-e 's/^shards = .*/shards = a.tar/' "$tmp/r.ini" > "$tmp/tar.ini"
	kiln 2 summary "$tmp/tar.ini"
	stderr_has "kiln: error: $tmp/tar.ini:3: [data] path: $tmp/notar: no such file (the tar data)"
	mkdir -p "$tmp/tars"
	kiln 2 summary "$tmp/tar.ini" "data.path=$tmp/tars"
	stderr_has "kiln: error: $tmp/tar.ini:4: [data] shards: $tmp/tars/a.tar: no such file (the tar shard)"
fi

# folder: a root that is not there, a split subdirectory that is not
# there (the key's own line)
if "$kiln" plugins 2>/dev/null | grep -q "^source  *folder .*available"; then
	printf '[data]\nsource = folder\npath = %s\n[layer.fc]\ntype = linear\nout = 2\n[layer.loss]\ntype = softmax_xent\n' \
		"$tmp/nofolder" > "$tmp/f.ini"
	kiln 2 summary "$tmp/f.ini"
	stderr_has "kiln: error: $tmp/f.ini:3: [data] path: $tmp/nofolder: no such file (the folder data)"
	mkdir -p "$tmp/fold/train/a"
	kiln 2 summary "$tmp/f.ini" "data.path=$tmp/fold" data.split=vla
	stderr_has "kiln: error: command line 'data.split=vla': [data] split: $tmp/fold/vla: no such file (split 'vla' of [data] path $tmp/fold)"
fi

# lmdb: an environment that is not there
if "$kiln" plugins 2>/dev/null | grep -q "^source  *lmdb .*available"; then
	sed 's/^source = folder$/source = lmdb/' "$tmp/f.ini" > "$tmp/l.ini"
	kiln 2 summary "$tmp/l.ini"
	stderr_has "kiln: error: $tmp/l.ini:3: [data] path: $tmp/nofolder: no such file (the lmdb data)"
fi
echo "PASS: $checks kiln runs"
