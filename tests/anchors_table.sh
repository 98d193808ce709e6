#!/bin/sh
# tests/anchors_table.sh - bench/anchors_table.py's phase columns: from
# runs tagged with the phase probe (probe_before / probe_after, GFLOP/s a
# CPU-second, as bench/anchors.sh writes them) each run's flag ("ok",
# "slow phase", "phase changed", "no probe"), the phase-matched ratio (the
# median of kiln / row over the repetitions whose four probes agree within
# the threshold) and the probe-normalised one; the raw columns unchanged.
name=anchors_table
. "$(dirname "$0")/lib.sh"
need_python3 "(bench/anchors_table.py)"
table="$srcdir/bench/anchors_table.py"

# kiln, t2-eager-passive, t113-passive; 3 repetitions; the fastest probe 100
#   rep 1: all three ok
#   rep 2: kiln and t113 in the slow phase (probes 65-67), t2 at 100
#   rep 3: kiln and t2 ok, t113's probes 99 then 60 (the phase changed)
run() { # ROW REP RATE BEFORE AFTER
	printf '{"row": "%s", "rep": %d, "run_wall_s": 2.0, "run_samples": 0, "probe_before": %s, "probe_after": %s, "train_samples_per_s": %s}\n' \
		"$1" "$2" "$4" "$5" "$3"
}
{
	run kiln 1 70000 100 98
	run t2-eager-passive 1 36000 98 97
	run t113-passive 1 35000 99 100
	run kiln 2 46000 66 65
	run t2-eager-passive 2 40000 100 100
	run t113-passive 2 23000 66 67
	run kiln 3 72000 100 99
	run t2-eager-passive 3 35000 99 99
	run t113-passive 3 30000 99 60
} >"$tmp/mlp.jsonl"
"$py" "$table" mlp "$tmp/mlp.jsonl" "load 1 1 1 before;" 150 >"$tmp/out" ||
	fail "anchors_table.py failed: $(cat "$tmp/out")"

# row LABEL_PREFIX: the row's cells, one a line (the row's label first)
cells() {
	grep "^| $1" "$tmp/out" | head -n 1 | sed 's/^| //; s/ |$//; s/ | /\n/g'
}
# col HEADER_PREFIX: the index (1 = the first column) of the header's cell
col() {
	grep '^| row |' "$tmp/out" | sed 's/^| //; s/ |$//; s/ | /\n/g' | grep -n "^$1" |
		head -n 1 | cut -d: -f1
}
# expect ROW HEADER VALUE
expect() {
	c=$(col "$2")
	[ -n "$c" ] || fail "no column '$2' in: $(grep '^| row |' "$tmp/out")"
	v=$(cells "$1" | sed -n "${c}p")
	[ "$v" = "$3" ] || fail "$1, '$2': '$v', expected '$3'; the table:
$(cat "$tmp/out")"
	checks=$((checks + 1))
}
expect '\*\*kiln' 'phase' 'ok, slow phase, ok'
expect '\*\*kiln' 'probe GFLOP/s' '100.0/98.0, 66.0/65.0, 100.0/99.0'
expect 'PyTorch 2.x eager, `OMP' 'phase' 'ok, ok, ok'
expect 'PyTorch 1.13, `OMP' 'phase' 'ok, slow phase, phase changed'
# raw: kiln's median 70,000 over the row's (36,000; 30,000), as before
expect 'PyTorch 2.x eager, `OMP' 'kiln / row$' '1.94x'
expect 'PyTorch 1.13, `OMP' 'kiln / row$' '2.33x'
expect 'PyTorch 1.13, `OMP' 'samples/s' '30,000'
# matched: t2 reps 1 and 3 (70000/36000, 72000/35000: median 2.0008); rep 2
# has kiln slow and t2 fast.  t113: reps 1 and 2 (2.00, 2.00); rep 3 changed
expect 'PyTorch 2.x eager, `OMP' 'kiln / row, phase-matched' '2.00x (2 of 3)'
expect 'PyTorch 1.13, `OMP' 'kiln / row, phase-matched' '2.00x (2 of 3)'
# normalised: kiln median(70000/99, 46000/65.5, 72000/99.5) = 707.07;
# t2 median(36000/97.5, 40000/100, 35000/99) = 369.23 -> 1.91x;
# t113 median(35000/99.5, 23000/66.5) = 348.81 (rep 3 left out) -> 2.03x
expect 'PyTorch 2.x eager, `OMP' 'kiln / row, probe-normalised' '1.91x'
expect 'PyTorch 1.13, `OMP' 'kiln / row, probe-normalised' '2.03x'
grep -q '^- kiln / best of PyTorch 2.x eager and compile (t2-eager-passive): \*\*1.94x\*\*' "$tmp/out" ||
	fail "the raw summary line changed: $(cat "$tmp/out")"
grep -q '^  - the same, phase-matched: \*\*2.00x\*\* (2 of 3 repetitions); probe-normalised: 2.03x$' "$tmp/out" ||
	fail "no phase-matched 1.13 summary line: $(cat "$tmp/out")"
echo "ok: flags, the phase-matched and probe-normalised ratios ($checks cells)"

# a wider threshold: kiln's and t113's rep 2 (100 / 65.5 = 1.53) is no
# longer slow at 60%; t113's rep 3 (99 / 60 = 1.65) still changed; every
# repetition of t2 now matched (rep 2's probes 65-100: 1.54)
"$py" "$table" --phase-threshold 60 mlp "$tmp/mlp.jsonl" "load;" >"$tmp/out" ||
	fail "anchors_table.py --phase-threshold 60 failed"
expect '\*\*kiln' 'phase' 'ok, ok, ok'
expect 'PyTorch 1.13, `OMP' 'phase' 'ok, ok, phase changed'
expect 'PyTorch 2.x eager, `OMP' 'kiln / row, phase-matched' '1.94x (3 of 3)'
echo "ok: --phase-threshold 60"

# lines without probes (an older run, or --no-probe: null) and a failed
# run: "no probe", no matched pair, the raw ratio as before
{
	printf '{"row": "kiln", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "train_samples_per_s": 60000}\n'
	printf '{"row": "t113-passive", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "probe_before": null, "probe_after": null, "train_samples_per_s": 30000}\n'
	printf '{"row": "t113-passive", "rep": 2, "run_wall_s": 2.0, "run_samples": 0, "probe_before": 90, "probe_after": 91, "failed": "exit 1: x"}\n'
} >"$tmp/old.jsonl"
"$py" "$table" mlp "$tmp/old.jsonl" "load;" >"$tmp/out" || fail "anchors_table.py on lines without probes failed"
expect '\*\*kiln' 'phase' 'no probe'
expect 'PyTorch 1.13, `OMP' 'phase' 'no probe, ok'
expect 'PyTorch 1.13, `OMP' 'kiln / row$' '2.00x'
expect 'PyTorch 1.13, `OMP' 'kiln / row, phase-matched' 'none (0 of 1)'
expect 'PyTorch 1.13, `OMP' 'kiln / row, probe-normalised' 'n/a'
echo "ok: runs without probes, a failed run"
