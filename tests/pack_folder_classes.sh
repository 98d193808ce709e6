#!/bin/sh
# tests/pack_folder_classes.sh - `kiln pack --format folder` of a source of
# many classes: a class's directory is made with its first image, the
# empty classes' after the last image (session 42).  Before, every one of
# the source's classes got its directory before the first image was
# written, with no line of progress: 10^6 classes spent about 150 s (and
# ~4 GB of empty directories) before the first sample.
#  1. 10^5 classes, 16 samples (labels 0..15): the first image's place is
#     taken by a directory, so the pack fails writing sample 0; the split
#     then holds the one class directory put there, not 10^5 (the old
#     code's count: every directory was made before that first write).
#  2. The same source with 1000 classes, packed whole on a terminal
#     (util-linux's `script`): exit 0, 16 images, all 1000 class
#     directories (the 984 empty ones made at the end, so that no label
#     shifts), the warning naming them on a line of its own, and a
#     progress line as they are made (one at the first: a line that does
#     not depend on how fast the disk is).  (1000, not 10^5: making and
#     removing 10^5 directories takes minutes on a busy disk.)
# (tests/pack.sh checks an empty middle class read back with its label.)
name=pack_folder_classes
. "$(dirname "$0")/lib.sh"
need_source synthetic
LC_ALL=C
export LC_ALL

cat >"$tmp/many.ini" <<EOF
[data]
source = synthetic
samples = 16
image_size = 4 4
image_channels = 1
classes = 100000
workers = 0
EOF
# dirs DIR: the directories directly in DIR
dirs() { find "$1" -mindepth 1 -maxdepth 1 -type d | wc -l | tr -d ' '; }

# 1. sample 0 (class 00000) cannot be written: a directory, not empty, is
# where its image goes (--force keeps what it did not write, warning)
mkdir -p "$tmp/o/train/00000/00000000.png"
echo x >"$tmp/o/train/00000/00000000.png/keep"
kiln 1 pack "$tmp/many.ini" --out "$tmp/o" --format folder --store png --force --workers 1
stderr_has "$tmp/o/train/00000/00000000.png: cannot create: Is a directory"
n=$(dirs "$tmp/o/train")
[ "$n" = 1 ] ||
	fail "$n class directories in $tmp/o/train when the first image was written, want 1 (its own): the directories come with their images"
[ -e "$tmp/o/train.folder-partial" ] || fail "the failed pack left no train.folder-partial"
echo "ok: 1 class directory of 100000 made before the first image"

# 2. the whole pack, on a terminal
command -v script >/dev/null || { echo "SKIP (part 2): no script(1) to give kiln a terminal"; exit 0; }
script -qec "\"$kiln\" pack \"$tmp/many.ini\" --out \"$tmp/w\" --format folder --store png data.classes=1000" /dev/null \
	>"$tmp/tty.out" 2>&1 </dev/null || fail "kiln pack under script(1) failed: $(tail -c 2000 "$tmp/tty.out")"
# CR -> R, ESC -> E: the escapes as text
tr '\r\033' 'RE' <"$tmp/tty.out" >"$tmp/tty.txt"
n=$(find "$tmp/w/train" -name '*.png' | wc -l | tr -d ' ')
[ "$n" = 16 ] || fail "$n images, want 16"
n=$(dirs "$tmp/w/train")
[ "$n" = 1000 ] || fail "$n class directories, want 1000 (the empty classes' too)"
[ -f "$tmp/w/train/000/00000000.png" ] && [ -f "$tmp/w/train/015/00000015.png" ] ||
	fail "samples 0 and 15 are not in their classes 000 and 015"
[ -d "$tmp/w/train/016" ] && [ -z "$(ls -A "$tmp/w/train/016")" ] &&
	[ -d "$tmp/w/train/999" ] && [ -z "$(ls -A "$tmp/w/train/999")" ] ||
	fail "the empty classes 016 and 999 have no empty directory"
[ ! -e "$tmp/w/train.folder-partial" ] || fail "a finished pack left train.folder-partial"
grep -q "kiln pack: warning: 984 of 1000 classes have no images (label 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, ...)" \
	"$tmp/tty.txt" || fail "no warning of the 984 empty classes: $(tail -c 2000 "$tmp/tty.txt")"
grep -q 'RE\[Kmade [0-9]*/984 directories of the classes with no images' "$tmp/tty.txt" ||
	fail "no progress line while the empty classes' directories were made: $(head -c 2000 "$tmp/tty.txt")"
# the warning on its own line, not glued onto the progress line
grep -q 'RE\[Kkiln pack: warning: 984 of 1000' "$tmp/tty.txt" ||
	fail "the warning is not on a line of its own: $(grep -o '.\{60\}kiln pack: warning' "$tmp/tty.txt")"
echo "ok: 16 images, 1000 class directories, a progress line while the empty ones were made"
echo "PASS: $name"
