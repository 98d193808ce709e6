#!/bin/sh
# tests/resume_config.sh - a resume the setup refuses leaves out_dir's
# config.ini as it was; one that trains writes its own.  Before session 37
# config.ini was written before the loggers opened, and they can refuse a
# resume (here a metrics.jsonl that is a FIFO, docs/logging.md): the
# refused run, with a changed train.epochs, had already replaced the
# config.ini of the run it would have resumed.
name=resume_config
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source synthetic

{
	ini run device=cpu seed=1 threads=1
	ini_synthetic 64 4 4
	linear_layers 4
	ini train epochs=2 batch=16 lr=0.1 eval=0 checkpoint_every=4
	ini log csv=1
} >"$tmp/m.ini"
o="$tmp/o"
kiln 0 train "$tmp/m.ini" "run.out_dir=$o" train.max_steps=4
grep -qx "epochs = 2" "$o/config.ini" || fail "the first run's config.ini lacks epochs = 2"
cp "$o/config.ini" "$tmp/config.before"

# refused by the loggers: config.ini byte for byte the first run's
rm "$o/metrics.jsonl"
mkfifo "$o/metrics.jsonl" || fail "mkfifo"
kiln 1 train "$tmp/m.ini" "run.out_dir=$o" train.resume=1 train.epochs=3
stderr_has "$o/metrics.jsonl: cannot write: it is a FIFO, not a regular file"
cmp "$tmp/config.before" "$o/config.ini" || fail "a refused resume rewrote config.ini"
echo "ok: a resume refused by the loggers leaves config.ini as it was"

# refused by config.ini itself (a directory in its place): before the
# loggers open, so no new file is left (a review: an empty metrics.jsonl
# on a fresh run, a second TensorBoard file on a resume)
f="$tmp/f"
mkdir -p "$f/config.ini/x"
kiln 1 train "$tmp/m.ini" "run.out_dir=$f" log.tensorboard=1
for x in "$f"/metrics.jsonl "$f"/events.out.tfevents.*; do
	[ ! -e "$x" ] || fail "a run refused by its config.ini left $x"
done
echo "ok: a run whose config.ini cannot be written leaves no log files"

# [log] csv's tables, which open at their first record: what refuses them
# is refused at setup, before config.ini and the loggers' files (before
# session 38 a fresh run with a directory train.csv failed at its first
# log point, config.ini and metrics.jsonl written; a resume whose
# eval.csv was a FIFO waited for a writer for ever, reading it)
c="$tmp/c"
mkdir -p "$c/train.csv/x"
kiln 1 train "$tmp/m.ini" "run.out_dir=$c"
stderr_has "$c/train.csv: cannot write: Is a directory"
for x in "$c"/config.ini "$c"/metrics.jsonl; do
	[ ! -e "$x" ] || fail "a run refused by its train.csv left $x"
done
mkfifo "$o/eval.csv" || fail "mkfifo"
# (timeout: the hang; 124 is a failed check)
timeout 30 "$kiln" train "$tmp/m.ini" "run.out_dir=$o" train.resume=1 train.epochs=3 \
	>"$out" 2>"$err"
rc=$?
[ $rc = 1 ] || fail "a resume with a FIFO eval.csv: exit $rc, expected 1 (124: it waited on the FIFO)"
stderr_has "$o/eval.csv: cannot write: it is a FIFO, not a regular file"
cmp "$tmp/config.before" "$o/config.ini" || fail "a resume refused by its eval.csv rewrote config.ini"
rm "$o/eval.csv"
echo "ok: a train.csv or eval.csv that cannot be written is refused at setup"

# accepted: the resumed run's config.ini says what it ran
rm "$o/metrics.jsonl"
kiln 0 train "$tmp/m.ini" "run.out_dir=$o" train.resume=1 train.epochs=3
grep -qx "epochs = 3" "$o/config.ini" || fail "the resumed run's config.ini lacks epochs = 3"
echo "ok: a resume that trains writes its config.ini"
