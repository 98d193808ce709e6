#!/bin/sh
# tests/output_guard_cost.sh - the output guard (kiln_output_watch: no
# command writes over a file of the data it reads, tests/output_guard.sh)
# costs no stat per data file when the output does not exist yet, and one,
# not two, when it does.  Before the review of session 34 kiln_source_open
# stat'ed the output and the file for each file of each source it opened:
# `kiln export` of a folder of 200,000 PNGs spent 400,000 stats (0.9 s more;
# minutes for ImageNet on a cold NFS).  A folder of 2 x $n PNGs, a model
# trained a step on it, then `kiln export --safetensors W` under strace:
#  1. W absent: W stat'ed a few times (the command's checks), no image is;
#  2. W there (and not an input): still W a few times, not once per image.
name=output_guard_cost
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source idx
need_source folder
command -v strace >/dev/null 2>&1 || { echo "SKIP: no strace"; exit 77; }
strace -f -o /dev/null true 2>/dev/null || { echo "SKIP: strace cannot trace here (ptrace refused)"; exit 77; }
data="$srcdir/tests/data"
n=100

# one PNG of tr_cnn's test set, copied n times into each of two classes
kiln 0 pack "$data/tr_cnn.ini" "data.path=$data" --format folder --store png --out "$tmp/png" --section data.eval
png=$(find "$tmp/png" -name '*.png' | head -n 1)
[ -n "$png" ] || fail "kiln pack wrote no PNG"
for c in a b; do
	mkdir -p "$tmp/fold/train/$c"
	i=0
	while [ $i -lt $n ]; do cp "$png" "$tmp/fold/train/$c/$i.png"; i=$((i + 1)); done
done
{
	ini run threads=1 out_dir="$tmp/run"
	ini data source=folder path="$tmp/fold" size=8 channels=1 workers=0 shuffle=0
	linear_layers 2
	ini train batch=2 max_steps=1 eval=0
} >"$tmp/fold.ini"
kiln 0 train "$tmp/fold.ini"
w="$tmp/w.safetensors"

# traced EXPECT: kiln export onto $w under strace, exit EXPECT; then $outs,
# the stats of $w (its exact name: not its temporary's), and $imgs, of the images
traced() {
	strace -f -qq -e trace=stat,lstat,newfstatat,statx -o "$tmp/trace" \
		"$kiln" export "$tmp/fold.ini" --safetensors "$w" >"$out" 2>"$err"
	rc=$?
	[ $rc -eq "$1" ] || { cat "$err"; fail "kiln export exit $rc, expected $1"; }
	outs=$(grep -c "\"$w\"" "$tmp/trace")
	imgs=$(grep -c "\"$tmp/fold/train/[ab]/[0-9]*\.png\"" "$tmp/trace")
	echo "ok: kiln export: $outs stats of the output, $imgs of the $((2 * n)) images"
}
[ ! -e "$w" ] || fail "$w is there before the first export"
traced 0
[ -s "$w" ] || fail "kiln export wrote no $w"
[ "$outs" -le 10 ] || fail "the absent output was stat'ed $outs times (more than 10) for $((2 * n)) images"
[ "$imgs" -eq 0 ] || fail "the images were stat'ed $imgs times with no output there to compare them with"
traced 0
[ "$outs" -le 10 ] || fail "the existing output was stat'ed $outs times (more than 10) for $((2 * n)) images"
echo "PASS"
