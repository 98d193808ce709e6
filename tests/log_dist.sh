#!/bin/sh
# [log] in a 2-rank data-parallel run (kiln launch, gloo): only rank 0
# writes, so out_dir holds one event file and one pair of CSV tables, and
# they agree with metrics.jsonl (tests/log_check.py; the TensorBoard part
# only where the tensorboard package is in $KILN_VENV); the run's samples/s
# count both ranks' samples, a rank's beside them (session 39).
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
# the run's training samples/s (every rank's, as the train lines'
# samples_per_s) beside a rank's: in the JSON lines, the epoch lines, the
# final line of metrics.jsonl (exactly twice) and `kiln report`'s result
rates two 2
python3 - "$tmp/two/metrics.jsonl" <<'PY' > "$tmp/two.final" || bad "metrics.jsonl's final line: samples_per_s is not 2 x train_samples_per_s"
import json, sys
f = [j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "final"][-1]
print("%.1f %.1f" % (f["samples_per_s"], f["train_samples_per_s"]))
sys.exit(f["samples_per_s"] != 2 * f["train_samples_per_s"])
PY
"$kiln" report "$tmp/two" > "$tmp/report.log" 2>&1 || bad "kiln report exited $?"
read -r all one < "$tmp/two.final"
for row in "(all data-parallel ranks)</td><td>$all<" "(one data-parallel rank)</td><td>$one<"; do
	grep -qF "<tr><td>training samples/s $row" "$tmp/two/report.html" ||
		bad "the report has no row 'training samples/s $row': $(grep 'samples/s' "$tmp/two/report.html")"
done
py="${KILN_VENV:-$abs_top_builddir/.venv}/bin/python"
if [ -x "$py" ] && "$py" -c 'import tensorboard' 2> /dev/null; then
	"$py" "$srcdir/tests/log_check.py" tensorboard "$tmp/two" 16 || bad "TensorBoard reads other values"
else
	echo "note: no tensorboard package: the event file is not read back"
fi
[ $fail = 0 ] && echo "PASS: one set of logs from 2 ranks"
exit $fail
