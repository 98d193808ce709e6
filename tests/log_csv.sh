#!/bin/sh
# [log] csv = 1: train.csv and eval.csv hold a header and, row by row, the
# numbers of metrics.jsonl's train and eval lines (tests/log_check.py csv),
# in a plain run and in one resumed from a checkpoint (appended).
name=log_csv
. "$(dirname "$0")/log_common.sh"
command -v python3 > /dev/null || { echo "SKIP: no python3 to read the tables"; exit 77; }
log_run "$tmp/run"
for d in "$tmp/run" "$tmp/run/resumed"; do
	python3 "$srcdir/tests/log_check.py" csv "$d" || fail "$d: the CSV tables differ from metrics.jsonl"
done
grep -q '"grad_norm":' "$tmp/run/metrics.jsonl" || fail "train lines lack grad_norm (skip_nonfinite computes it)"
grep -q '"lr":0.05,' "$tmp/run/metrics.jsonl" || fail "train lines lack the constant lr 0.05"
echo "PASS: $checks runs"
