#!/bin/sh
# tests/out_dir_init_from.sh - a fresh run does not delete the file it
# reads its weights from ([model] init_from) with the earlier run it
# replaces (session 39).
#
# Before session 39, fine-tuning from the latest run's checkpoint in the
# default out_dir (`kiln train k.ini model.init_from=runs/latest/
# checkpoints/ckpt-4.kiln`) loaded it, then deleted the earlier run's files
# ("out_dir is the default, the latest run: deleted the earlier run's 4
# file(s)"), that checkpoint among them, and exited 0: the fine-tuned
# model's ckpt-4.kiln replaced the weights it started from.  --overwrite
# did the same with an init_from inside the run it overwrote.  Now such a
# run is refused (exit 2) before anything is deleted, naming the file,
# whatever path reaches it (a symlink elsewhere); a copy outside the run
# directory fine-tunes as before, and so does an init_from that a symlink
# of the run points to (deleting the link keeps the file).  On
# tests/data/tr_cnn.ini (8x8 images, 48 samples).
name=out_dir_init_from
. "$(dirname "$0")/lib.sh"
need_source idx
ini="$srcdir/tests/data/tr_cnn.ini"
d="data.path=$srcdir/tests/data"
case $ini in /*) ;; *) ini="$PWD/$ini" d="data.path=$PWD/$srcdir/tests/data" ;; esac
case $kiln in /*) ;; *) kiln="$PWD/$kiln" ;; esac
four="train.max_steps=4 train.checkpoint_every=2"
fine="train.max_steps=4 train.checkpoint_every=2 train.lr=0.01"
mkdir "$tmp/w"
cd "$tmp/w" || fail "cd $tmp/w"
ck=runs/latest/checkpoints/ckpt-4.kiln

# the earlier run, in the default out_dir
kiln 0 train "$ini" "$d" $four
[ -f "$ck" ] || fail "no $ck"
cp "$ck" "$tmp/ck4.before"
cp runs/latest/metrics.jsonl "$tmp/metrics.before"
unchanged() {
	cmp -s "$ck" "$tmp/ck4.before" || fail "$1: $ck changed"
	cmp -s runs/latest/metrics.jsonl "$tmp/metrics.before" || fail "$1: metrics.jsonl changed"
	! grep -q "deleted the earlier run" "$err" || fail "$1: files deleted"
}

# 1. fine-tuning from its checkpoint there: refused, nothing deleted
kiln 2 train "$ini" "$d" $fine "model.init_from=$ck"
stderr_has "command line 'model.init_from=$ck': [model] init_from = $ck is one of the earlier run's 4 file(s) in 'runs/latest' that a fresh run in the default out_dir (the latest run) deletes before it writes its own"
stderr_has "Copy it out of the run directory and set init_from to the copy, pass --resume to continue that run instead, or choose another out_dir; nothing was changed"
unchanged "init_from in runs/latest"

# 2. through a symlink outside the run: the same file, refused
ln -s "$PWD/$ck" "$tmp/link.kiln"
kiln 2 train "$ini" "$d" $fine "model.init_from=$tmp/link.kiln"
stderr_has "[model] init_from = $tmp/link.kiln (the file $ck) is one of the earlier run's 4 file(s)"
unchanged "init_from a symlink to runs/latest's"

# 3. --overwrite of the run init_from is in: refused
kiln 0 train "$ini" "$d" $four "run.out_dir=$tmp/run"
cp "$tmp/run/checkpoints/ckpt-2.kiln" "$tmp/ck2.before"
kiln 2 train "$ini" "$d" $fine "run.out_dir=$tmp/run" --overwrite \
	"model.init_from=$tmp/run/checkpoints/ckpt-2.kiln"
stderr_has "that --overwrite deletes before it writes its own: the weights this run starts from would be lost"
cmp -s "$tmp/run/checkpoints/ckpt-2.kiln" "$tmp/ck2.before" || fail "--overwrite changed the init_from checkpoint"
[ -f "$tmp/run/checkpoints/ckpt-4.kiln" ] || fail "the refused --overwrite deleted ckpt-4.kiln"

# 4. a copy outside the run: the fine-tune runs, the earlier run goes, and
# it trains as the same fine-tune into a new out_dir does
cp "$ck" "$tmp/copy.kiln"
kiln 0 train "$ini" "$d" $fine "model.init_from=$tmp/copy.kiln" "run.out_dir=$tmp/fresh"
cp "$out" "$tmp/fresh.out"
kiln 0 train "$ini" "$d" $fine "model.init_from=$tmp/copy.kiln"
stderr_has "deleted the earlier run's 4 file(s) in runs/latest"
same_metrics "into a new out_dir" "$tmp/fresh.out" "into runs/latest" "$out"
cmp -s "$tmp/copy.kiln" "$tmp/ck4.before" || fail "the copy changed"
! cmp -s "$ck" "$tmp/ck4.before" || fail "the fine-tune's ckpt-4.kiln is the earlier run's"

# 5. a symlink of the run pointing to init_from: the link goes, the file stays
rm "$ck"
ln -s "$tmp/copy.kiln" "$ck"
kiln 0 train "$ini" "$d" $fine "model.init_from=$tmp/copy.kiln"
stderr_has "deleted the earlier run's"
cmp -s "$tmp/copy.kiln" "$tmp/ck4.before" || fail "deleting the run's symlink changed the file it named"
[ -f "$ck" ] && [ ! -L "$ck" ] || fail "$ck is not the new run's checkpoint"
echo "$checks checks passed"
echo "PASS"
