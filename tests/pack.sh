#!/bin/sh
# tests/pack.sh - `kiln pack`: options, exit codes (0 ok, 2 usage or config,
# 3 data naming the sample), shards of the chosen size written atomically,
# the same bytes for any worker count, and records -> records repacking
# byte-identical.  The IDX fixtures are generated here at run time.  Run by
# `make check` (tests/local.mk exports top_builddir).
name=pack
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
LC_ALL=C
export LC_ALL

# u32 at byte OFFSET of FILE, as decimal (little-endian host assumed by od;
# kiln's formats are little-endian and so are the hosts it builds on)
u32() { od -An -tu4 -j"$2" -N4 "$1" | tr -d ' '; }

[ -x "$kiln" ] || { echo "FAIL: $kiln not built"; exit 99; }

# ---- fixtures: 6 gray images of 30 x 30, labels 3 1 4 1 5 9 -----------------
{
	printf '\000\000\010\003\000\000\000\006\000\000\000\036\000\000\000\036'
	awk 'BEGIN { for (i = 0; i < 5400; i++) printf "%c", (i * 37 + 11) % 255 + 1 }'
} > "$tmp/img.idx"
printf '\000\000\010\001\000\000\000\006\003\001\004\001\005\011' > "$tmp/lab.idx"
[ "$(wc -c < "$tmp/img.idx" | tr -d ' ')" = 5416 ] || { echo "FAIL: fixture of the wrong size"; exit 99; }
cat > "$tmp/pack.ini" <<EOF
[data]
source = idx
path = $tmp
images = img.idx
labels = lab.idx
EOF

# ---- usage and config errors: exit 2 ---------------------------------------
kiln 0 pack --help
stdout_has "usage: kiln pack CONFIG --out DIR"
kiln 2 pack
stderr_has "no CONFIG file given"
kiln 2 pack "$tmp/pack.ini"
stderr_has "--out DIR is required"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --store gif
stderr_has "choose raw, jpeg or png"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --bogus
stderr_has "unknown option '--bogus'"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --shard-size 12Q
stderr_has "--shard-size '12Q'"
# kiln_parse_size's decimal sizes (before session 29 a strtod of its own
# took hex and exponents)
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --shard-size 0x10M
stderr_has "--shard-size '0x10M'"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --shard-size 1e6
stderr_has "--shard-size '1e6'"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --quality 0
# --quality is JPEG's: ignored silently by the other stores before session 29
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --quality 75
stderr_has "--quality is the JPEG quality: --store raw ignores it"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --quality 75 --store png
stderr_has "--store png ignores it"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --section model
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" --resize
stderr_has "--resize needs a value"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/o" data.imagez=x
stderr_has "did you mean 'images'"
kiln 2 pack "$tmp/nope.ini" --out "$tmp/o"
[ ! -e "$tmp/o" ] || fail "a failed pack created its output directory"

# ---- packing ------------------------------------------------------------------
kiln 0 pack "$tmp/pack.ini" --out "$tmp/a"
stdout_has "packed 6 samples into 1 shard(s)"
[ -f "$tmp/a/train-00000.krec" ] || fail "no train-00000.krec"
[ "$(head -c 7 "$tmp/a/train-00000.krec")" = KILNREC ] || fail "no magic"
[ "$(u32 "$tmp/a/train-00000.krec" 8)" = 1 ] || fail "version"
[ "$(u32 "$tmp/a/train-00000.krec" 44)" = 10 ] || fail "classes: $(u32 "$tmp/a/train-00000.krec" 44)"
[ "$(u32 "$tmp/a/train-00000.krec" 48)" = 30 ] || fail "image_h"
[ "$(u32 "$tmp/a/train-00000.krec" 52)" = 30 ] || fail "image_w"
ls "$tmp/a" | grep -q tmp && fail "a .tmp file is left"

# an earlier pack is not overwritten without --force
kiln 2 pack "$tmp/pack.ini" --out "$tmp/a"
stderr_has "already holds 1 shard(s) of split 'train'"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/a" --force

# shards of about 4 KiB: 928-byte records, 4 to a shard
kiln 0 pack "$tmp/pack.ini" --out "$tmp/b" --shard-size 4K --workers 1
stdout_has "packed 6 samples into 2 shard(s)"
[ -f "$tmp/b/train-00001.krec" ] || fail "no second shard"
[ "$(u32 "$tmp/b/train-00000.krec" 16)" = 4 ] || fail "4 records in the first shard"
# the same bytes with 3 workers; --force removes the earlier pack's surplus
kiln 0 pack "$tmp/pack.ini" --out "$tmp/c" --shard-size 4K --workers 3
cmp "$tmp/b/train-00000.krec" "$tmp/c/train-00000.krec" || fail "worker count changed the shards"
cmp "$tmp/b/train-00001.krec" "$tmp/c/train-00001.krec" || fail "worker count changed the shards"
# an interrupted pack's *.tmp of the split (SIGTERM, SIGKILL): --force removes
# them, and says so; another split's stay (before session 29 none was removed)
: > "$tmp/c/train-00007.krec.tmp"
: > "$tmp/c/val-00000.krec.tmp"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/c" --force
[ ! -e "$tmp/c/train-00001.krec" ] || fail "--force left a surplus shard of the earlier pack"
stderr_has "kiln pack: removed 1 stale $tmp/c/train-*.krec.tmp file(s) of an interrupted pack"
[ ! -e "$tmp/c/train-00007.krec.tmp" ] || fail "--force left a stale train-00007.krec.tmp"
[ -e "$tmp/c/val-00000.krec.tmp" ] || fail "--force of split train removed val-00000.krec.tmp"
[ ! -e "$tmp/c/train.krec-partial" ] || fail "a finished pack left train.krec-partial"
# so does a pack without --force into a directory that holds no shards of
# the split, only a killed pack's *.tmp: the split is the run's (before
# session 30 only --force removed them, so they stayed)
mkdir "$tmp/k"
: > "$tmp/k/train-00003.krec.tmp"
: > "$tmp/k/train-00000.bin.tmp"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/k"
stderr_has "kiln pack: removed 1 stale $tmp/k/train-*.krec.tmp file(s) of an interrupted pack"
[ ! -e "$tmp/k/train-00003.krec.tmp" ] || fail "a pack left a stale train-00003.krec.tmp"
[ -e "$tmp/k/train-00000.bin.tmp" ] || fail "a records pack removed a token shard's .tmp"

# records -> records: the same bytes
cat > "$tmp/rec.ini" <<EOF
[data]
source = records
path = $tmp/b
EOF
kiln 0 pack "$tmp/rec.ini" --out "$tmp/d" --shard-size 4K
cmp "$tmp/b/train-00000.krec" "$tmp/d/train-00000.krec" || fail "repacking changed the bytes"
cmp "$tmp/b/train-00001.krec" "$tmp/d/train-00001.krec" || fail "repacking changed the bytes"

# every shard records its index, the split's shard count and the pack's id
# (the set block): a split that lost its last shard, which leaves no gap in
# the numbers, is refused naming it (before session 34 read short, exit 0)
[ "$(u32 "$tmp/b/train-00001.krec" 64)" = 1 ] || fail "shard 1's set block index"
[ "$(u32 "$tmp/b/train-00001.krec" 68)" = 2 ] || fail "shard 1's set block count"
[ "$(u32 "$tmp/b/train-00000.krec" 72)" = "$(u32 "$tmp/b/train-00001.krec" 72)" ] || fail "two pack ids in one pack"
mkdir "$tmp/b1"
cp "$tmp/b/train-00000.krec" "$tmp/b1/"
kiln 3 pack "$tmp/rec.ini" --out "$tmp/d1" data.path="$tmp/b1"
stderr_has "$tmp/b1/train-00001.krec is missing: the split's shards record a pack of 2 shard(s) ($tmp/b1/train-00000.krec is shard 0 of them), but 1 are here"
kiln 0 pack "$tmp/rec.ini" --out "$tmp/d1" data.path="$tmp/b1" data.shards=train-00000.krec
stdout_has "packed 4 samples"
# the pack's id covers where the shards are cut: the same data into as many
# shards of another size (5K: 5 + 1 records; 4K: 4 + 2) is another pack, and
# a directory of the first shard of one and the last of the other is refused
# naming both (before, the id was the records' CRC alone, one for both: 5
# samples read, exit 0)
kiln 0 pack "$tmp/pack.ini" --out "$tmp/b5" --shard-size 5K
stdout_has "packed 6 samples into 2 shard(s)"
[ "$(u32 "$tmp/b5/train-00000.krec" 16)" = 5 ] || fail "5 records in the first shard of 5K"
[ "$(u32 "$tmp/b5/train-00000.krec" 72)" != "$(u32 "$tmp/b/train-00000.krec" 72)" ] || fail "one pack id for two cuts of the data"
mkdir "$tmp/bm"
cp "$tmp/b/train-00000.krec" "$tmp/b5/train-00001.krec" "$tmp/bm/"
kiln 3 pack "$tmp/rec.ini" --out "$tmp/dm" data.path="$tmp/bm"
stderr_has "are of two different packs"
stderr_has "$tmp/bm/train-00000.krec (shard 0 of 2, pack "
stderr_has "$tmp/bm/train-00001.krec (shard 1 of 2, pack "

# a pack killed while it placed its shards leaves <split>.krec-partial: the
# reader refuses the split (it may mix two packs) until a --force pack ends
: > "$tmp/b/train.krec-partial"
kiln 3 pack "$tmp/rec.ini" --out "$tmp/d2"
stderr_has "$tmp/b/train-00000.krec: the kiln pack that wrote this split did not finish ($tmp/b/train.krec-partial exists)"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/b" --shard-size 4K --force
[ ! -e "$tmp/b/train.krec-partial" ] || fail "--force left train.krec-partial"
kiln 0 pack "$tmp/rec.ini" --out "$tmp/d2"
stdout_has "packed 6 samples"

# more shards than a reader can map (50000: one mapping each, vm.max_map_count
# about 65530) are refused before packing: 50001 1x1 images made 64x64
{
	printf '\000\000\010\003\000\000\303\121\000\000\000\001\000\000\000\001'
	head -c 50001 /dev/zero
} > "$tmp/many.idx"
{ printf '\000\000\010\001\000\000\303\121'; head -c 50001 /dev/zero; } > "$tmp/manylab.idx"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/many" --resize 64 --shard-size 4096 \
	data.images=many.idx data.labels=manylab.idx
stderr_has "split 'train' needs more than 50000 shards of --shard-size 4096 bytes, more than a reader can map at once"
stderr_has "pass a larger --shard-size"
[ -z "$(ls "$tmp/many")" ] || fail "a refused pack wrote: $(ls "$tmp/many" | head -3)"

# a long, thin image (1x40000) whose --resize passes the transforms' 65536
# pixels a side is refused with the message training gives, before packing
# (raw: the size is known) or at its sample; before session 37 int(60000 *
# 40000) overflowed to a width of -2147483648 ("out of memory resizing")
{
	printf '\000\000\010\003\000\000\000\001\000\000\000\001\000\000\234\100'
	head -c 40000 /dev/zero
} > "$tmp/thin.idx"
printf '\000\000\010\001\000\000\000\001\000' > "$tmp/thinlab.idx"
thin="a 40000x1 image (width x height) with its shorter side resized to 60000 would be 2400000000x60000, outside the transforms' 1 to 65536 pixels a side (MAX_SIDE, core/transform.c): too long and thin for \`resize = 60000\`"
kiln 3 pack "$tmp/pack.ini" --out "$tmp/thin" --resize 60000 data.images=thin.idx data.labels=thinlab.idx
stderr_has "kiln: error: --resize 60000 of [data]'s images: $thin"
kiln 3 pack "$tmp/pack.ini" --out "$tmp/thin" --resize 60000 --store png \
	data.images=thin.idx data.labels=thinlab.idx
stderr_has "kiln: error: [data] source 'idx', sample 0: $thin"
kiln 3 pack "$tmp/pack.ini" --out "$tmp/thin" --resize 20 --store png \
	data.images=thin.idx data.labels=thinlab.idx
stderr_has "would be 800000x20, outside the transforms' 1 to 65536 pixels a side"
[ -z "$(ls "$tmp/thin")" ] || fail "a refused pack wrote: $(ls "$tmp/thin" | head -3)"
# training's config check says the same, naming the key (exit 2: before a
# batch is sized from the width)
kiln 2 bench data "$tmp/pack.ini" --batches 1 data.images=thin.idx data.labels=thinlab.idx data.resize=60000
stderr_has "kiln: error: command line 'data.resize=60000': [data] resize: $thin"

# --format folder --force replaces the split's images (before session 29 it
# wrote beside them: 6 then 3 left 6); files kiln did not write stay, said
kiln 0 pack "$tmp/pack.ini" --out "$tmp/fo" --format folder --store png
[ "$(find "$tmp/fo/train" -name '*.png' | wc -l)" = 6 ] || fail "folder: not 6 images"
echo notes > "$tmp/fo/train/notes.txt"
echo mine > "$tmp/fo/train/1/mine.txt"
kiln 2 pack "$tmp/pack.ini" --out "$tmp/fo" --format folder --store png data.limit=3
stderr_has "pass --force to replace an earlier pack's images there"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/fo" --format folder --store png data.limit=3 --force
stderr_has "kiln pack: --force: removed 6 image(s) of an earlier pack from $tmp/fo/train"
stderr_has "$tmp/fo/train keeps 2 file(s) or directories kiln pack did not write"
[ "$(find "$tmp/fo/train" -name '*.png' | wc -l)" = 3 ] ||
	fail "folder --force: $(find "$tmp/fo/train" -name '*.png' | wc -l) images, want 3"
[ -f "$tmp/fo/train/notes.txt" ] && [ -f "$tmp/fo/train/1/mine.txt" ] || fail "folder --force removed a user's file"
[ -d "$tmp/fo/train/9" ] && [ -z "$(ls -A "$tmp/fo/train/9")" ] ||
	fail "folder --force: class 9's directory (no image of it now) is not there, empty"

# every class has its directory, an empty one too: labels 3 1 4 1 5 9 of 10
# classes read back as 1 1 3 4 5 9 (class by class) of 10, where before
# session 41 classes 0, 2, 6, 7 and 8 had no directory and the folder
# source (or torchvision's ImageFolder) read 0 0 1 2 3 4 of 5
# (the header's classes, then each record's label, through the index)
labels_of() {
	n=$(u32 "$1" 16) ix=$(u32 "$1" 24) i=0
	printf '%s:' "$(u32 "$1" 44)"
	while [ "$i" -lt "$n" ]; do
		printf ' %s' "$(u32 "$1" "$(u32 "$1" $((ix + 16 * i)))")"
		i=$((i + 1))
	done
}
kiln 0 pack "$tmp/pack.ini" --out "$tmp/fc" --format folder --store png
stderr_has "kiln pack: warning: 5 of 10 classes have no images (label 0, 2, 6, 7, 8): their directories in $tmp/fc/train are empty, so that every class keeps its label; torchvision's ImageFolder reads the tree with allow_empty=True only"
printf '[data]\nsource = folder\npath = %s\nchannels = 1\n' "$tmp/fc" > "$tmp/fc.ini"
kiln 0 pack "$tmp/fc.ini" --out "$tmp/fcr"
[ "$(labels_of "$tmp/fcr/train-00000.krec")" = "10: 1 1 3 4 5 9" ] ||
	fail "folder pack read back: classes: labels $(labels_of "$tmp/fcr/train-00000.krec"), want 10: 1 1 3 4 5 9"

# a --format folder pack that fails part way leaves DIR/<split>.folder-partial
# and the folder source refuses the tree (before session 32 nothing marked it:
# training took the classes written so far, relabelled 0, 1, ..., with exit 0)
kiln 0 pack "$tmp/pack.ini" --out "$tmp/fp" --format folder --store png
[ ! -e "$tmp/fp/train.folder-partial" ] || fail "a finished folder pack left train.folder-partial"
printf '[data]\nsource = folder\npath = %s\nchannels = 1\nsize = 30\nworkers = 0\n[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n[train]\nbatch = 3\nmax_steps = 1\neval = 0\n' \
	"$tmp/fp" > "$tmp/fptrain.ini"
kiln 0 train "$tmp/fptrain.ini" run.out_dir="$tmp/fpr"
# class 5's directory a file: sample 4 (label 5) cannot be written, after
# --force removed the 6 images and samples 0..3 (classes 1, 3, 4) were written
rm -r "$tmp/fp/train/5" && echo x > "$tmp/fp/train/5"
kiln 1 pack "$tmp/pack.ini" --out "$tmp/fp" --format folder --store png --force
stderr_has "$tmp/fp/train/5/00000004.png: cannot create: Not a directory"
[ -e "$tmp/fp/train.folder-partial" ] || fail "a failed folder pack left no train.folder-partial"
kiln 3 train "$tmp/fptrain.ini" run.out_dir="$tmp/fpr2"
stderr_has "$tmp/fp/train: the kiln pack that wrote this folder did not finish ($tmp/fp/train.folder-partial exists)"
stderr_has "run the pack again with --force"
kiln 3 pack "$tmp/fptrain.ini" --out "$tmp/fpk"
stderr_has "$tmp/fp/train.folder-partial exists"
# the root written another way (x/..) is the same directory: refused too
# (before the review of session 32 the marker was looked for beside the
# text, $tmp/fp/train/1/...folder-partial)
sed "s|^path = .*|path = $tmp/fp/train/1/..|" "$tmp/fptrain.ini" > "$tmp/fpdot.ini"
kiln 3 train "$tmp/fpdot.ini" run.out_dir="$tmp/fpr4"
stderr_has "$tmp/fp/train.folder-partial exists"
# the pack again, with --force, completes the tree and removes the marker
rm "$tmp/fp/train/5"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/fp" --format folder --store png --force
[ ! -e "$tmp/fp/train.folder-partial" ] || fail "a finished folder pack over a failed one left train.folder-partial"
kiln 0 train "$tmp/fptrain.ini" run.out_dir="$tmp/fpr3"

# an explicit --split must exist: --split vla (val) packed the whole tree,
# its split folders as classes, with exit 0 (before session 31); only the
# section's own split (train) falls back to path itself; a usage error,
# exit 2, as a missing file named on the command line (3 before session 37)
printf '[data]\nsource = folder\npath = %s\nchannels = 1\n' "$tmp/fo" > "$tmp/fold.ini"
kiln 2 pack "$tmp/fold.ini" --out "$tmp/fv" --split vla
stderr_has "$tmp/fo/vla: cannot open split 'vla' of [data] path $tmp/fo: No such file or directory"
[ -z "$(ls "$tmp/fv" 2>/dev/null)" ] || fail "a refused pack wrote: $(ls "$tmp/fv")"
kiln 0 pack "$tmp/fold.ini" --out "$tmp/fv" --split train
stdout_has "packed 3 samples into 1 shard(s)"
kiln 0 pack "$tmp/fold.ini" --out "$tmp/fw" --split val data.path="$tmp/fo/train" data.split=.
stdout_has "packed 3 samples into 1 shard(s)"

# [data.val] inheriting path without path/val read the training data (here
# fo itself, its split folder `train` as the one class), as [data.eval] is
# refused to (before session 31)
{ sed 's/^channels = 1/&\nsize = 30\nworkers = 0/' "$tmp/fold.ini"
  printf '[data.val]\nworkers = 0\n[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = 10\n'
  printf '[layer.loss]\ntype = softmax_xent\n[train]\nbatch = 3\n'; } > "$tmp/foldval.ini"
kiln 2 train "$tmp/foldval.ini" run.out_dir="$tmp/fvr" data.eval.path="$tmp/fo/train"
# (where [data]'s path was set, said since session 38)
stderr_has "[data.val] path is inherited from [data] ($tmp/foldval.ini:$(grep -n '^path = ' "$tmp/foldval.ini" | head -1 | cut -d: -f1): [data] path = $tmp/fo) and $tmp/fo/val does not exist: validation would read the training data"

# [data.eval] and its split; resize; JPEG and PNG
kiln 0 pack "$tmp/pack.ini" --out "$tmp/a" --section data.eval data.eval.images=img.idx \
	data.eval.labels=lab.idx --resize 15 --store png
[ -f "$tmp/a/test-00000.krec" ] || fail "no test-00000.krec"
[ "$(u32 "$tmp/a/test-00000.krec" 48)" = 15 ] || fail "resized image_h"
[ "$(u32 "$tmp/a/test-00000.krec" 52)" = 15 ] || fail "resized image_w"
kiln 0 pack "$tmp/pack.ini" --out "$tmp/e" --store jpeg --quality 75 --split val
[ -f "$tmp/e/val-00000.krec" ] || fail "no val-00000.krec"
kiln 0 pack "$tmp/rec.ini" --out "$tmp/f" data.path="$tmp/e" data.split=val --resize 40
stdout_has "packed 6 samples into 1 shard(s)"
[ "$(u32 "$tmp/f/train-00000.krec" 48)" = 40 ] || fail "enlarged image_h"

# ---- data errors: exit 3, naming the sample, leaving nothing behind -----------
cp "$tmp/b/train-00001.krec" "$tmp/bad-00001.krec"
cp "$tmp/b/train-00000.krec" "$tmp/bad-00000.krec"
# a payload byte of record 1 of the second shard (sample 5): records start at
# 80 (after the header and the set block) and are 928 bytes; byte 200 of that
# record's payload
printf '\000' | dd of="$tmp/bad-00001.krec" bs=1 seek=$((80 + 928 + 24 + 200)) conv=notrunc 2>/dev/null
kiln 3 pack "$tmp/rec.ini" --out "$tmp/g" --shard-size 4K data.path="$tmp" data.split=bad
stderr_has "sample 5"
stderr_has "bad-00001.krec: record 1 (sample 5): CRC32C mismatch"
[ -z "$(ls "$tmp/g")" ] || fail "a failed pack left files: $(ls "$tmp/g")"
# the same shards under a path of ~1,400 bytes: a worker thread's message
# reaches the user whole, in pack and in training's loader (both once cut
# at 1,200 and 512 bytes, losing the record and the cause)
long=$tmp
for i in 1 2 3 4 5 6 7; do
	long=$long/$(printf "%0200d" $i)
done
mkdir -p "$long"
cp "$tmp/bad-00000.krec" "$tmp/bad-00001.krec" "$long/"
kiln 3 pack "$tmp/rec.ini" --out "$tmp/g" --shard-size 4K data.path="$long" data.split=bad
stderr_has "$long/bad-00001.krec: record 1 (sample 5): CRC32C mismatch"
{
	ini data source=records path="$long" split=bad
	linear_layers 10
	ini train epochs=1 batch=2 eval=0
} > "$tmp/long.ini"
kiln 3 train "$tmp/long.ini" run.out_dir=
stderr_has "$long/bad-00001.krec: record 1 (sample 5): CRC32C mismatch"
head -c 3000 "$tmp/img.idx" > "$tmp/short.idx"
kiln 3 pack "$tmp/pack.ini" --out "$tmp/h" data.images=short.idx
stderr_has "truncated"
stderr_has "short.idx"

# ---- a second pack into an --out another pack is writing: refused, exit 2 ----
# (it once removed the first one's *.tmp as stale, or mixed their shards).
# The first pack is stood in for by flock(1) holding the directory's lock
# (-o: its sleep does not inherit it; the kill below releases it).
if command -v flock > /dev/null; then
	mkdir "$tmp/busy"
	flock -o "$tmp/busy" sleep 60 > /dev/null 2>&1 &
	holder=$!
	n=0
	while flock -n "$tmp/busy" true; do
		[ $n -lt 3000 ] || { kill "$holder"; fail "flock(1) did not take the lock within 300 s"; }
		sleep 0.1
		n=$((n + 1))
	done
	kiln 2 pack "$tmp/pack.ini" --out "$tmp/busy"
	stderr_has "kiln: error: --out $tmp/busy: another kiln pack is writing there (it holds the directory's lock)"
	printf 'some text to pack\n' > "$tmp/t.txt"
	kiln 2 pack --format tokens "$tmp/t.txt" --out "$tmp/busy"
	stderr_has "another kiln pack is writing there"
	[ -z "$(ls "$tmp/busy")" ] || fail "a refused pack wrote into --out: $(ls "$tmp/busy")"
	pkill -P "$holder" sleep
	kill "$holder" 2> /dev/null
	wait "$holder" 2> /dev/null
	kiln 0 pack "$tmp/pack.ini" --out "$tmp/busy"
fi

# ---- --format tokens: a pipe is read to its end; no text at all is an error ---
# (before session 31 the st_size bytes of an input were read: a pipe,
# /dev/stdin or <(zcat f.gz) packed 0 tokens with exit 0, as did an empty file)
printf 'hello world\n' | kiln 0 pack --format tokens /dev/stdin --out "$tmp/tp"
stdout_has "packed 1 file(s): 12 tokens in 1 train shard(s)"
[ "$(u32 "$tmp/tp/train-000000.bin" 8)" = 12 ] || fail "tokens from a pipe: header says $(u32 "$tmp/tp/train-000000.bin" 8) tokens"
: > "$tmp/empty.txt"
kiln 3 pack --format tokens "$tmp/empty.txt" --out "$tmp/te"
stderr_has "$tmp/empty.txt: empty: no text to encode"
stderr_has "no text to encode: the 1 input file(s) ($tmp/empty.txt) are empty"
[ ! -e "$tmp/te/train-000000.bin" ] || fail "an empty input left a shard"
# a file and the same bytes through a pipe, larger than a read: one shard
awk 'BEGIN { for (i = 0; i < 20000; i++) printf "line %d of the corpus\n", i }' > "$tmp/corpus.txt"
kiln 0 pack --format tokens "$tmp/corpus.txt" --out "$tmp/tc1"
n=$(wc -c < "$tmp/corpus.txt" | tr -d ' ')
stdout_has "packed 1 file(s): $n tokens in 1 train shard(s)"
cat "$tmp/corpus.txt" | kiln 0 pack --format tokens /dev/stdin --out "$tmp/tc2"
cmp -s "$tmp/tc1/train-000000.bin" "$tmp/tc2/train-000000.bin" || fail "a pipe packs other tokens than the file"
# a FIFO is read when its writer comes (as cat reads one), to its end
mkfifo "$tmp/fifo.txt"
{ sleep 1; printf 'abc' > "$tmp/fifo.txt"; } &
kiln 0 pack --format tokens "$tmp/fifo.txt" "$tmp/empty.txt" --out "$tmp/tf"
stdout_has "packed 2 file(s): 3 tokens in 1 train shard(s)"
wait

echo "PASS: kiln pack"
