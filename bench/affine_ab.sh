#!/bin/sh
# bench/affine_ab.sh - two builds' MLP epoch (bench/mlp_bench.ini, 2
# threads, train.eval=0) in interleaved pairs, each run between two
# placement probes (bench/c2c_latency --rounds 1; docs/PERFORMANCE.md,
# "Session 48: the VM's two speeds are the vCPUs' distance"), for the
# thread-affine updates of session 50.  A pair is "fast" when both its
# runs were between two fast probes (under 200 ns), "slow" when both were
# between two probes of 200-500 ns (the two-CCD placement; a probe past
# 500 ns is a busy CPU, the other thread waiting for a time slice),
# "mixed" otherwise.  It runs pairs (the order A B / B A by turns)
# until it has --slow N slow pairs or --max-s S seconds have passed, then
# prints every run and, per class, the pairs, each build's median
# samples/s and the median of B / A over the pairs.
# --profile runs both with `--profile` (every op synchronised: samples/s
# is not the benchmark's then) and prints per class the median of each
# row's "median us" and "min us" (the least over the run's steps: on a
# loaded machine the steps where both threads had their CPUs) for the ops
# the issue named: the SGD update, fc1's and fc2's GEMMs and ReLU backward.
#
# Usage: A=/path/to/old/kiln B=./kiln sh bench/affine_ab.sh [--slow N]
#            [--max-s S] [--profile]      (defaults: --slow 4 --max-s 600)
# AENV, BENV: VAR=VALUE words for A's and B's runs (one binary both ways:
#   A=./kiln B=./kiln AENV=KILN_CPU_AFFINE=0 BENV=KILN_CPU_AFFINE=1).
# Run from the top of the build tree (bench/c2c_latency built); the load
# average (1 min) is printed with each run.

set -eu
A=${A:?set A to the kiln of the build before}
B=${B:-./kiln}
SLOW=4 MAXS=600 PROF=
while [ $# -gt 0 ]; do
	case $1 in
	--slow) SLOW=$2; shift 2 ;;
	--max-s) MAXS=$2; shift 2 ;;
	--profile) PROF=--profile; shift ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/common.sh"
C2C=$(dirname "$0")/c2c_latency
[ -x "$C2C" ] || { echo "affine_ab.sh: build $C2C first (make bench/c2c_latency)" >&2; exit 2; }
bench_tmpdir affine-ab
ROWS=$TMP/rows

# one WHICH: a run of build WHICH between two probes, one line into ROWS:
# "WHICH samples/s c2c_before c2c_after placement load1 [op us...]"
one() {
	which=$1 bin=$A envw=${AENV:-}
	[ "$which" = B ] && bin=$B envw=${BENV:-}
	probe_cache "$bin"
	words=$(run_words "$bin")
	rm -rf "$TMP/o"
	place_before
	# shellcheck disable=SC2086 # the words of run_words
	env $envw $words train bench/mlp_bench.ini $PROF train.epochs=1 train.eval=0 run.out_dir="$TMP/o" \
		>"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
	place_after
	s=$(json_line <"$TMP/out" | field train_samples_per_s)
	ops=
	if [ -n "$PROF" ]; then
		for k in "optimizer sgd optimizer" "fc1 gemm forward" "fc1 gemm backward" \
			"fc1 relu_bwd backward" "fc2 gemm forward" "fc2 gemm backward" "fc2 relu_bwd backward"; do
			# shellcheck disable=SC2086 # three words
			set -- $k
			v=$(awk -v l="$1" -v o="$2" -v p="$3" '$2 == l && $3 == o && $4 == p { print $9 "/" $10; exit }' "$TMP/out" "$TMP/err")
			ops="$ops ${v:-0/0}"
		done
	fi
	echo "$which ${s:-0} $C2C_BEFORE $C2C_AFTER $PLACE $(cut -d' ' -f1 /proc/loadavg)$ops" | tee -a "$ROWS" >&2
}

# untimed runs of each (the tune cache, the probe cache)
for w in A B; do
	probe_cache "$([ $w = A ] && echo "$A" || echo "$B")"
	$(run_words "$([ $w = A ] && echo "$A" || echo "$B")") train bench/mlp_bench.ini train.max_steps=20 \
		train.eval=0 run.out_dir="$TMP/o" >/dev/null 2>&1 || true
done
t0=$(date +%s) r=0 slowpairs=0
place_fresh
while :; do
	r=$((r + 1))
	if [ $((r % 2)) -eq 1 ]; then one A; one B; else one B; one A; fi
	n=$(tail -n 2 "$ROWS" | awk '$5 == "slow" && $3 < 500 && $4 < 500' | wc -l)
	[ "$n" -ne 2 ] || slowpairs=$((slowpairs + 1))
	[ "$slowpairs" -lt "$SLOW" ] || break
	[ $(($(date +%s) - t0)) -lt "$MAXS" ] || break
done
"$PYTHON" - "$ROWS" "$PROF" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
prof = sys.argv[2] != ""
names = ["sgd", "fc1 fwd", "fc1 bwd", "fc1 relu_bwd", "fc2 fwd", "fc2 bwd", "fc2 relu_bwd"]
pairs = {}
# a slow run: both probes 200-500 ns (two CCDs); a probe past 500 ns is a
# busy CPU (the other thread waited for a time slice), not a placement
def ccd(r):
    try:
        return r[4] == "slow" and max(float(r[2]), float(r[3])) < 500
    except ValueError:
        return False
for i in range(0, len(rows) - 1, 2):
    a, b = rows[i], rows[i + 1]
    if a[0] == "B":
        a, b = b, a
    cls = "fast" if {a[4], b[4]} == {"fast"} else "slow" if all(ccd(r) for r in (a, b)) else "mixed"
    pairs.setdefault(cls, []).append((a, b))
loads = [float(r[5]) for r in rows]
print("runs %d, pairs %d, load (1 min) %.2f-%.2f" % (len(rows), len(rows) // 2, min(loads), max(loads)))
med = lambda v: statistics.median(v) if v else float("nan")
for cls in ("fast", "slow", "mixed"):
    if cls == "mixed":
        print("(slow: both runs of the pair between two probes of 200-500 ns; mixed: the rest)")
    ps = pairs.get(cls, [])
    if not ps:
        print("%-5s pairs 0" % cls)
        continue
    sa = [float(a[1]) for a, _ in ps]
    sb = [float(b[1]) for _, b in ps]
    ratio = [float(b[1]) / float(a[1]) for a, b in ps if float(a[1]) > 0]
    print("%-5s pairs %d: A %.0f (%.0f-%.0f)  B %.0f (%.0f-%.0f)  B/A median %.3f" %
          (cls, len(ps), med(sa), min(sa), max(sa), med(sb), min(sb), max(sb), med(ratio)))
    if prof:
        for k, nm in enumerate(names):
            va = [float(a[6 + k].split("/")[0]) for a, _ in ps]
            vb = [float(b[6 + k].split("/")[0]) for _, b in ps]
            ma = [float(a[6 + k].split("/")[1]) for a, _ in ps]
            mb = [float(b[6 + k].split("/")[1]) for _, b in ps]
            print("      %-13s median us  A %7.1f  B %7.1f   min us  A %7.1f  B %7.1f" %
                  (nm, med(va), med(vb), med(ma), med(mb)))
PY
