#!/bin/sh
# bench/mlp_ops.sh - where the MLP's 2-thread step loses against its 1-thread
# one: kiln's profiler table (`kiln train --profile`: every op synchronised,
# its self wall time) of bench/mlp_bench.ini at 1 and 2 threads, with
# [run] fuse = 0 and 1, RUNS rounds interleaved; per (layer, op, pass) the
# smallest median microseconds a call over the rounds (the table's
# `median us`: a few preempted calls do not move it as they move the mean;
# the least disturbed round), the
# 2-thread time over the 1-thread one (1.0: the op gained nothing from the
# second thread, 0.5: it halved), and the step.  A quiet machine's figures
# say which ops share a step badly; on a loaded one every op is slower on
# 2 threads (a partner descheduled at each barrier).
#
# Usage: sh bench/mlp_ops.sh [--runs N] [--steps S]
#   --runs N   rounds (default 3)   --steps S  steps a run (default 200)
# From the top of the build tree.  Environment: KILN (./kiln), FMNIST.
set -eu
RUNS=3 STEPS=200
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	*) echo "usage: $0 [--runs N] [--steps S]" >&2; exit 2 ;;
	esac
done
HERE=$(dirname "$0")
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-python3}
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
. "$HERE/common.sh"
real_kiln
bench_tmpdir mlp-ops

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$RUNS"); do
	for t in 1 2; do
		for f in 0 1; do
			"$KILN" train "$HERE/mlp_bench.ini" --profile data.path="$FMNIST" \
				run.threads="$t" run.fuse="$f" run.profile_steps=0 train.eval=0 \
				train.max_steps="$STEPS" run.out_dir="$TMP/p.$t.$f.$r" >/dev/null 2>"$TMP/err" ||
				{ cat "$TMP/err" >&2; exit 1; }
		done
	done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo "MLP ops (bench/mlp_bench.ini, batch 128), $STEPS steps, $RUNS rounds; load before $load0, after $load1"
"$PYTHON" - "$TMP" "$HERE" <<'EOF'
import collections, glob, os, sys

sys.path.insert(0, sys.argv[2])
import profile_table  # every row, names with spaces ("step counter") too

d = collections.defaultdict(list)
for run in glob.glob(os.path.join(sys.argv[1], "p.*")):
    _, t, f, _ = os.path.basename(run).split(".")
    for r in profile_table.rows(os.path.join(run, "profile.txt")):
        # (layer, op, pass, calls, total, mean, %step, median, min): the
        # median; the total row's median is the median step
        k = "the whole step" if r[0] == "total" and not r[1] else " ".join(r[:3])
        d[(k, t, f)].append(r[7])
keys = sorted({k[0] for k in d}, key=lambda k: (k == "the whole step", -max(
    min(d.get((k, t, f), [0])) for t in "12" for f in "01")))
print("| layer op pass | fuse 0: 1 thread | 2 threads | 2 / 1 | fuse 1: 1 thread | 2 threads | 2 / 1 |")
print("|---|---:|---:|---:|---:|---:|---:|")
for k in keys:
    cells = []
    for f in "01":
        a, b = (min(d[(k, t, f)]) if d.get((k, t, f)) else None for t in "12")
        cells += ["%.1f" % a if a is not None else "", "%.1f" % b if b is not None else "",
                  "%.2f" % (b / a) if a and b is not None else ""]
    print("| %s | %s |" % (k, " | ".join(cells)))
print("(microseconds a call, the smallest median over the rounds; every op synchronised)")
EOF
