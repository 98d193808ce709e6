#!/bin/sh
# tests/launch_result.sh - `kiln launch -n 2 -- kiln train`: the ranks share
# one stdout, and README.md says its last line is the run's JSON.  Asserts:
#  1. stdout has exactly one line, a JSON object with "checkpoint" (rank
#     0's, the rank that writes it; before session 38 both ranks printed
#     their line there, whichever ended last being the last);
#  2. rank 1's final metrics are on stderr, one line after "kiln: rank 1's
#     final metrics: " with its own device_peak_bytes (docs/distributed.md
#     compares the largest of the ranks');
#  3. a plain run (no launcher) still ends its stdout with its JSON line.
name=launch-result needs=gloo
. "$(dirname "$0")/dist_common.sh"

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60 gloo
common="train.epochs=1 train.max_steps=4 data.limit=256 data.eval.limit=128"

timeout 120 "$kiln" launch -n 2 -- "$kiln" train "$ini" run.out_dir="$tmp/two" train.batch=32 $common \
	> "$tmp/two.out" 2> "$tmp/two.err"
rc=$?
[ $rc = 0 ] || { bad "launch -n 2 exited $rc"; tail -20 "$tmp/two.err"; }
n=$(wc -l < "$tmp/two.out")
[ "$n" = 1 ] || bad "launch -n 2: stdout has $n lines, not 1: $(cat "$tmp/two.out")"
grep -q "^{\"epochs\": 1, \"steps\": 4, .*\"checkpoint\": \"$tmp/two/checkpoints/ckpt-4.kiln\", .*}\$" "$tmp/two.out" ||
	bad "launch -n 2: stdout is not rank 0's JSON line with its checkpoint: $(cat "$tmp/two.out")"
if command -v python3 > /dev/null; then
	python3 -c 'import json, sys; json.loads(open(sys.argv[1]).read())' "$tmp/two.out" 2> /dev/null ||
		bad "launch -n 2: stdout is not JSON"
fi
n=$(grep -c "^kiln: rank 1's final metrics: {\"epochs\": 1, \"steps\": 4, .*\"device_peak_bytes\": [1-9][0-9]*, .*}\$" "$tmp/two.err")
[ "$n" = 1 ] || bad "launch -n 2: $n lines of rank 1's final metrics on stderr, not 1"
grep "rank 1's final metrics" "$tmp/two.err" | grep -q '"checkpoint"' &&
	bad "launch -n 2: rank 1's metrics name a checkpoint"
grep -q "rank 0's final metrics" "$tmp/two.err" && bad "launch -n 2: rank 0's metrics on stderr"

run_one() {
	KILN_MASTER_PORT=$(free_port 7) timeout 120 "$kiln" train "$ini" run.out_dir="$tmp/one" train.batch=64 $common \
		> "$tmp/one.out" 2> "$tmp/one.err"
}
run_one || bad "plain run exited $?"
tail -1 "$tmp/one.out" | grep -q "^{\"epochs\": 1, \"steps\": 4, .*\"checkpoint\": \"$tmp/one/checkpoints/ckpt-4.kiln\"" ||
	bad "plain run: the last line of stdout is not its JSON: $(tail -1 "$tmp/one.out")"
grep -q "final metrics" "$tmp/one.err" && bad "plain run: final metrics on stderr"
exit $fail
