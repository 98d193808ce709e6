#!/bin/sh
# tests/anchors_table.sh - bench/anchors_table.py's phase columns: from
# runs tagged with the phase probe (probe_before / probe_after, GFLOP/s a
# CPU-second, as bench/anchors.sh writes them) each run's flag ("ok",
# "slow phase", "phase changed", "no probe", "-" when it failed), the
# phase-matched ratio (the median of kiln / row over the repetitions whose
# four probes agree within the threshold) and the probe-normalised one; the
# raw columns unchanged; without any probe the table as it was before them.
# bench/anchors.sh's side with stand-ins for kiln, PyTorch and the probe's
# GEMM: a probe before each benchmark's first run, one after every run (the
# next run's before), a failed probe null, --no-probe none, a malformed
# --phase-threshold refused.
name=anchors_table
. "$(dirname "$0")/lib.sh"
need_python3 "(bench/anchors_table.py)"
table="$srcdir/bench/anchors_table.py"

# kiln, t2-eager-passive, t113-passive; 3 repetitions; the fastest probe 100
#   rep 1: all three ok
#   rep 2: kiln and t113 in the slow phase (probes 65-67), t2 at 100
#   rep 3: kiln and t2 ok, t113's probes 99 then 60 (the phase changed)
#   rep 4: t113 only, failed (its probes 95, 96: "-")
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
	printf '{"row": "t113-passive", "rep": 4, "run_wall_s": 2.0, "run_samples": 0, "probe_before": 95, "probe_after": 96, "failed": "exit 1: x"}\n'
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
expect 'PyTorch 1.13, `OMP' 'phase' 'ok, slow phase, phase changed, -'
expect 'PyTorch 1.13, `OMP' 'runs' '35,000, 23,000, 30,000, failed'
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
grep -q '^  - the same, phase-matched (repetitions): 2.00x (2 of 3); probe-normalised: 1.91x$' "$tmp/out" ||
	fail "no phase-matched 2.x summary line: $(cat "$tmp/out")"
grep -q '^  - the same, phase-matched (repetitions): 2.00x (2 of 3); probe-normalised: 2.03x$' "$tmp/out" ||
	fail "no phase-matched 1.13 summary line: $(cat "$tmp/out")"
echo "ok: flags, the phase-matched and probe-normalised ratios ($checks cells)"

# a wider threshold: kiln's and t113's rep 2 (100 / 65.5 = 1.53) is no
# longer slow at 60%; t113's rep 3 (99 / 60 = 1.65) still changed; every
# repetition of t2 now matched (rep 2's probes 65-100: 1.54)
"$py" "$table" --phase-threshold 60 mlp "$tmp/mlp.jsonl" "load;" >"$tmp/out" ||
	fail "anchors_table.py --phase-threshold 60 failed"
expect '\*\*kiln' 'phase' 'ok, ok, ok'
expect 'PyTorch 1.13, `OMP' 'phase' 'ok, ok, phase changed, -'
expect 'PyTorch 2.x eager, `OMP' 'kiln / row, phase-matched' '1.94x (3 of 3)'
echo "ok: --phase-threshold 60"

# a malformed threshold: refused by name (exit 2), not a traceback
"$py" "$table" --phase-threshold 1.2.3 mlp "$tmp/mlp.jsonl" "load;" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && grep -q "phase-threshold is a percentage.*'1.2.3'" "$tmp/err" ||
	fail "anchors_table.py --phase-threshold 1.2.3: exit $rc, $(cat "$tmp/err")"
echo "ok: --phase-threshold 1.2.3 refused"

# no probes in any line (files from before the probe, or --no-probe: null)
# and a failed run: the table as it was before the probe, no phase column
# nor phase lines
{
	printf '{"row": "kiln", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "train_samples_per_s": 60000}\n'
	printf '{"row": "t113-passive", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "probe_before": null, "probe_after": null, "train_samples_per_s": 30000}\n'
	printf '{"row": "t113-passive", "rep": 2, "run_wall_s": 2.0, "run_samples": 0, "probe_before": null, "probe_after": null, "failed": "exit 1: x"}\n'
} >"$tmp/old.jsonl"
"$py" "$table" mlp "$tmp/old.jsonl" "load;" >"$tmp/out" || fail "anchors_table.py on lines without probes failed"
want='| row | samples/s | runs | kiln / row | compile s (run 1; median) | GFLOP/s (% of GEMM peak) |'
[ "$(grep '^| row |' "$tmp/out")" = "$want" ] || fail "without probes the header changed: $(cat "$tmp/out")"
[ "$(grep '^| PyTorch 1.13, `OMP' "$tmp/out")" = '| PyTorch 1.13, `OMP_WAIT_POLICY=PASSIVE` | 30,000 | 30,000, failed | 2.00x |  | 72.2 |' ] ||
	fail "without probes the 1.13 row changed: $(cat "$tmp/out")"
! grep -qi 'phase\|probe' "$tmp/out" || fail "without probes, phase lines: $(cat "$tmp/out")"
grep -q '^- kiln / PyTorch 1.13 best (t113-passive): \*\*2.00x\*\* (target >= 1.7x)$' "$tmp/out" ||
	fail "without probes, no raw 1.13 summary line: $(cat "$tmp/out")"
echo "ok: runs without probes, a failed run: the old table"

# bench/anchors.sh's probes, with stand-ins: kiln (its metrics.jsonl for the
# steady rate; its second call fails), PyTorch 2.x's python (the import
# check passes; a run prints a rate), bench/gemm_peak (with --n, the phase
# probe, the next of 101 .. 110 as gflops_per_cpu_s, that + 0.5 as gflops;
# the 7th fails).  Rows kiln and t2-eager-passive, 2 repetitions of mlp
# and cnn-nchw: 10 probes, each run's after the next run's before, a
# fresh one before each benchmark's first run.
stub="$tmp/stub"
mkdir -p "$stub/venv/bin"
cat >"$stub/gemm" <<'EOF_GEMM'
#!/bin/sh
case " $* " in *" --n "*) ;; *) echo '{"gflops": 150.0}'; exit 0 ;; esac
echo probe >>"$STUB/probes"
n=$(wc -l <"$STUB/probes")
[ "$n" != 7 ] || exit 1
echo "{\"gflops\": $((100 + n)).5, \"gflops_per_cpu_s\": $((100 + n))}"
EOF_GEMM
cat >"$stub/kiln" <<'EOF_KILN'
#!/bin/sh
echo call >>"$STUB/kiln_calls"
[ "$(wc -l <"$STUB/kiln_calls")" != 2 ] || { echo "kiln stand-in: failing" >&2; exit 1; }
for a in "$@"; do case $a in run.out_dir=*) d=${a#run.out_dir=} ;; esac; done
mkdir -p "$d"
printf '{"event": "train", "step": 20, "time": 1.0}\n{"event": "train", "step": 40, "time": 2.0}\n' >"$d/metrics.jsonl"
echo '{"train_samples_per_s": 2000.0}'
EOF_KILN
cat >"$stub/venv/bin/python" <<'EOF_PY'
#!/bin/sh
[ "$1" != -c ] || exit 0
echo '{"train_samples_per_s": 1000.0}'
EOF_PY
chmod +x "$stub/gemm" "$stub/kiln" "$stub/venv/bin/python"
# anchors ARGS...: bench/anchors.sh with the stand-ins, its lines in $tmp/res
anchors() {
	rm -rf "$tmp/res" "$stub/probes" "$stub/kiln_calls"
	: >"$stub/probes"
	: >"$stub/kiln_calls"
	env STUB="$stub" TMPDIR="$tmp" KILN="$stub/kiln" KILN_VENV="$stub/venv" GEMM="$stub/gemm" \
		PYTHON113="$py" sh "$srcdir/bench/anchors.sh" --rows kiln,t2-eager-passive --out "$tmp/res" "$@" \
		>"$tmp/out" 2>"$tmp/err"
}
# each line of $tmp/res/BENCH.jsonl: row rep before after wall_before wall_after [failed]
probe_lines() {
	"$py" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["row"], r["rep"], *[r.get("probe_" + k) for k in ("before", "after", "wall_before", "wall_after")],
          *(["failed"] if "failed" in r else []))' "$tmp/res/$1.jsonl"
}
anchors --runs 2 --bench mlp,cnn-nchw || fail "anchors.sh with stand-ins failed: $(cat "$tmp/err")"
[ "$(wc -l <"$stub/probes")" = 10 ] || fail "$(wc -l <"$stub/probes") probes, expected 10 (8 runs, 2 benchmarks)"
[ "$(probe_lines mlp)" = "kiln 1 101 102 101.5 102.5
t2-eager-passive 1 102 103 102.5 103.5
kiln 2 103 104 103.5 104.5 failed
t2-eager-passive 2 104 105 104.5 105.5" ] || fail "mlp's probes: $(probe_lines mlp)"
[ "$(probe_lines cnn-nchw)" = "kiln 1 106 None 106.5 None
t2-eager-passive 1 None 108 None 108.5
kiln 2 108 109 108.5 109.5
t2-eager-passive 2 109 110 109.5 110.5" ] || fail "cnn-nchw's probes: $(probe_lines cnn-nchw)"
grep -q '^| \*\*kiln\*\* | 2,560 | 2,560, failed |.* | ok, - |' "$tmp/out" ||
	fail "anchors.sh's mlp table: no kiln row flagged 'ok, -': $(cat "$tmp/out")"
echo "ok: anchors.sh's probes chained, a failed probe null, a failed run probed"

anchors --runs 1 --bench mlp --no-probe || fail "anchors.sh --no-probe failed: $(cat "$tmp/err")"
[ ! -s "$stub/probes" ] || fail "--no-probe ran $(wc -l <"$stub/probes") probes"
[ "$(probe_lines mlp)" = "kiln 1 None None None None
t2-eager-passive 1 None None None None" ] || fail "--no-probe's lines: $(probe_lines mlp)"
! grep -q 'phase' "$tmp/out" || fail "--no-probe's table has phase columns: $(cat "$tmp/out")"
echo "ok: --no-probe"

for v in 1.2.3 . 1x ""; do
	anchors --runs 1 --bench mlp --phase-threshold "$v" && fail "anchors.sh --phase-threshold '$v' ran"
	rc=$?
	[ "$rc" = 2 ] && grep -q "phase-threshold is a percentage.*'$v'" "$tmp/err" ||
		fail "anchors.sh --phase-threshold '$v': exit $rc, $(cat "$tmp/err")"
	[ ! -s "$stub/probes" ] || fail "anchors.sh --phase-threshold '$v' ran probes"
done
echo "ok: a malformed --phase-threshold refused before any run"
