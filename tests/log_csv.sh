#!/bin/sh
# [log] csv = 1: train.csv and eval.csv hold a header and, row by row, the
# numbers of metrics.jsonl's train and eval lines (tests/log_check.py csv),
# in a plain run and in one resumed from a checkpoint (appended), each real
# equal to metrics.jsonl's (the same round-trip digits); a resume refused
# for a table with a row longer than its header.
name=log_csv
. "$(dirname "$0")/log_common.sh"
command -v python3 > /dev/null || { echo "SKIP: no python3 to read the tables"; exit 77; }
log_run "$tmp/run"
for d in "$tmp/run" "$tmp/run/resumed"; do
	python3 "$srcdir/tests/log_check.py" csv "$d" || fail "$d: the CSV tables differ from metrics.jsonl"
done
grep -q '"grad_norm":' "$tmp/run/metrics.jsonl" || fail "train lines lack grad_norm (skip_nonfinite computes it)"
grep -q '"lr":0.05,' "$tmp/run/metrics.jsonl" || fail "train lines lack the constant lr 0.05"
# a resumed run refuses a table it cannot append to as it is (session 37):
# a row with two cells more than the header has columns, named by file and
# line before a step is taken (exit 3), every file left as it was; before,
# it went on, and a widening's new columns took the extra cells
bad="$tmp/run/bad"
cp -r "$tmp/run/resumed" "$bad"
line=$(($(wc -l < "$bad/train.csv") + 1))
commas=$(head -1 "$bad/train.csv" | tr -cd , | wc -c)
{ printf '1,99'; i=1; while [ $i -le "$commas" ]; do printf ',7'; i=$((i + 1)); done; echo; } >> "$bad/train.csv"
cp "$bad/train.csv" "$tmp/train.before"
cp "$bad/metrics.jsonl" "$tmp/metrics.before"
# shellcheck disable=SC2086
kiln 3 train "$tmp/mlp.ini" run.out_dir="$bad" train.resume=1 train.epochs=4 $logged
stderr_has "$bad/train.csv:$line: $((commas + 2)) cells under a header of $((commas + 1)) columns: the columns a resumed run adds at the end would take the extra ones; remove them, or move the table aside to begin a new one"
cmp -s "$bad/train.csv" "$tmp/train.before" || fail "the refused run changed train.csv"
cmp -s "$bad/metrics.jsonl" "$tmp/metrics.before" || fail "the refused run changed metrics.jsonl"
echo "PASS: $checks runs"
