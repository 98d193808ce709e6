#!/bin/sh
# tests/profile.sh - `kiln train --profile` end to end on a slice of
# Fashion-MNIST: the flag works before or after the file, the table goes to
# stderr and out_dir/profile.txt, the trace to out_dir/trace.json, and the
# run's numbers equal the unprofiled run's.  (tests/check_profile checks
# the table and the trace in depth.)
name=profile
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cfg="$srcdir/examples/fashion_mnist_mlp.ini"
short="data.limit=1280 data.eval.limit=500 train.max_steps=8 train.batch=64 run.profile_steps=3"

# shellcheck disable=SC2086
"$kiln" train "$cfg" --profile $short "run.out_dir=$tmp/a" >"$tmp/a.out" 2>"$tmp/a.err" ||
	{ cat "$tmp/a.err"; fail "kiln train FILE --profile"; }
grep -q '^\[profile\] total ' "$tmp/a.err" || { cat "$tmp/a.err"; fail "no table on stderr"; }
grep -q '^total ' "$tmp/a/profile.txt" || fail "no total line in profile.txt"
head -c 200 "$tmp/a/trace.json" | grep -q '"traceEvents"' || fail "trace.json lacks traceEvents"
n=$(grep -c '"cat":"step","ph":"X"' "$tmp/a/trace.json")
[ "$n" = 3 ] || fail "trace.json has $n step slices, run.profile_steps=3 wants 3"
echo "ok: --profile after the file: table, profile.txt, trace.json of 3 steps"
# every op of the step and its log point has a label: the parameters'
# non-finite check is "param check" (before session 33 "(unlabelled)
# grad_clip log")
grep -q '^(unlabelled)' "$tmp/a/profile.txt" && { cat "$tmp/a/profile.txt"; fail "an (unlabelled) row"; }
grep -q '^param check  *grad_clip  *log ' "$tmp/a/profile.txt" ||
	{ cat "$tmp/a/profile.txt"; fail "no 'param check grad_clip log' row"; }
echo "ok: no (unlabelled) row; the parameters' check is 'param check'"

# bench/profile_table.py (bench/mlp_ops.sh's reader) reads every row of the
# table, layer names with spaces ("step counter") too, and the total
if command -v python3 >/dev/null 2>&1; then
	python3 "$srcdir/bench/profile_table.py" "$tmp/a/profile.txt" >"$tmp/rows" ||
		fail "bench/profile_table.py failed on profile.txt"
	# the table's rows: between the two rules, less (host) untracked
	want=$(awk '/^-+$/ { r++; next } r == 1 && !/^\(host\)/' "$tmp/a/profile.txt" | wc -l)
	got=$(grep -vc '^total|' "$tmp/rows")
	[ "$want" -gt 3 ] && [ "$got" = "$want" ] ||
		{ cat "$tmp/a/profile.txt" "$tmp/rows"; fail "profile_table.py read $got rows of $want"; }
	grep -q '^step counter|counter_add|optimizer|[0-9]' "$tmp/rows" ||
		{ cat "$tmp/rows"; fail "profile_table.py lost the 'step counter' row"; }
	grep -q '^total|||7|' "$tmp/rows" || { cat "$tmp/rows"; fail "profile_table.py: no total row of 7 steps (8, less the warm-up)"; }
	echo "ok: bench/profile_table.py reads all $got rows, 'step counter' too"
fi

# a pipeline of 2 stages on the profiled device, 4 micro-batches: each
# layer's forward a row of 7 x 4 calls, and the micro-batches' entries
# (their dropout and micro-step counters, 5 counter_adds a step) are "step
# counter" rows (before session 40 "(unlabelled) counter_add forward")
# shellcheck disable=SC2086
"$kiln" train "$cfg" --profile $short layer.fc2.stage=1 \
	pipeline.micro_batches=4 "run.out_dir=$tmp/p" >"$tmp/p.out" 2>"$tmp/p.err" ||
	{ cat "$tmp/p.err"; fail "kiln train --profile, 2 stages"; }
grep -q '^(unlabelled)' "$tmp/p/profile.txt" && { cat "$tmp/p/profile.txt"; fail "2 stages: an (unlabelled) row"; }
# calls LAYER OP PASS: the row's calls
calls() { awk -v l="$1" -v o="$2" -v p="$3" '$1 == l && $2 == o && $3 == p { print $4 }' "$tmp/p/profile.txt"; }
for row in "fc1 gemm forward 28" "fc3 gemm forward 28" "fc1 gemm backward 28" \
	"step counter counter_add forward 35"; do
	set -- $row
	if [ "$1" = step ]; then
		got=$(awk '/^step counter +counter_add +forward / { print $5 }' "$tmp/p/profile.txt")
		want=$5
	else
		got=$(calls "$1" "$2" "$3")
		want=$4
	fi
	[ "$got" = "$want" ] || { cat "$tmp/p/profile.txt"; fail "2 stages: the row '$row' has ${got:-no} calls"; }
done
echo "ok: 2 stages: both stages' ops timed, the micro-batches' counters labelled"

# a resumed run's trace numbers its steps as metrics.jsonl does: from the
# checkpoint's step + 1 (before session 40 from 1)
# shellcheck disable=SC2086
"$kiln" train "$cfg" --profile --resume $short train.max_steps=11 "run.out_dir=$tmp/a" \
	>"$tmp/r.out" 2>"$tmp/r.err" || { cat "$tmp/r.err"; fail "kiln train --profile --resume"; }
steps=$(grep -o '"name":"step [0-9]*","cat":"step"' "$tmp/a/trace.json" | tr -dc '0-9\n' | tr '\n' ' ')
[ "$steps" = "9 10 11 " ] || fail "the resumed run's trace names its steps '$steps', expected 9 10 11"
args=$(grep -o '"args":{"step":[0-9]*' "$tmp/a/trace.json" | sort -u -t: -k3n | tr -dc '0-9\n' | tr '\n' ' ')
[ "$args" = "9 10 11 " ] || fail "the resumed run's trace events have steps '$args', expected 9 10 11"
grep -q 'trace of steps 9\.\.11 in ' "$tmp/r.err" || { cat "$tmp/r.err"; fail "no 'trace of steps 9..11' line"; }
echo "ok: a run resumed at step 8 traces steps 9..11"

# shellcheck disable=SC2086
"$kiln" train --profile "$cfg" $short "run.out_dir=$tmp/b" >"$tmp/b.out" 2>"$tmp/b.err" ||
	{ cat "$tmp/b.err"; fail "kiln train --profile FILE"; }
[ -s "$tmp/b/profile.txt" ] || fail "--profile before the file: no profile.txt"
# shellcheck disable=SC2086
"$kiln" train "$cfg" $short "run.out_dir=$tmp/c" >"$tmp/c.out" 2>"$tmp/c.err" ||
	{ cat "$tmp/c.err"; fail "kiln train without --profile"; }
[ ! -e "$tmp/c/profile.txt" ] || fail "profile.txt written without --profile"
same_metrics plain "$tmp/c.out" profiled "$tmp/a.out"
echo "ok: --profile before the file; profiling changes no number (test_acc $(field test_acc "$tmp/c.out"))"
