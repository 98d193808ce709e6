#!/bin/sh
# [log] in a 2-rank data-parallel run (kiln launch, gloo): only rank 0
# writes, so out_dir holds one event file and one pair of CSV tables, and
# they agree with metrics.jsonl (tests/log_check.py; the TensorBoard part
# only where the tensorboard package is in $KILN_VENV).
name=log_dist
needs=gloo
. "$(dirname "$0")/dist_common.sh"
ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60
run two 2 32 log.tensorboard=1 log.csv=1 log.histograms=16
n=$(ls "$tmp/two" | grep -c '^events\.out\.tfevents\.')
[ "$n" = 1 ] || bad "$n event files in out_dir, expected 1 (rank 0's)"
[ "$(ls "$tmp/two" | grep -c '\.csv$')" = 1 ] || bad "expected train.csv alone (eval = 0): $(ls "$tmp/two")"
python3 "$srcdir/tests/log_check.py" csv "$tmp/two" || bad "the CSV tables differ from metrics.jsonl"
py="${KILN_VENV:-$abs_top_builddir/.venv}/bin/python"
if [ -x "$py" ] && "$py" -c 'import tensorboard' 2> /dev/null; then
	"$py" "$srcdir/tests/log_check.py" tensorboard "$tmp/two" 16 || bad "TensorBoard reads other values"
else
	echo "note: no tensorboard package: the event file is not read back"
fi
[ $fail = 0 ] && echo "PASS: one set of logs from 2 ranks"
exit $fail
