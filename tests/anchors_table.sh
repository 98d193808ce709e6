#!/bin/sh
# tests/anchors_table.sh - the placement probe of bench/anchors.sh (and
# bench/common.sh's place_before / place_after) and bench/anchors_table.py's
# placement columns.
#  1. anchors_table.py on runs tagged as anchors.sh tags them (c2c_before,
#     c2c_after in ns, placement): each run's probes and placement ("-" when
#     it failed), each row's median over its fast runs with the count
#     ("71,000 (2 of 4 fast)"), kiln / row over fast runs only, the
#     summary's fast-only lines (the best PyTorch 2.x row by fast runs,
#     which need not be the best over all runs; 1.13; Lightning's); the raw
#     columns unchanged; without any placement the table as before them;
#     session 48's --phase-threshold refused (exit 2, "removed in session 49").
#  2. anchors.sh with stand-ins for kiln, PyTorch and bench/c2c_latency
#     (printing chosen ns): a probe before each benchmark's first run and
#     one after every run (the next run's before); "fast" only when both are
#     under 200 ns (199.9 is, 200 is not), "slow" when neither, "mixed", a
#     failed probe null and "no probe"; the table's fast medians from them;
#     --no-probe runs none and prints the old table.
#  3. the real bench/c2c_latency: --cpus 0,0 (and 4096,4096, outside any
#     mask) exit 2 before the affinity check; under `taskset -c 0` (CPU 1
#     not in its affinity mask): exit 1 naming the CPU; anchors.sh under it
#     marks every run "no probe", says so once, and finishes its table.
#     Without taskset, or where `taskset -c 0` is not allowed, the taskset
#     checks are skipped (said so; parts 1-2 have passed).
name=anchors_table
. "$(dirname "$0")/lib.sh"
need_python3 "(bench/anchors_table.py)"
table="$srcdir/bench/anchors_table.py"

# ---- 1. the table from tagged runs ---------------------------------------
# run ROW REP RATE BEFORE AFTER PLACEMENT [WALL]: one run's line (run_samples
# 60000, set-up 0.1 s; WALL: JSON members for the wall time, default 2 s,
# and the fit)
run() {
	printf '{"row": "%s", "rep": %d, %s, "run_samples": 60000, "setup_s": 0.1, "c2c_before": %s, "c2c_after": %s, "placement": "%s", "c2c_fast_ns": 200, "train_samples_per_s": %s}\n' \
		"$1" "$2" "${7:-\"run_wall_s\": 2.0}" "$4" "$5" "$6" "$3"
}
# kiln: fast 70,000 and 72,000 (median 71,000), slow 46,000, mixed 60,000
# (all four: 65,000); its whole-run rates 60,000, 40,000, 62,500, 50,000
# t2-eager-passive: 36,000, 40,000, 38,000 fast, 35,000 slow (all 37,000)
# t2-eager-omp1: 39,000 slow twice, 30,000 fast: the best over all runs,
#   not over fast runs (passive's 38,000)
# t113-passive: 35,000 fast, 23,000 slow, 30,000 mixed, a failed run
# t2-lightning: 20,000 and 25,000 fast, 30,000 with no probe (null)
{
	run kiln 1 70000 60 70 fast '"run_wall_s": 1.0, "fit_s": 0.8'
	run kiln 2 46000 330 340 slow '"run_wall_s": 1.5, "fit_s": 1.2'
	run kiln 3 72000 80 90 fast '"run_wall_s": 0.96, "fit_s": 0.8'
	run kiln 4 60000 90 320 mixed '"run_wall_s": 1.2, "fit_s": 1.0'
	run t2-eager-passive 1 36000 70 80 fast
	run t2-eager-passive 2 40000 60 65 fast
	run t2-eager-passive 3 35000 310 305 slow
	run t2-eager-passive 4 38000 75 62 fast
	run t2-eager-omp1 1 39000 350 320 slow
	run t2-eager-omp1 2 39000 330 300 slow
	run t2-eager-omp1 3 30000 100 110 fast
	run t2-lightning 1 20000 55 60 fast
	run t2-lightning 2 30000 null null "no probe"
	run t2-lightning 3 25000 61 64 fast
	run t113-passive 1 35000 65 66 fast
	run t113-passive 2 23000 301 330 slow
	run t113-passive 3 30000 99 600 mixed
	printf '{"row": "t113-passive", "rep": 4, "run_wall_s": 2.0, "run_samples": 0, "c2c_before": 50, "c2c_after": 51, "placement": "fast", "c2c_fast_ns": 200, "failed": "exit 1: x"}\n'
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
# has LINE: the output has this exact line
has() {
	grep -qxF -- "$1" "$tmp/out" || fail "no line '$1' in:
$(cat "$tmp/out")"
	checks=$((checks + 1))
}
checks=0
K='\*\*kiln' T2='PyTorch 2.x eager, `OMP' T1='PyTorch 2.x eager, 1' T113='PyTorch 1.13, `OMP' L='Lightning'
expect "$K" 'c2c ns' '60/70, 330/340, 80/90, 90/320'
expect "$K" 'placement' 'fast, slow, fast, mixed'
expect "$K" 'samples/s, fast runs' '71,000 (2 of 4 fast)'
expect "$K" 'kiln / row, fast runs' ''
expect "$T2" 'samples/s, fast runs' '38,000 (3 of 4 fast)'
expect "$T1" 'samples/s, fast runs' '30,000 (1 of 3 fast)'
expect "$T113" 'placement' 'fast, slow, mixed, -'
expect "$T113" 'samples/s, fast runs' '35,000 (1 of 3 fast)'
expect "$L" 'c2c ns' '55/60, -/-, 61/64'
expect "$L" 'placement' 'fast, no probe, fast'
expect "$L" 'samples/s, fast runs' '22,500 (2 of 3 fast)'
# fast: kiln's 71,000 over 38,000, 30,000, 35,000, 22,500
expect "$T2" 'kiln / row, fast runs' '1.87x'
expect "$T1" 'kiln / row, fast runs' '2.37x'
expect "$T113" 'kiln / row, fast runs' '2.03x'
expect "$L" 'kiln / row, fast runs' '3.16x'
# all runs, as before: 65,000 over 37,000, 39,000, 30,000
expect "$K" 'samples/s' '65,000'
expect "$T2" 'kiln / row$' '1.76x'
expect "$T1" 'kiln / row$' '1.67x'
expect "$T113" 'kiln / row$' '2.17x'
expect "$T113" 'runs' '35,000, 23,000, 30,000, failed'
# the summary: the best 2.x over all runs is omp1, over fast runs passive
has '- kiln / best of PyTorch 2.x eager and compile (t2-eager-omp1): **1.67x** (target >= 1.3x)'
has '  - fast runs only: kiln 71,000 (2 of 4 fast) / t2-eager-passive 38,000 (3 of 4 fast): **1.87x**'
has '- kiln / PyTorch 1.13 best (t113-passive): **2.17x** (target >= 1.7x)'
has '  - fast runs only: kiln 71,000 (2 of 4 fast) / t113-passive 35,000 (1 of 3 fast): **2.03x**'
# Lightning over all runs: kiln's median run by whole rate (the lower
# middle of 40,000, 50,000, 60,000, 62,500: run 4) / 25,000; over fast
# runs: run 1 (60,000; fit 75,000) / 22,500
grep -q '^- kiln whole run (samples / the process.s wall time, start-up included: 50,000, kiln.s median run by this rate: run 4) / Lightning.s whole fit: \*\*2.00x\*\*' "$tmp/out" ||
	fail "the Lightning line changed: $(cat "$tmp/out")"
has "  - fast runs only: kiln's median fast run by whole rate (run 1) / Lightning's fit 22,500 (2 of 3 fast): whole run **2.67x**, fit **3.33x**"
grep -q '"fast" when both are under 200 ns' "$tmp/out" || fail "no note of the threshold: $(cat "$tmp/out")"
echo "ok: probes, placements, fast medians and ratios, the summary's fast lines ($checks checks)"

# no placement in any line (files from before the probe, session 48's GEMM
# probe, --no-probe) and a failed run: the table as it was before the
# probe, no placement column nor lines
{
	printf '{"row": "kiln", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "train_samples_per_s": 60000}\n'
	printf '{"row": "t113-passive", "rep": 1, "run_wall_s": 2.0, "run_samples": 0, "probe_before": 90.1, "probe_after": 91.0, "train_samples_per_s": 30000}\n'
	printf '{"row": "t113-passive", "rep": 2, "run_wall_s": 2.0, "run_samples": 0, "probe_before": null, "probe_after": null, "failed": "exit 1: x"}\n'
} >"$tmp/old.jsonl"
"$py" "$table" mlp "$tmp/old.jsonl" "load;" >"$tmp/out" || fail "anchors_table.py on lines without probes failed"
want='| row | samples/s | runs | kiln / row | compile s (run 1; median) | GFLOP/s (% of GEMM peak) |'
[ "$(grep '^| row |' "$tmp/out")" = "$want" ] || fail "without probes the header changed: $(cat "$tmp/out")"
[ "$(grep '^| PyTorch 1.13, `OMP' "$tmp/out")" = '| PyTorch 1.13, `OMP_WAIT_POLICY=PASSIVE` | 30,000 | 30,000, failed | 2.00x |  | 72.2 |' ] ||
	fail "without probes the 1.13 row changed: $(cat "$tmp/out")"
! grep -qi 'fast\|placement\|probe' "$tmp/out" || fail "without probes, placement lines: $(cat "$tmp/out")"
grep -q '^- kiln / PyTorch 1.13 best (t113-passive): \*\*2.00x\*\* (target >= 1.7x)$' "$tmp/out" ||
	fail "without probes, no raw 1.13 summary line: $(cat "$tmp/out")"
echo "ok: runs without placement, a failed run: the old table"
# session 48's docs read kept files again with --phase-threshold, gone since
# session 49: refused by name with exit 2, not a traceback
"$py" "$table" --phase-threshold 10 mlp "$tmp/old.jsonl" "load;" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" = 2 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" = 1 ] &&
	grep -q '^anchors_table.py: --phase-threshold was removed in session 49: ' "$tmp/err" ||
	fail "anchors_table.py --phase-threshold 10: exit $rc, $(cat "$tmp/out" "$tmp/err")"
echo "ok: --phase-threshold: exit 2, 'removed in session 49'"

# ---- 2. bench/anchors.sh with stand-ins ----------------------------------
# kiln: its metrics.jsonl for the steady rate, steps 20 to 40 (128 a step)
# in N/2 s at its Nth call (5,120, 2,560, 1,707, 1,280 samples/s; the second
# call fails); PyTorch 2.x's python: the import check passes, its Nth run
# prints N x 1000; bench/c2c_latency: its Nth call prints the Nth of
# $STUB/ns ("fail": a message and exit 1); bench/gemm_peak: the GEMM peak.
# Rows kiln and t2-eager-passive, 2 repetitions of mlp and cnn-nchw: 10
# probes, each run's after the next run's before, a fresh one before each
# benchmark's first run.
stub="$tmp/stub"
mkdir -p "$stub/venv/bin"
cat >"$stub/c2c" <<'EOF_C2C'
#!/bin/sh
[ "$1 $2" = "--rounds 1" ] || { echo "c2c stand-in: called with $*" >&2; exit 2; }
echo call >>"$STUB/c2c_calls"
v=$(sed -n "$(wc -l <"$STUB/c2c_calls")p" "$STUB/ns")
[ "$v" != fail ] || { echo "c2c stand-in: failing" >&2; exit 1; }
echo "round 1: $v ns a round trip, CPU 0 <-> 1"
echo "{\"cpus\": [0, 1], \"iters\": 100000, \"rounds\": 1, \"round_trip_ns_median\": $v, \"round_trip_ns_min\": $v, \"round_trip_ns_max\": $v}"
EOF_C2C
cat >"$stub/gemm" <<'EOF_GEMM'
#!/bin/sh
echo '{"gflops": 150.0}'
EOF_GEMM
cat >"$stub/kiln" <<'EOF_KILN'
#!/bin/sh
echo call >>"$STUB/kiln_calls"
n=$(wc -l <"$STUB/kiln_calls")
[ "$n" != 2 ] || { echo "kiln stand-in: failing" >&2; exit 1; }
for a in "$@"; do case $a in run.out_dir=*) d=${a#run.out_dir=} ;; esac; done
mkdir -p "$d"
printf '{"event": "train", "step": 20, "time": 1.0}\n{"event": "train", "step": 40, "time": %s}\n' \
	"$(awk -v n="$n" 'BEGIN { print 1 + n / 2 }')" >"$d/metrics.jsonl"
echo '{"train_samples_per_s": 2000.0}'
EOF_KILN
cat >"$stub/venv/bin/python" <<'EOF_PY'
#!/bin/sh
[ "$1" != -c ] || exit 0
echo call >>"$STUB/py_calls"
echo "{\"train_samples_per_s\": $(($(wc -l <"$STUB/py_calls") * 1000)).0}"
EOF_PY
chmod +x "$stub/c2c" "$stub/gemm" "$stub/kiln" "$stub/venv/bin/python"
# anchors C2C ARGS...: bench/anchors.sh with the stand-ins and the probe
# C2C, its lines in $tmp/res (run under $ON: e.g. taskset -c 0)
ON=
anchors() {
	c2c=$1
	shift
	rm -rf "$tmp/res"
	for f in c2c_calls kiln_calls py_calls; do : >"$stub/$f"; done
	$ON env STUB="$stub" TMPDIR="$tmp" KILN="$stub/kiln" KILN_VENV="$stub/venv" GEMM="$stub/gemm" C2C="$c2c" \
		PYTHON113="$py" sh "$srcdir/bench/anchors.sh" --rows kiln,t2-eager-passive --out "$tmp/res" "$@" \
		>"$tmp/out" 2>"$tmp/err"
}
# each line of $tmp/res/BENCH.jsonl: row rep c2c_before c2c_after placement [failed]
probe_lines() {
	"$py" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["row"], r["rep"], r.get("c2c_before"), r.get("c2c_after"), repr(r.get("placement")),
          *(["failed"] if "failed" in r else []))' "$tmp/res/$1.jsonl"
}
# mlp: 60 150 199.9 200 340; cnn-nchw: 330 fail 90 95 120
printf '%s\n' 60 150 199.9 200 340 330 fail 90 95 120 >"$stub/ns"
anchors "$stub/c2c" --runs 2 --bench mlp,cnn-nchw || fail "anchors.sh with stand-ins failed: $(cat "$tmp/err")"
[ "$(wc -l <"$stub/c2c_calls")" = 10 ] || fail "$(wc -l <"$stub/c2c_calls") probes, expected 10 (8 runs, 2 benchmarks)"
[ "$(probe_lines mlp)" = "kiln 1 60 150 'fast'
t2-eager-passive 1 150 199.9 'fast'
kiln 2 199.9 200 'mixed' failed
t2-eager-passive 2 200 340 'slow'" ] || fail "mlp's probes: $(probe_lines mlp)"
[ "$(probe_lines cnn-nchw)" = "kiln 1 330 None 'no probe'
t2-eager-passive 1 None 90 'no probe'
kiln 2 90 95 'fast'
t2-eager-passive 2 95 120 'fast'" ] || fail "cnn-nchw's probes: $(probe_lines cnn-nchw)"
[ "$(grep -c 'no placement probe (.*c2c stand-in: failing)' "$tmp/err")" = 1 ] ||
	fail "the failed probe not reported once: $(cat "$tmp/err")"
# mlp: kiln 5,120 (fast; run 2 failed), t2 1,000 (fast), 2,000 (slow);
# cnn-nchw: kiln 1,707 (no probe), 1,280 (fast), t2 3,000, 4,000 (fast)
grep -q '^| \*\*kiln\*\* | 5,120 | 5,120, failed |.* | 60/150, 199.9/200 | fast, - | 5,120 (1 of 1 fast) |  |$' "$tmp/out" ||
	fail "anchors.sh's mlp table: kiln's row: $(cat "$tmp/out")"
grep -q '^| PyTorch 2.x eager, `OMP_WAIT_POLICY=PASSIVE` | 1,500 | 1,000, 2,000 | 3.41x |.* | 150/199.9, 200/340 | fast, slow | 1,000 (1 of 2 fast) | 5.12x |$' "$tmp/out" ||
	fail "anchors.sh's mlp table: t2's row: $(cat "$tmp/out")"
grep -q '^| PyTorch 2.x eager, `OMP_WAIT_POLICY=PASSIVE` | 3,500 | 3,000, 4,000 | 0.43x |.* | -/90, 95/120 | no probe, fast | 4,000 (1 of 2 fast) | 0.32x |$' "$tmp/out" ||
	fail "anchors.sh's cnn-nchw table: t2's row: $(cat "$tmp/out")"
echo "ok: anchors.sh's probes chained and classified (under 200 ns fast), a failed probe 'no probe', the fast medians"

anchors "$stub/c2c" --runs 1 --bench mlp --no-probe || fail "anchors.sh --no-probe failed: $(cat "$tmp/err")"
[ ! -s "$stub/c2c_calls" ] || fail "--no-probe ran $(wc -l <"$stub/c2c_calls") probes"
[ "$(probe_lines mlp)" = "kiln 1 None None None
t2-eager-passive 1 None None None" ] || fail "--no-probe's lines: $(probe_lines mlp)"
[ "$(grep '^| row |' "$tmp/out")" = '| row | samples/s | runs | kiln / row | compile s (run 1; median) | GFLOP/s (% of GEMM peak) |' ] &&
	[ "$(grep '^| PyTorch 2.x eager, `OMP' "$tmp/out")" = '| PyTorch 2.x eager, `OMP_WAIT_POLICY=PASSIVE` | 1,000 | 1,000 | 5.12x |  | 2.4 (2%) |' ] ||
	fail "--no-probe's table is not the old one: $(cat "$tmp/out")"
! grep -qi 'placement\|fast' "$tmp/out" || fail "--no-probe's table has placement lines: $(cat "$tmp/out")"
echo "ok: --no-probe: no probe, the old table"

# ---- 3. the real probe outside its CPUs ----------------------------------
c2c="$top_builddir/bench/c2c_latency"
[ -x "$c2c" ] || fail "$c2c not built"
# the same CPU twice is a bad argument (exit 2) before any affinity check:
# CPU 4096 is outside every mask (CPU_SETSIZE 1024)
for cpus in 0,0 4096,4096; do
	"$c2c" --cpus $cpus --rounds 1 >/dev/null 2>"$tmp/c2c.err"
	rc=$?
	[ "$rc" = 2 ] && grep -q 'two different CPUs' "$tmp/c2c.err" || fail "c2c_latency --cpus $cpus: exit $rc, $(cat "$tmp/c2c.err")"
done
echo "ok: c2c_latency --cpus 0,0 and 4096,4096: exit 2, two different CPUs"
command -v taskset >/dev/null || { echo "skip part 3: no taskset (util-linux)"; exit 0; }
taskset -c 0 true 2>/dev/null || { echo "skip part 3: taskset -c 0 not allowed here"; exit 0; }
taskset -c 0 "$c2c" --rounds 1 >"$tmp/c2c.out" 2>"$tmp/c2c.err"
rc=$?
[ "$rc" = 1 ] && grep -q "c2c_latency: CPU 1 is not in this process's affinity mask" "$tmp/c2c.err" &&
	[ ! -s "$tmp/c2c.out" ] || fail "taskset -c 0 c2c_latency: exit $rc, $(cat "$tmp/c2c.out" "$tmp/c2c.err")"
echo "ok: c2c_latency outside its affinity mask: exit 1 naming CPU 1"
# anchors.sh on CPU 0 alone with the real probe: every run "no probe", the
# reason said once, the table with its placement columns
ON="taskset -c 0"
anchors "$c2c" --runs 2 --bench mlp || fail "anchors.sh on CPU 0 alone failed: $(cat "$tmp/err")"
ON=
[ "$(probe_lines mlp)" = "kiln 1 None None 'no probe'
t2-eager-passive 1 None None 'no probe'
kiln 2 None None 'no probe' failed
t2-eager-passive 2 None None 'no probe'" ] || fail "anchors.sh on CPU 0 alone: $(probe_lines mlp)"
[ "$(grep -c "no placement probe (.*CPU 1 is not in this process's affinity mask" "$tmp/err")" = 1 ] ||
	fail "anchors.sh on CPU 0 alone: the reason not said once: $(cat "$tmp/err")"
grep -q '^| PyTorch 2.x eager, `OMP_WAIT_POLICY=PASSIVE` | 1,500 | 1,000, 2,000 | 3.41x |.* | -/-, -/- | no probe, no probe | n/a (0 of 2 fast) | n/a |$' "$tmp/out" ||
	fail "anchors.sh on CPU 0 alone: t2's row: $(cat "$tmp/out")"
echo "ok: anchors.sh on CPU 0 alone: every run 'no probe', the reason once, the table finished"
