#!/bin/sh
# Pipeline checkpoints, session 13 (issue 21; docs/checkpoints.md "Stages
# on ranks"): this build (NEW) against another (MAIN, /work/main: session
# 12), interleaved run by run, on bench/pipe_ckpt_mem.sh's MLP (289,840
# floats, the whole parameters 1,159,360 bytes), 2 stages on 2 ranks:
#   best: 4 steps, an evaluation every 2, keep_best = 1, no other
#         checkpoint; rank 0's device peak over the run (the log line
#         "memory at the end of training: device peak B bytes over the
#         run"; allocations: the runs agree);
#   fail: from a checkpoint at step 2 to step 6, the write of ckpt-4.kiln
#         failing on rank 0 (its temporary file a link to /dev/full: a
#         full disk), [dist] timeout 60: the seconds until the job has
#         ended (`kiln launch --grace 60`; under mpirun with
#         [plugin.mpi] thread_level = multiple where kiln-mpi and mpirun
#         exist) and whether rank 1's error names the file.
# Medians of RUNS runs.
#
# Usage: bench/pipe_ckpt_fail.sh [RUNS]   (default 3)
# Environment: NEW (default ./kiln), MAIN (default /work/main/kiln),
# MAIN_PLUGINS (default /work/main/plugins/.libs).  Run from the top of
# the source tree.
set -eu
RUNS=${1:-3}
NEW=${NEW:-./kiln}
MAIN=${MAIN:-/work/main/kiln}
MAIN_PLUGINS=${MAIN_PLUGINS:-/work/main/plugins/.libs}
. "$(dirname "$0")/common.sh"
case "$RUNS" in '' | *[!0-9]*) usage ;; esac
bench_tmpdir pipefail
: "${KILN_STORE_TOKEN:=kiln-bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"
export KILN_STORE_TOKEN
ini="$(dirname "$0")/pipe_ckpt_wide.ini"

st="model.stages=flat,r1|fc2,loss"
TRAIN_ARGS="dist.pipeline=2 $st" WHO1="rank 1 (pipeline stage 1)"
. "$(dirname "$0")/ckpt_fail_lib.sh"

# best BUILD RUN: "best BUILD - PEAK" to $TMP/rows
best() {
	d="$TMP/best-$1-$2"
	train "$1" gloo "$d" train.max_steps=4 train.eval=1 train.eval_every=2 train.keep_best=1 \
		train.checkpoint_every=0 train.checkpoint_last=0 > "$d.log" 2>&1 ||
		{ echo "best $1: exit $?" >&2; tail -5 "$d.log" >&2; exit 1; }
	sed -n "s/.*rank 0 (pipeline stage 0): memory at the end of training: device peak \([0-9]*\) bytes over the run.*/best $1 - \1/p" "$d.log" >> "$TMP/rows"
}

: > "$TMP/rows"
echo "load average before: $(cat /proc/loadavg)"
i=1
while [ "$i" -le "$RUNS" ]; do
	for b in main new; do
		best "$b" "$i"
		fail "$b" gloo "$i"
		[ "$mpi" = 0 ] || fail "$b" mpi "$i"
	done
	i=$((i + 1))
done
echo "load average after: $(cat /proc/loadavg)"
for b in main new; do
	echo "$b: keep_best, rank 0's device peak over the run: $(awk -v b="$b" '$1 == "best" && $2 == b { print $4 }' "$TMP/rows" | median) bytes"
	for c in gloo mpi; do
		s=$(awk -v b="$b" -v c="$c" '$1 == "fail" && $2 == b && $3 == c { print $4 }' "$TMP/rows" | median)
		[ -n "$s" ] || continue
		echo "$b: rank 0's write failing ($c): the job ended after $s s (median), rank 1 named the file in $(awk -v b="$b" -v c="$c" '$1 == "fail" && $2 == b && $3 == c { n += $5 } END { print n + 0 }' "$TMP/rows") of $RUNS runs"
	done
done
